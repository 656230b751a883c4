"""``qk_norm_rope`` as the prepare step of a timeline family (``harness.timelines.runner.Prepare``): q and
kv RMSNorm + RoPE; on a unified layer the op stores the kv rows itself in decode and hands them back
otherwise; on a non-unified one (``Family.non_unified_layers``) it stores them in every mode into the
layer's paged fp8 SWA cache, and attention reads the stored rows decoded."""
from __future__ import annotations

import torch

from harness import compare, ops
from harness.backend import branch_mode
from harness.timelines.prepare import OneRowPrepare
from harness.timelines.prepare import exact_check
from reference.qk_norm_rope import chain as qk_ref
from reference.qk_norm_rope import swa

OP = "qk_norm_rope"


class QkNormRopePrepare(OneRowPrepare):
    def projections(self, fam):
        return {"q": fam.H * fam.D, "kv": fam.D}

    def chunk_kv(self, fam, rows):
        return rows[:, None, :], rows[:, None, :]

    def backend_stores(self, mode, kv_returned):
        return mode != "decode" and kv_returned  # the op stores in decode; the backend stores what it is handed

    def layer_caches(self, tr):
        """Each non-unified layer's paged fp8 SWA cache over the ring's slots (stale canary bytes)."""
        return {k: self.new_cache(tr, tr.w.g) for k in tr.fam.non_unified_layers}

    def new_cache(self, tr, g):
        fam = tr.fam
        lay = swa.SwaLayout(fam.D, fam.rope_dim, fam.page_size)
        pages = -(-tr.kv.buffers[0].shape[0] // fam.page_size)
        return torch.randint(0, 256, (pages, lay.page_bytes), generator=g, dtype=torch.uint8).to(tr.device)

    def state_checks(self, tr, layer, r, slots, truth):
        """A non-unified layer: its SWA cache holds request r's committed rows at their slots, decoded."""
        if layer not in tr.fam.non_unified_layers:
            return []
        fam = tr.fam
        lay = swa.SwaLayout(fam.D, fam.rope_dim, fam.page_size)
        pool = tr.layer_caches[layer]
        got = swa.swa_decode(pool[slots // lay.page_size], slots % lay.page_size, lay).to(truth.dtype)
        return [exact_check(f"state:swa-cache:r{r}", got, truth)]  # staged (``compare.Batch``)

    def run(self, tr, step, mode, layer, proj, pos_t, loc_logical, loc_phys, pad_loc, buf, *, branch, truth_pos):
        """The op launched on the backend's ``branch`` with its positions and slots; its oracle at the
        request's positions, within the tolerance of the branch the layer needs (a unified layer's rows
        run through the fp8 SWA store are off by more than a bf16 rounding)."""
        paged_layer = layer in tr.fam.non_unified_layers
        if branch == "non-unified":
            return self._run_paged(tr, step, mode, layer, proj, pos_t, truth_pos, loc_phys, pad_loc, buf,
                                   paged_layer)
        fam, T = tr.fam, pos_t.shape[0]
        n_all = proj["q"].shape[0]
        q = proj["q"].view(n_all, fam.H, fam.D)
        pad0 = torch.zeros(n_all - T, dtype=torch.int64, device=tr.device)
        loc = torch.cat((loc_phys, pad_loc))
        args = dict(q=q, kv=proj["kv"], kv_norm_weight=tr.w.kv_norm[layer], q_norm_weight=tr.w.q_norm[layer],
                    eps=1e-6, rope_dim=fam.rope_dim, cos=tr.w.cos, sin=tr.w.sin, positions=torch.cat((pos_t, pad0)),
                    rope_style="interleaved")
        truth = dict(args, positions=torch.cat((truth_pos, pad0)))
        before = buf.clone()
        out = tr.path.prepare.fn(forward_mode=branch_mode(branch, mode), ring=buf, loc=loc, q_out=None, **args)
        q_out, kv_out = out["q_out"], out.get("kv_out")
        oracle = qk_ref.qk_norm_rope_oracle(**truth)
        ref_q, ref_kv = qk_ref.qk_norm_rope(**truth)
        valid = tr.valid_index(n_all)  # loc >= 0 (the slots read on the host once a step)
        kv_val = kv_out if kv_out is not None else buf[loc.clamp(min=0)]  # stored by the kernel: read it back
        tq = ops.lookup_tolerance(OP, "q_out", torch.bfloat16)
        tkv = ops.lookup_tolerance(OP, *(("swa_cache", torch.uint8) if paged_layer else ("kv_out", torch.bfloat16)))
        tr.record_numeric(step, mode, layer, "prepare:q_out", q_out[:T], oracle["q_out"][:T], ref_q[:T], tq)
        vt = tr.valid_index(T)
        tr.record_numeric(step, mode, layer, "prepare:kv", kv_val[:T][vt], oracle["kv_out"][:T][vt], ref_kv[:T][vt], tkv)
        # gate: extend/verify store nothing and hand kv back; decode writes exactly the valid rows
        expect_store = mode == "decode"
        rows = tr.valid_rows() if expect_store else torch.empty(0, dtype=torch.long)
        tr.record(step, mode, layer, "gate", compare.untouched_check("gate:prepare-writes-only-its-rows", buf, before,
                                                                   rows))
        if expect_store:
            tr.record(step, mode, layer, "gate", exact_check("gate:prepare-stored", buf[rows], kv_val[valid]))
        else:
            tr.record(step, mode, layer, "gate", compare.Record("gate:kv-returned", kv_out is not None,
                                                              detail="" if kv_out is not None else "prepare kept kv"))
        return kv_val[:T].contiguous(), q_out[:T], kv_out is not None

    def _run_paged(self, tr, step, mode, layer, proj, pos_t, truth_pos, loc_phys, pad_loc, buf, paged_layer):
        """A non-unified layer's prepare: the op stores into the layer's paged SWA cache (every
        mode); the rows it stored, decoded, are what attention reads (mirrored into ``buf``)."""
        fam, T = tr.fam, pos_t.shape[0]
        n_all = proj["q"].shape[0]
        pad0 = torch.zeros(n_all - T, dtype=torch.int64, device=tr.device)
        loc = torch.cat((loc_phys, pad_loc))
        args = dict(q=proj["q"].view(n_all, fam.H, fam.D), kv=proj["kv"], kv_norm_weight=tr.w.kv_norm[layer],
                    q_norm_weight=tr.w.q_norm[layer], eps=1e-6, rope_dim=fam.rope_dim, cos=tr.w.cos, sin=tr.w.sin,
                    positions=torch.cat((pos_t, pad0)), rope_style="interleaved")
        truth = dict(args, positions=torch.cat((truth_pos, pad0)))
        pool, lay = tr.cache(layer), swa.SwaLayout(fam.D, fam.rope_dim, fam.page_size)
        before = pool.clone()
        out = tr.path.prepare.fn(forward_mode=mode, ring=None, loc=loc, q_out=None, swa_cache=pool,
                                 swa_page_size=fam.page_size, **args)
        oracle = qk_ref.qk_norm_rope_oracle(**truth)
        ref_q, ref_kv = qk_ref.qk_norm_rope(**truth)
        slots = tr.valid_rows()  # loc[loc >= 0] (the slots read on the host once a step)
        buf[slots] = swa.swa_decode(pool[slots // lay.page_size], slots % lay.page_size, lay).to(buf.dtype)
        kv_val = buf[loc.clamp(min=0)]  # exact: an e4m3 value times 2**e is a bf16 value
        ref_pool = before.clone()  # the chain's rows through the same store, decoded
        swa.swa_paged_store(ref_kv, ref_pool, loc, lay)
        ref_val = swa.swa_decode(ref_pool[slots // lay.page_size], slots % lay.page_size, lay)
        v = tr.valid_index(T)
        tq = ops.lookup_tolerance(OP, "q_out", torch.bfloat16)
        tkv = ops.lookup_tolerance(OP, *(("swa_cache", torch.uint8) if paged_layer else ("kv_out", torch.bfloat16)))
        tr.record_numeric(step, mode, layer, "prepare:q_out", out["q_out"][:T], oracle["q_out"][:T], ref_q[:T], tq)
        tr.record_numeric(step, mode, layer, "prepare:kv", kv_val[:T][v], oracle["kv_out"][:T][v],
                        ref_val[: v.numel()] if paged_layer else ref_kv[:T][v], tkv)
        # gate: every mode stores exactly its rows' records, nothing else of the cache (its pages, in
        # ascending order, and each slot's page among them: torch.unique's, from the host's slots)
        page_of = [s // lay.page_size for s in tr.valid_slots()]
        page_list = sorted(set(page_of))
        at = {p: i for i, p in enumerate(page_list)}
        pages = torch.tensor(page_list, dtype=torch.int64, device=slots.device)
        where = torch.tensor([at[p] for p in page_of], dtype=torch.int64, device=slots.device)
        owned = torch.zeros(len(pages), lay.min_page_bytes, dtype=torch.int32, device=pool.device).index_add_(
            0, where, lay.written_bytes(slots % lay.page_size).int()) > 0
        tr.record(step, mode, layer, "gate", compare.untouched_check("gate:prepare-writes-only-its-rows", pool, before,
                                                                   pages, written_bytes=owned))
        return kv_val[:T].contiguous(), out["q_out"][:T], out.get("kv_out") is not None

    def serve(self, engine, mode, layer, pr, pos_t, loc_logical, loc_phys, buf):
        from harness.e2e.model import EPS

        fam, m, T = engine.fam, engine.model, pos_t.shape[0]
        out = engine.path.prepare.fn(
            forward_mode=mode, ring=buf, loc=loc_phys, q_out=None, q=pr["q"].view(T, fam.H, fam.D), kv=pr["kv"],
            kv_norm_weight=m.w(f"l{layer}.kv_norm").to(torch.bfloat16), q_norm_weight=None, eps=EPS,
            rope_dim=m.rope_dim, cos=m.cos, sin=m.sin, positions=pos_t, rope_style=m.rope_style)
        q, kv_out = out["q_out"], out.get("kv_out")
        kv_returned = kv_out is not None
        return (kv_out if kv_returned else buf[loc_phys.clamp(min=0)]), q, kv_returned

    def train(self, model, pr, pos, layer):
        from harness.e2e.model import EPS

        fam, cos, sin = model.fam, model.cos[pos], model.sin[pos]
        q = qk_ref.rope_fp32(qk_ref.rms_norm_fp32(pr["q"].view(-1, fam.H, fam.D), None, EPS),
                             cos, sin, model.rope_dim, model.rope_style)
        kv = qk_ref.rope_fp32(qk_ref.rms_norm_fp32(pr["kv"], model.w(f"l{layer}.kv_norm"), EPS),
                              cos, sin, model.rope_dim, model.rope_style)
        return q, kv[:, None], kv[:, None]


ADAPTER = QkNormRopePrepare()
