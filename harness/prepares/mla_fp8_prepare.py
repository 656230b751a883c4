"""``mla_fp8_prepare`` as the prepare step of a timeline family (``harness.timeline.Prepare``): fp8
q and KV rows, every row written by the op at its physical slot (attention reads the chunk back)."""
from __future__ import annotations

import torch

from harness import compare
from harness.timeline import OneRowPrepare, _exact
from reference import mla_fp8_prepare as mla_ref


class MlaFp8Prepare(OneRowPrepare):
    fp8_rows = True
    writes_rows = True

    def projections(self, fam):
        dn = fam.D - fam.rope_dim
        return {"q_nope": fam.H * dn, "q_rope": fam.H * fam.rope_dim, "k_nope": dn, "k_rope": fam.rope_dim}

    def chunk_kv(self, fam, rows):
        k = (rows.float() * fam.kv_descale).to(torch.bfloat16)[:, None, :]  # exact: power-of-two scale
        return k, k[..., : fam.Dv]

    def run(self, tr, step, mode, layer, proj, pos_t, loc_logical, loc_phys, pad_loc, buf):
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
        valid = loc_phys >= 0
        tr._rec(step, mode, layer, "timeline", _exact("prepare:q8", out["q8"][:T], q8[:T]))
        tr._rec(step, mode, layer, "timeline", _exact("prepare:kv_rows", buf[loc_phys[valid]], rows[valid]))
        want = torch.zeros(buf.shape[0], dtype=torch.int32)
        want[loc_phys[valid].cpu()] = 1
        tr._rec(step, mode, layer, "gate", _exact("gate:each-row-written-once", out["kv_writes"].cpu(), want))
        tr._rec(step, mode, layer, "gate",
                compare.untouched("gate:prepare-writes-only-its-rows", buf, before, loc_phys[valid]))
        return rows, out["q8"][:T].to(torch.bfloat16), True  # fp8 -> bf16 exact


ADAPTER = MlaFp8Prepare()
