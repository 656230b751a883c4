"""``mla_fp8_prepare`` as the prepare step of a timeline family (``harness.timelines.runner.Prepare``): fp8
q and KV rows, every row written by the op at its physical slot (attention reads the chunk back)."""
from __future__ import annotations

import torch

from harness import compare
from harness.timelines.prepare import OneRowPrepare
from harness.timelines.prepare import exact_check
from reference.mla_fp8_prepare import chain as mla_ref


class MlaFp8Prepare(OneRowPrepare):
    fp8_rows = True
    writes_rows = True

    def projections(self, fam):
        dn = fam.D - fam.rope_dim
        return {"q_nope": fam.H * dn, "q_rope": fam.H * fam.rope_dim, "k_nope": dn, "k_rope": fam.rope_dim}

    def chunk_kv(self, fam, rows):
        k = (rows.float() * fam.kv_descale).to(torch.bfloat16)[:, None, :]  # exact: power-of-two scale
        return k, k[..., : fam.Dv]

    def run(self, tr, step, mode, layer, proj, pos_t, loc_logical, loc_phys, pad_loc, buf, *, branch, truth_pos):
        fam, T = tr.fam, loc_logical.shape[0]
        n_all = proj["q_nope"].shape[0]
        dn = fam.D - fam.rope_dim
        args = dict(q_nope=proj["q_nope"].view(n_all, fam.H, dn), q_rope=proj["q_rope"].view(n_all, fam.H, fam.rope_dim),
                    k_nope=proj["k_nope"], k_rope=proj["k_rope"])
        out_loc = torch.cat((loc_logical, pad_loc))
        phys = torch.cat((loc_phys, pad_loc))
        before = buf.clone()
        out = tr.path.prepare.fn(**args, kv_buffer=buf, out_cache_loc=out_loc, slot_map=tr.kv.slot_map,
                                 decode_kernel_loc=phys if tr.t.resolve_loc else None, save_kv_cache=True,
                                 fused_switch=True, kv_descale=fam.kv_descale, fp8_policy="saturate")
        q8, kn8, kr8 = mla_ref.quantize_chain(**args, fp8_dtype=buf.dtype, kv_descale=fam.kv_descale,
                                              fp8_policy="saturate")
        rows = torch.cat((kn8.view(torch.uint8), kr8.view(torch.uint8)), -1).view(buf.dtype)[:T]  # logical rows
        valid, written = tr.valid_index(T), tr.valid_rows()  # loc_phys >= 0, loc_phys[loc_phys >= 0] (host slots)
        tr.record(step, mode, layer, "timeline", exact_check("prepare:q8", out["q8"][:T], q8[:T]))
        tr.record(step, mode, layer, "timeline", exact_check("prepare:kv_rows", buf[written], rows[valid]))
        want = torch.zeros(buf.shape[0], dtype=torch.int32)
        want[tr.valid_slots()] = 1
        tr.record(step, mode, layer, "gate", exact_check("gate:each-row-written-once", out["kv_writes"], want))
        tr.record(step, mode, layer, "gate",
                compare.untouched_check("gate:prepare-writes-only-its-rows", buf, before, written))
        return rows, out["q8"][:T].to(torch.bfloat16), True  # fp8 -> bf16 exact

    def serve(self, engine, mode, layer, pr, pos_t, loc_logical, loc_phys, buf):
        fam, m, T = engine.fam, engine.model, pos_t.shape[0]
        dn, R = fam.D - fam.rope_dim, fam.rope_dim
        out = engine.path.prepare.fn(
            q_nope=pr["q_nope"].view(T, fam.H, dn), q_rope=m.rope(pr["q_rope"].view(T, fam.H, R), pos_t),
            k_nope=pr["k_nope"], k_rope=m.rope(pr["k_rope"], pos_t), kv_buffer=buf, out_cache_loc=loc_logical,
            slot_map=engine.kv.slot_map, decode_kernel_loc=loc_phys, save_kv_cache=True, fused_switch=True,
            kv_descale=fam.kv_descale, fp8_policy="saturate")
        return None, out["q8"].to(torch.bfloat16), True  # fp8 -> bf16, exact; the op wrote every row

    def train(self, model, pr, pos, layer):
        from harness.e2e.model import fake_fp8
        from reference.qk_norm_rope.chain import rope_fp32

        fam, cos, sin = model.fam, model.cos[pos], model.sin[pos]
        dn, R = fam.D - fam.rope_dim, fam.rope_dim
        qr = rope_fp32(pr["q_rope"].view(-1, fam.H, R), cos, sin, R, model.rope_style)
        kr = rope_fp32(pr["k_rope"], cos, sin, R, model.rope_style)
        q = fake_fp8(torch.cat((pr["q_nope"].view(-1, fam.H, dn), qr), -1), 1.0)
        k = fake_fp8(torch.cat((pr["k_nope"], kr), -1), fam.kv_descale)[:, None]
        return q, k, k[..., : fam.Dv]


ADAPTER = MlaFp8Prepare()
