"""Mutants of qk_norm_rope (seed 000)."""
from __future__ import annotations

import torch

from harness.registry import Impl
from reference import qk_norm_rope as r


def _rope_swapped_on_q(*, forward_mode, ring, loc, q, q_norm_weight, eps, cos, sin, positions, rope_dim,
                       rope_style, q_out, kv, kv_norm_weight):
    """q rotated with the other rope style (neox <-> interleaved); kv correct."""
    other = "neox" if rope_style == "interleaved" else "interleaved"
    q_res = r.q_norm_rope(q, q_norm_weight, eps, cos, sin, positions, rope_dim, other, q_out)
    kv_res = r.kv_norm_rope(kv, kv_norm_weight, eps, cos, sin, positions, rope_dim, rope_style)
    if forward_mode == "decode":
        r.ring_store(kv_res, ring, loc)
    return {"q_out": q_res, "kv_out": kv_res}


def _eps_outside_sqrt(*, forward_mode, ring, loc, q, q_norm_weight, eps, cos, sin, positions, rope_dim,
                      rope_style, q_out, kv, kv_norm_weight):
    """x / (sqrt(mean(x²)) + eps) instead of x * rsqrt(mean(x²) + eps)."""
    def norm_rope(x, w):
        xf = x.float()
        y = xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps)
        y = y if w is None else y * w.float()
        return r._rope_fp32(y, cos[positions], sin[positions], rope_dim, rope_style).to(x.dtype)

    q_res = norm_rope(q, q_norm_weight)
    if q_out is not None:
        q_res = q_out.copy_(q_res)
    kv_res = norm_rope(kv, kv_norm_weight).contiguous()
    if forward_mode == "decode":
        r.ring_store(kv_res, ring, loc)
    return {"q_out": q_res, "kv_out": kv_res}


def _store_left_on_in_verify(**kw):
    """The real fused kernel behind a gate that keeps the in-kernel ring store in target-verify
    (and so hands no kv back): the 0.950 -> 0.027 GSM8K bug of seed 000."""
    from fused import qk_norm_rope as f

    def bad_gate(*, unified, forward_mode, verify_switch, fused_non_unified=True):
        use = unified and forward_mode in ("decode", "target_verify")
        return f.QkNormRopeDecision(use_fused=use, in_kernel_store=use, return_kv=not use)

    return f.qk_norm_rope_step(gate_fn=bad_gate, **kw)


MUTANTS = [
    Impl("qk_norm_rope", "mutant-rope-style-swapped-q", "mutant", _rope_swapped_on_q,
         doc="seed 000 class: rope style swapped on q only (GPT-J pairs vs neox halves)",
         catches=("numeric:q_out",)),
    Impl("qk_norm_rope", "mutant-eps-outside-sqrt", "mutant", _eps_outside_sqrt,
         doc="RMSNorm with eps added outside the square root; visible only when mean(x²) ~ eps",
         catches=("numeric:q_out", "numeric:kv_out")),
    Impl("qk_norm_rope", "mutant-store-left-on-in-verify", "mutant", _store_left_on_in_verify,
         doc="seed 000: in-kernel ring store left on in target-verify; drafts become history",
         catches=("untouched:ring", "numeric:kv_out")),
]


def _rope_swapped_on_kv(*, forward_mode, ring, loc, q, q_norm_weight, eps, cos, sin, positions, rope_dim,
                        rope_style, q_out, kv, kv_norm_weight):
    """kv rotated with the other rope style (neox <-> interleaved); q correct."""
    other = "neox" if rope_style == "interleaved" else "interleaved"
    q_res = r.q_norm_rope(q, q_norm_weight, eps, cos, sin, positions, rope_dim, rope_style, q_out)
    kv_res = r.kv_norm_rope(kv, kv_norm_weight, eps, cos, sin, positions, rope_dim, other)
    if forward_mode == "decode":
        r.ring_store(kv_res, ring, loc)
    return {"q_out": q_res, "kv_out": kv_res}


# store-timing: its bug shows in the timelines (the ring holds mis-rotated keys); registered after
# every op's MUTANTS (cases.mutants.register)
TIMELINE_MUTANTS = [
    Impl("qk_norm_rope", "mutant-rope-style-swapped-kv", "mutant", _rope_swapped_on_kv,
         doc="seed 000 class: rope style swapped on the kv side only, so the ring holds mis-rotated keys",
         catches=("numeric:kv_out", "effect:ring")),
]
