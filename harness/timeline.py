"""Store-timing timeline runner: a *path under test* lives through a timeline, and every step of
every layer is compared with the logical truth (DESIGN.md, "Store-timing timelines").

A path = the implementations per op (any registered ``Impl``: fused, reference, external,
mutant) + the backend's store policy:
  decode   1-source: store the token, then attend over the ring (its own row read back);
  verify   2-source: attend over history (from the pool) + the chunk as k/v, with the chunk
           stored either ``pre`` (before attention, causally indexed: attention never reads
           the chunk's slots as history) or ``post`` (after attention);
           ``as-history`` is seed 000's bug: store first, then attend 1-source over the ring,
           every chunk token seen as history by every other one.
The op's own gate decides what the prepare launch stores (``fused.qk_norm_rope.gate``); when
a verify prepare hands no kv back the backend has nothing to attend to but the ring, which is
exactly the seed's failure mode, so the runner follows it (and the gate check says so).

Checks per (step, layer), each a ``harness.compare.Record`` tagged with its family:
  timeline  prepare:*  the prepare op's outputs against its fp64 oracle (exact bytes for fp8);
            finite:*   before each numeric check (prepare:*, attn): the oracle's NaN/±Inf placement;
            visible_kv every row attention read from the pool equals the logical history, row
                       count included (rejected drafts, stale or mistranslated slots show here);
            attn       the attention output against the fp64 oracle over the *logical* history +
                       the chunk, under the family's draft rule (tolerance: harness.tolerance);
            state      after the step, every committed row in the window sits where the slot
                       table says, byte-exact.
  gate      dispatch decisions observed at the step: what the prepare launch wrote (nothing in
            extend/verify, kv handed back; each row exactly once in decode and for fp8 MLA; on a
            non-unified qk layer its rows' records of the paged fp8 SWA cache in every mode, no
            other byte) and that verify attention was 2-source (a non-unified layer's chunk is read
            back from its cache, decoded: causally indexed, as ``pre``).
The truth is teacher-forced: layer k's oracle takes the path's own inputs to layer k, so
rounding differences do not compound while a wrong KV row is still caught at the first read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cases import timelines as tl
from harness import compare, tolerance
from harness.registry import Impl, Registry
from reference import kv_model
from reference import mla_fp8_prepare as mla_ref
from reference import qk_norm_rope as qk_ref
from reference import verify_attention as va_ref

VERIFY_STORES = ("pre", "post", "as-history", "none")


@dataclass(frozen=True)
class Path:
    name: str
    family: str
    prepare: Impl | None  # qk_norm_rope / mla_fp8_prepare implementation (None: plain projections)
    attn: Impl  # verify_attention implementation for decode and verify steps
    verify_store: str = ""  # "" = the family's clean policy
    decode_store_first: bool = True  # 1-source decode: store, then attend
    keep_rejected: bool = False  # rollback leaves rejected drafts in the slot table (stale KV)
    translate_reads: bool = True  # attention reads physical rows (False: the logical slot ids)
    doc: str = ""


@dataclass(frozen=True)
class StepRecord:
    step: int
    mode: str
    layer: int
    family: str  # check family: timeline | gate
    record: compare.Record


def _exact(check: str, got: torch.Tensor, want: torch.Tensor) -> compare.Record:
    """``compare.exact`` that also takes two empty tensors of one shape (an empty history)."""
    if got is not None and got.numel() == 0 and tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype:
        return compare.Record(check, True, detail="empty")
    return compare.exact(check, got, want)


def clean_path(reg: Registry, family: str, *, prepare: str = "fused", attn: str = "fused", **kw) -> Path:
    fam = tl.FAMILIES[family]
    p = None if fam.prepare == "projection" else reg.impls[f"{fam.prepare}/{prepare}"]
    return Path(f"{family}:{prepare}+{attn}", family, p, reg.impls[f"verify_attention/{attn}"], **kw)


def backend_policy(fam: tl.Family, path: Path, store: str, mode: str, kv_returned: bool, non_unified: bool = False):
    """The backend's decisions for one layer call -> (policy, backend_stores, store_first, one_source).
    Shared by the timeline runner and the end-to-end engine (``harness.e2e.engine``). A non-unified
    layer's prepare stores its chunk in every mode (the paged SWA cache), and its verify attention
    reads the chunk from there causally indexed: the ``pre`` policy with the chunk read back."""
    if non_unified:
        backend_stores = False
    elif fam.prepare == "qk_norm_rope":  # the op stores in decode; the backend stores what it is handed
        backend_stores = mode != "decode" and kv_returned
    else:  # mla: the prepare writes every row; plain projections: the backend writes them all
        backend_stores = fam.prepare == "projection"
    policy = {"extend": "post", "decode": "decode", "target_verify": store}[mode]
    if mode == "target_verify" and not kv_returned and not non_unified:
        policy = "as-history"  # no chunk handed back: the ring is all the backend can attend to
    store_first = policy in ("pre", "as-history") or (policy == "decode" and path.decode_store_first)
    one_source = fam.prepare == "mla_fp8_prepare" or policy in ("decode", "as-history")
    return policy, backend_stores, store_first, one_source


# ----------------------------------------------------------------------------- the model

class _Weights:
    def __init__(self, fam: tl.Family, t: tl.Timeline, max_pos: int, device):
        g = torch.Generator().manual_seed(1000 + t.seed)
        dm = fam.d_model
        r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(device)  # noqa: E731
        if fam.prepare == "qk_norm_rope":
            outs = {"q": fam.H * fam.D, "kv": fam.D}
        elif fam.prepare == "mla_fp8_prepare":
            dn = fam.D - fam.rope_dim
            outs = {"q_nope": fam.H * dn, "q_rope": fam.H * fam.rope_dim, "k_nope": dn, "k_rope": fam.rope_dim}
        else:
            outs = {"q": fam.H * fam.D, "k": fam.Hkv * fam.D, "v": fam.Hkv * fam.Dv}
        self.proj = [{k: r(dm, n, scale=1.5 / math.sqrt(dm)) for k, n in outs.items()} for _ in range(fam.layers)]
        self.wo = [r(fam.H * fam.Dv, dm, scale=1.0 / math.sqrt(fam.H * fam.Dv)) for _ in range(fam.layers)]
        self.kv_norm = [(1.0 + 0.2 * r(fam.D)).to(torch.bfloat16) for _ in range(fam.layers)]
        if fam.rope_dim:
            half = fam.rope_dim // 2
            inv = 1.0 / (1000.0 ** (torch.arange(half, dtype=torch.float64) / half))
            ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None]
            self.cos, self.sin = ang.cos().float().to(device), ang.sin().float().to(device)
        self.g = g


def _row_shape(fam: tl.Family) -> tuple[int, ...]:
    if fam.prepare == "qk_norm_rope":
        return (fam.D,)
    if fam.prepare == "mla_fp8_prepare":
        return (fam.D,)
    return (2, fam.Hkv, fam.D)  # k and v stacked


def _kv_views(fam: tl.Family, buf: torch.Tensor):
    """Pool rows -> (k_buffer (S, Hkv, D), v_buffer (S, Hkv, Dv)) as attention reads them."""
    if fam.prepare == "projection":
        return buf[:, 0], buf[:, 1, :, : fam.Dv]
    return buf[:, None, :], buf[:, None, : fam.Dv]


def _chunk_kv(fam: tl.Family, rows: torch.Tensor):
    """Logical KV rows of chunk tokens -> bf16 (k (T, Hkv, D), v (T, Hkv, Dv)) as drafts."""
    if fam.prepare == "projection":
        return rows[:, 0].contiguous(), rows[:, 1, :, : fam.Dv].contiguous()
    if fam.prepare == "mla_fp8_prepare":
        k = (rows.float() * fam.kv_descale).to(torch.bfloat16)[:, None, :]  # exact: power-of-two scale
        return k, k[..., : fam.Dv]
    return rows[:, None, :], rows[:, None, :]


# ----------------------------------------------------------------------------- the runner

class TimelineRun:
    def __init__(self, path: Path, t: tl.Timeline, device="cpu", fp8_dtype=torch.float8_e4m3fn):
        tl.validate(t)
        self.path, self.t, self.device = path, t, torch.device(device)
        self.fam = fam = tl.FAMILIES[t.family]
        self.store = path.verify_store or fam.verify_store
        if self.store not in VERIFY_STORES:
            raise ValueError(f"verify_store: expected one of {VERIFY_STORES}, got {self.store!r}")
        self.B = tl.num_requests(t)
        top = tl.max_len(t)
        dtype = fp8_dtype if fam.prepare == "mla_fp8_prepare" else torch.bfloat16
        self.kv = kv_model.KVModel(kv_model.KVLayout(fam.layout, self.B, t.window, t.L, _row_shape(fam), dtype,
                                                     translated=fam.translated and t.translated, seed=t.seed),
                                   fam.layers, top, self.device)
        self.w = _Weights(fam, t, top + 1, self.device)
        # non-unified layers: the paged fp8 SWA cache over the ring's slots (stale canary bytes);
        # the layer's ring buffer mirrors what attention reads from it (the stored rows decoded)
        lay = qk_ref.SwaLayout(fam.D, fam.rope_dim, fam.page_size)
        pages = -(-self.kv.buffers[0].shape[0] // fam.page_size)
        self.swa = {k: torch.randint(0, 256, (pages, lay.page_bytes), generator=self.w.g, dtype=torch.uint8
                                     ).to(self.device) for k in fam.non_unified_layers}
        self.records: list[StepRecord] = []
        self.n = [0] * self.B  # committed tokens per request (the truth's length)

    # -- helpers
    def _rec(self, step, mode, layer, family, r: compare.Record):
        self.records.append(StepRecord(step, mode, layer, family, r))

    def _rec_numeric(self, step, mode, layer, check, got, oracle, ref, tol):
        """``finite:<check>`` (NaN/±Inf placement), then ``<check>`` on the finite elements."""
        self._rec(step, mode, layer, "timeline", compare.finite(f"finite:{check}", got, oracle))
        self._rec(step, mode, layer, "timeline", compare.numeric(check, got, oracle, ref, tol))

    def _phys(self, logical: torch.Tensor) -> torch.Tensor:
        return self.kv.physical(logical)

    def _read_slots(self, logical: torch.Tensor) -> torch.Tensor:
        return self._phys(logical) if self.path.translate_reads else logical

    def run(self, *, stop_on_failure: bool = False) -> list[StepRecord]:
        """Every step; ``stop_on_failure`` ends after the first step with a failing check (mutant runs)."""
        for step, (mode, items) in enumerate(tl.parse_steps(self.t.steps)):
            if stop_on_failure and failures(self.records):
                break
            try:
                self._step(step, mode, items)
            except Exception as exc:  # a crash is a failure of the path, with its message
                msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                self._rec(step, mode, -1, "timeline", compare.Record("run", False, detail=msg))
                break
        return self.records

    # -- one batch
    def _step(self, step: int, mode: str, items: list[tuple[int, int]]):
        fam, t, kv = self.fam, self.t, self.kv
        widths = [a if mode == "extend" else 1 if mode == "decode" else t.L for _, a in items]
        positions, logical, owners = [], [], []
        for (r, _), c in zip(items, widths):
            pos = list(range(self.n[r], self.n[r] + c))
            logical.append(kv.alloc(r, pos))  # the chunk is not history yet: visible_len unchanged
            positions += pos
            owners.append((r, c))
        T = len(positions)
        pos_t = torch.tensor(positions, dtype=torch.int64, device=self.device)
        loc_logical = torch.cat(logical)
        if fam.layout == "ring" and mode == "extend":  # a prefill longer than the ring keeps its tail
            keep = torch.cat([torch.arange(c, device=self.device) >= c - kv.spec.ring_capacity for _, c in owners])
            loc_logical = torch.where(keep, loc_logical, torch.full_like(loc_logical, -1))
        loc_phys = self._phys(loc_logical)
        x = (torch.randn(T, fam.d_model, generator=self.w.g) * t.act_scale).to(torch.bfloat16).to(self.device)
        pad = t.pad
        xp = (torch.randn(pad, fam.d_model, generator=self.w.g) * t.act_scale).to(torch.bfloat16).to(self.device)
        chunk_rows = []
        for layer in range(fam.layers):
            o, rows = self._layer(step, mode, layer, x, xp, pos_t, loc_logical, loc_phys, owners)
            chunk_rows.append(rows)
            x = (x.float() + o.reshape(T, -1).float() @ self.w.wo[layer]).to(torch.bfloat16)
        # accept / commit / rollback
        off = 0
        for (r, a), c in zip(items, widths):
            keep_n = a if mode == "target_verify" else c
            for layer in range(fam.layers):
                kv.commit(layer, r, chunk_rows[layer][off: off + keep_n])
            self.n[r] += keep_n
            kv.rollback(r, self.n[r], keep_rejected=self.path.keep_rejected)
            off += c
        for layer in range(fam.layers):  # state: committed rows where the table says
            for r in {r for r, _ in items}:
                slots = self._phys(kv.truth_slots(r))
                got = kv.buffers[layer][slots]
                self._rec(step, mode, layer, "timeline", _exact(f"state:r{r}", got, kv.truth_history(layer, r)))

    def _layer(self, step, mode, layer, x, xp, pos_t, loc_logical, loc_phys, owners):
        fam, t, kv = self.fam, self.t, self.kv
        buf = kv.buffers[layer]
        T, pad = x.shape[0], xp.shape[0]
        xa = torch.cat((x, xp))
        W = self.w.proj[layer]
        proj = {k: (xa.float() @ w).to(torch.bfloat16) for k, w in W.items()}
        pad_loc = torch.full((pad,), -1, dtype=torch.int64, device=self.device)
        kv_returned = True
        non_unified = layer in self.swa
        if non_unified:
            rows, q, kv_returned = self._prepare_qk_paged(step, mode, layer, proj, pos_t, loc_phys, pad_loc, buf)
        elif fam.prepare == "qk_norm_rope":
            rows, q, kv_returned = self._prepare_qk(step, mode, layer, proj, pos_t, loc_phys, pad_loc, buf)
        elif fam.prepare == "mla_fp8_prepare":
            rows, q = self._prepare_mla(step, mode, layer, proj, loc_logical, loc_phys, pad_loc, buf)
        else:
            q = proj["q"][:T].view(T, fam.H, fam.D)
            rows = torch.stack((proj["k"][:T].view(T, fam.Hkv, fam.D),
                                torch.nn.functional.pad(proj["v"][:T].view(T, fam.Hkv, fam.Dv),
                                                        (0, fam.D - fam.Dv))), 1)  # (T, 2, Hkv, D)
        # --- backend store policy + attention
        policy, backend_stores, store_first, one_source = backend_policy(fam, self.path, self.store, mode,
                                                                         kv_returned, non_unified)
        if mode == "target_verify":
            ok = policy in ("pre", "post", "none")
            self._rec(step, mode, layer, "gate", compare.Record(
                "gate:verify-2-source", ok, detail="" if ok else f"verify attended 1-source ({policy})"))
        if backend_stores and store_first:
            self._store(buf, loc_phys, rows)
        if one_source:  # the chunk read back from the pool
            k_d, v_d = _chunk_kv(fam, buf[loc_phys.clamp(min=0)])
        else:
            k_d, v_d = _chunk_kv(fam, rows)
        o = self._attend(step, mode, layer, q, k_d, v_d, rows, buf, owners, loc_logical,
                         as_history=policy == "as-history", one_source=one_source)
        if backend_stores and not store_first and policy != "none":
            self._store(buf, loc_phys, rows)
        return o, rows

    def _store(self, buf, loc_phys, rows):
        valid = loc_phys >= 0
        buf[loc_phys[valid]] = rows[valid].to(buf.dtype)

    # -- prepares
    def _prepare_qk(self, step, mode, layer, proj, pos_t, loc_phys, pad_loc, buf):
        fam, T = self.fam, pos_t.shape[0]
        n_all = proj["q"].shape[0]
        q = proj["q"].view(n_all, fam.H, fam.D)
        positions = torch.cat((pos_t, torch.zeros(n_all - T, dtype=torch.int64, device=self.device)))
        loc = torch.cat((loc_phys, pad_loc))
        args = dict(q=q, kv=proj["kv"], kv_norm_weight=self.w.kv_norm[layer], q_norm_weight=None, eps=1e-6,
                    rope_dim=fam.rope_dim, cos=self.w.cos, sin=self.w.sin, positions=positions,
                    rope_style="interleaved")
        before = buf.clone()
        out = self.path.prepare.fn(forward_mode=mode, ring=buf, loc=loc, q_out=None, **args)
        q_out, kv_out = out["q_out"], out.get("kv_out")
        oracle = qk_ref.qk_norm_rope_oracle(**args)
        ref_q, ref_kv = qk_ref.qk_norm_rope(**args)
        valid = loc >= 0
        kv_val = kv_out if kv_out is not None else buf[loc.clamp(min=0)]  # stored by the kernel: read it back
        tq, tkv = tolerance.lookup("qk_norm_rope", "q_out", torch.bfloat16), tolerance.lookup("qk_norm_rope", "kv_out", torch.bfloat16)
        self._rec_numeric(step, mode, layer, "prepare:q_out", q_out[:T], oracle["q_out"][:T], ref_q[:T], tq)
        self._rec_numeric(step, mode, layer, "prepare:kv", kv_val[:T][valid[:T]], oracle["kv_out"][:T][valid[:T]],
                          ref_kv[:T][valid[:T]], tkv)
        # gate: extend/verify store nothing and hand kv back; decode writes exactly the valid rows
        expect_store = mode == "decode"
        rows = loc[valid] if expect_store else torch.empty(0, dtype=torch.long)
        self._rec(step, mode, layer, "gate", compare.untouched("gate:prepare-writes-only-its-rows", buf, before, rows))
        if expect_store:
            self._rec(step, mode, layer, "gate", _exact("gate:prepare-stored", buf[loc[valid]], kv_val[valid]))
        else:
            self._rec(step, mode, layer, "gate", compare.Record("gate:kv-returned", kv_out is not None,
                                                                detail="" if kv_out is not None else "prepare kept kv"))
        return kv_val[:T].contiguous(), q_out[:T], kv_out is not None

    def _prepare_qk_paged(self, step, mode, layer, proj, pos_t, loc_phys, pad_loc, buf):
        """A non-unified layer's prepare: the op stores into the layer's paged SWA cache (every
        mode); the rows it stored, decoded, are what attention reads (mirrored into ``buf``)."""
        fam, T = self.fam, pos_t.shape[0]
        n_all = proj["q"].shape[0]
        positions = torch.cat((pos_t, torch.zeros(n_all - T, dtype=torch.int64, device=self.device)))
        loc = torch.cat((loc_phys, pad_loc))
        args = dict(q=proj["q"].view(n_all, fam.H, fam.D), kv=proj["kv"], kv_norm_weight=self.w.kv_norm[layer],
                    q_norm_weight=None, eps=1e-6, rope_dim=fam.rope_dim, cos=self.w.cos, sin=self.w.sin,
                    positions=positions, rope_style="interleaved")
        pool, lay = self.swa[layer], qk_ref.SwaLayout(fam.D, fam.rope_dim, fam.page_size)
        before = pool.clone()
        out = self.path.prepare.fn(forward_mode=mode, ring=None, loc=loc, q_out=None, swa_cache=pool,
                                   swa_page_size=fam.page_size, **args)
        oracle = qk_ref.qk_norm_rope_oracle(**args)
        ref_q, ref_kv = qk_ref.qk_norm_rope(**args)
        valid = loc >= 0
        slots = loc[valid]
        buf[slots] = qk_ref.swa_decode(pool[slots // lay.page_size], slots % lay.page_size, lay).to(buf.dtype)
        kv_val = buf[loc.clamp(min=0)]  # exact: an e4m3 value times 2**e is a bf16 value
        ref_pool = before.clone()  # the chain's rows through the same store, decoded
        qk_ref.swa_paged_store(ref_kv, ref_pool, loc, lay)
        ref_val = qk_ref.swa_decode(ref_pool[slots // lay.page_size], slots % lay.page_size, lay)
        v = valid[:T]
        tq = tolerance.lookup("qk_norm_rope", "q_out", torch.bfloat16)
        tkv = tolerance.lookup("qk_norm_rope", "swa_cache", torch.uint8)
        self._rec_numeric(step, mode, layer, "prepare:q_out", out["q_out"][:T], oracle["q_out"][:T], ref_q[:T], tq)
        self._rec_numeric(step, mode, layer, "prepare:kv", kv_val[:T][v], oracle["kv_out"][:T][v],
                          ref_val[: int(v.sum())], tkv)
        # gate: every mode stores exactly its rows' records, nothing else of the cache
        pages, where = torch.unique(slots // lay.page_size, return_inverse=True)
        owned = torch.zeros(len(pages), lay.min_page_bytes, dtype=torch.int32, device=pool.device).index_add_(
            0, where, lay.written_bytes(slots % lay.page_size).int()) > 0
        self._rec(step, mode, layer, "gate", compare.untouched("gate:prepare-writes-only-its-rows", pool, before,
                                                               pages, written_bytes=owned))
        return kv_val[:T].contiguous(), out["q_out"][:T], out.get("kv_out") is not None

    def _prepare_mla(self, step, mode, layer, proj, loc_logical, loc_phys, pad_loc, buf):
        fam, T = self.fam, loc_logical.shape[0]
        n_all = proj["q_nope"].shape[0]
        dn = fam.D - fam.rope_dim
        args = dict(q_nope=proj["q_nope"].view(n_all, fam.H, dn), q_rope=proj["q_rope"].view(n_all, fam.H, fam.rope_dim),
                    k_nope=proj["k_nope"], k_rope=proj["k_rope"])
        out_loc = torch.cat((loc_logical, pad_loc))
        phys = torch.cat((loc_phys, pad_loc))
        before = buf.clone()
        out = self.path.prepare.fn(**args, kv_buffer=buf, out_cache_loc=out_loc, slot_map=self.kv.slot_map,
                                   decode_kernel_loc=phys if self.t.resolve_loc else None, save_kv_cache=True,
                                   fused_switch=True, kv_descale=fam.kv_descale, fp8_policy="saturate")
        q8, kn8, kr8 = mla_ref.quantize_chain(**args, fp8_dtype=buf.dtype, kv_descale=fam.kv_descale,
                                              fp8_policy="saturate")
        rows = torch.cat((kn8.view(torch.uint8), kr8.view(torch.uint8)), -1).view(buf.dtype)[:T]  # logical rows
        valid = loc_phys >= 0
        self._rec(step, mode, layer, "timeline", _exact("prepare:q8", out["q8"][:T], q8[:T]))
        self._rec(step, mode, layer, "timeline", _exact("prepare:kv_rows", buf[loc_phys[valid]], rows[valid]))
        want = torch.zeros(buf.shape[0], dtype=torch.int32)
        want[loc_phys[valid].cpu()] = 1
        self._rec(step, mode, layer, "gate", _exact("gate:each-row-written-once", out["kv_writes"].cpu(), want))
        self._rec(step, mode, layer, "gate",
                  compare.untouched("gate:prepare-writes-only-its-rows", buf, before, loc_phys[valid]))
        return rows, out["q8"][:T].to(torch.bfloat16)  # fp8 -> bf16 exact

    # -- attention
    def _attend(self, step, mode, layer, q, k_d, v_d, chunk_rows, buf, owners, loc_logical, *, as_history,
                one_source):
        fam, kv = self.fam, self.kv
        kb, vb = _kv_views(fam, buf)
        # what attention reads from the pool: per request, or per token when the chunk is history
        groups, read, whose = [], [], []
        off = 0
        for r, c in owners:
            h = kv.history_slots(r)
            chunk = loc_logical[off: off + c]
            for s, e in ([(off + i, off + i + 1) for i in range(c)] if as_history else [(off, off + c)]):
                extra = torch.cat((chunk[: s - off], chunk[e - off:])) if as_history else chunk[:0]
                groups.append((s, e))
                read.append(self._read_slots(torch.cat((h, extra[extra >= 0]))))
                whose.append(r)
            off += c
        qo = torch.tensor([0] + [e for _, e in groups], dtype=torch.int32, device=self.device)
        kvp = torch.tensor([0] + [len(x) for x in read], device=self.device).cumsum(0).to(torch.int32)
        idx = torch.cat(read).to(torch.int32)
        args = dict(q=q.contiguous(), k=k_d.contiguous(), v=v_d.contiguous(), k_buffer=kb, v_buffer=vb,
                    qo_indptr=qo, kv_indptr=kvp, kv_indices=idx.contiguous(), sm_scale=1.0 / math.sqrt(fam.D),
                    is_causal=fam.causal, k_scale=fam.kv_descale, v_scale=fam.kv_descale, num_kv_splits=fam.splits,
                    custom_mask=None, o=None, topk=1, model_family=fam.model_family, splitkv_switch=True)
        if mode == "extend":
            out = va_ref.verify_attention(**args)  # prefill is setup, not the path under test
        else:
            out = self.path.attn.fn(**args)
        o = out["o"]
        # visible KV: every row read equals the request's logical history, row count included
        for r, rows_read in zip(whose, read):
            ok_idx = (rows_read >= 0) & (rows_read < buf.shape[0])
            got = buf[rows_read[ok_idx]]
            self._rec(step, mode, layer, "timeline", _exact(f"visible_kv:r{r}", got, kv.truth_history(layer, r)))
        if one_source:  # the chunk itself came from the pool: it must be the chunk's logical rows
            self._rec(step, mode, layer, "timeline", _exact("visible_kv:chunk", k_d, _chunk_kv(fam, chunk_rows)[0]))
        # attention against the oracle over the logical history + the logical chunk
        lk, lv = _chunk_kv(fam, chunk_rows)
        hist_rows = [kv.truth_history(layer, r) for r, _ in owners]
        lbuf = torch.cat(hist_rows) if hist_rows else buf[:0]
        lkb, lvb = _kv_views(fam, lbuf)
        lens = [h.shape[0] for h in hist_rows]
        qo_l = torch.tensor([0] + [c for _, c in owners], device=self.device).cumsum(0).to(torch.int32)
        largs = dict(args, k=lk.contiguous(), v=lv.contiguous(), k_buffer=lkb, v_buffer=lvb, qo_indptr=qo_l,
                     kv_indptr=torch.tensor([0] + lens, device=self.device).cumsum(0).to(torch.int32),
                     kv_indices=torch.arange(sum(lens), dtype=torch.int32, device=self.device))
        oracle = va_ref.verify_attention_oracle(**largs)["o"]
        ref = va_ref.verify_attention(**largs)["o"]
        tol = tolerance.lookup("verify_attention", "o", torch.bfloat16)
        self._rec_numeric(step, mode, layer, "attn:o", o, oracle, ref, tol)
        return o


def run_timeline(path: Path, t: tl.Timeline, device="cpu", fp8_dtype=torch.float8_e4m3fn, *,
                 stop_on_failure: bool = False) -> list[StepRecord]:
    return TimelineRun(path, t, device, fp8_dtype).run(stop_on_failure=stop_on_failure)


def failures(records: list[StepRecord]) -> list[StepRecord]:
    return [s for s in records if not s.record.passed]
