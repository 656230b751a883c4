"""GPU-only mutants of ``qk_norm_rope`` (``harness.gpu.mutants``): the right numbers computed the wrong way."""
from __future__ import annotations

import itertools

import torch

from harness.gpu.mutants import gate_flips_per_call, two_launches
from reference.qk_norm_rope import chain as qk_ref


# ----------------------------------------------------------------------------- qk_norm_rope in two launches

def _qk_norm_rope_two_launches(*, q, kv, kv_norm_weight, q_norm_weight=None, eps, rope_dim, cos, sin, positions,
                               rope_style="interleaved", ring=None, loc=None, q_out=None):
    """``fused.qk_norm_rope.wrapper.qk_norm_rope`` with its grid split in two: programs 0..H-1 (q heads)
    in one launch, the kv program (``H = 0`` makes program 0 the kv one) in a second."""
    from fused.qk_norm_rope import wrapper as f

    T, H, D = qk_ref.validate(q=q, kv=kv, kv_norm_weight=kv_norm_weight, q_norm_weight=q_norm_weight, eps=eps,
                              rope_dim=rope_dim, cos=cos, sin=sin, positions=positions, rope_style=rope_style,
                              ring=ring, loc=loc, q_out=q_out)
    if q_out is None:
        q_out = torch.empty((T, H, D), dtype=q.dtype, device=q.device)
    kv_out = torch.empty((T, D), dtype=kv.dtype, device=kv.device)
    f.launch(q_out=q_out, kv_out=kv_out, q=q, kv=kv, kv_norm_weight=kv_norm_weight, q_norm_weight=q_norm_weight,
             eps=eps, rope_dim=rope_dim, cos=cos, sin=sin, positions=positions, rope_style=rope_style, ring=ring,
             loc=loc, head_launches=((H, H), (1, 0)))  # BUG: the q heads in one launch, kv (+ the store) in a second
    return q_out, kv_out


def _qk_two_launches(*, forward_mode, ring, loc, verify_switch=None, **kw):
    """``fused.qk_norm_rope.wrapper.qk_norm_rope_step`` (same gate, same store rule) over the two-launch wrapper."""
    from fused.qk_norm_rope import wrapper as f

    switch = f.verify_switch_from_env() if verify_switch is None else verify_switch
    d = f.gate(unified=True, forward_mode=forward_mode, verify_switch=switch)
    if d.use_fused:
        q_out, kv_out = _qk_norm_rope_two_launches(ring=ring if d.in_kernel_store else None,
                                                   loc=loc if d.in_kernel_store else None, **kw)
    else:
        q_out, kv_out = qk_ref.qk_norm_rope(**kw)
    if forward_mode == "decode" and not d.in_kernel_store:
        qk_ref.ring_store(kv_out, ring, loc)
    return {"q_out": q_out, "kv_out": kv_out if d.return_kv else None}


# ----------------------------------------------------------------------------- a gate that flips per call

_QK_CALLS = itertools.count()


def flipping_qk_gate(*, unified, forward_mode, verify_switch, fused_non_unified=True):
    """``fused.qk_norm_rope.wrapper.gate`` with the verify switch read from a call counter: on every
    other call target-verify takes the two-launch chain instead of the fused kernel."""
    from fused.qk_norm_rope import wrapper as f

    switch = verify_switch and next(_QK_CALLS) % 2 == 0  # BUG: a switch read at call time
    return f.gate(unified=unified, forward_mode=forward_mode, verify_switch=switch,
                  fused_non_unified=fused_non_unified)


MUTANTS = [
    two_launches("qk_norm_rope", _qk_two_launches,
                 "a 'fused' qk-norm-rope that launches its kernel twice (q heads, then kv): right numbers, "
                 "no launch saved"),
    gate_flips_per_call("qk_norm_rope", "qk_norm_rope_step", flipping_qk_gate,
                        "the verify switch is read at call time (a counter): CUDA-graph capture bakes one branch, "
                        "eager takes the other"),
]
