"""GPU-only mutants: the right numbers, computed the wrong way — bugs that only launch counting
and CUDA-graph capture can see (``harness.gpu_checks``; each ``catches`` names ``gpu:*`` checks).

  mutant-two-launches (qk_norm_rope, mla_fp8_prepare)
      the "fused" op runs its own kernel twice — q part, then kv/k part — so it computes
      exactly what the one-launch kernel computes (same kernel, same math) in two launches:
      the launch saving the fusion exists for is gone and only a launch count shows it;
  mutant-dispatch-falls-through (verify_attention)
      the backend runs the routed kernel, then falls through to the per-head split-KV kernel
      as well (a missing return): the same ``o``, 4 launches instead of 2;
  mutant-gate-flips-per-call (qk_norm_rope, verify_attention)
      the dispatch gate reads a switch that changes between calls (a counter here; in serving a
      Python global or an environment variable flipped at run time): CUDA-graph capture bakes
      one branch in, the eager call on the replay inputs takes the other. Each branch is a
      correct path, so parity cannot tell; the graph check compares the decisions.

Not registered by ``cases.mutants.register`` (it loads ``cases/mutants/<op>.py`` per op, and no
op is called "gpu"): every one passes the CPU parity suite and the timelines by construction,
so the CPU kill matrix would list them as survivors. ``harness.gpu_checks`` registers them
(``register``); the kill matrix prints ``skip_note()`` instead.
"""
from __future__ import annotations

import itertools
import os

import torch

from harness.registry import Impl, Registry
from reference import mla_fp8_prepare as mla_ref
from reference import qk_norm_rope as qk_ref

LAUNCHES = "gpu:launches"
GRAPH_GATE = "gpu:graph-gate"


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# ----------------------------------------------------------------------------- qk_norm_rope in two launches

def _qk_norm_rope_two_launches(*, q, kv, kv_norm_weight, q_norm_weight=None, eps, rope_dim, cos, sin, positions,
                               rope_style="interleaved", ring=None, loc=None, q_out=None):
    """``fused.qk_norm_rope.qk_norm_rope`` with its grid split in two: programs 0..H-1 (q heads)
    in one launch, the kv program (``H = 0`` makes program 0 the kv one) in a second."""
    import triton

    from fused import qk_norm_rope as f

    T, H, D = qk_ref.validate(q=q, kv=kv, kv_norm_weight=kv_norm_weight, q_norm_weight=q_norm_weight, eps=eps,
                              rope_dim=rope_dim, cos=cos, sin=sin, positions=positions, rope_style=rope_style,
                              ring=ring, loc=loc, q_out=q_out)
    if q_out is None:
        q_out = torch.empty((T, H, D), dtype=q.dtype, device=q.device)
    kv_out = torch.empty((T, D), dtype=kv.dtype, device=kv.device)
    if T == 0:
        return q_out, kv_out
    block_t, block_d, num_warps = f.block_config(D, _interpreted())
    has_store = ring is not None
    args = dict(
        q_out_ptr=q_out, kv_out_ptr=kv_out, ring_ptr=ring if has_store else kv_out, q_ptr=q, kv_ptr=kv,
        q_w_ptr=q_norm_weight if q_norm_weight is not None else kv_norm_weight, kv_w_ptr=kv_norm_weight,
        cos_ptr=cos, sin_ptr=sin, pos_ptr=positions, loc_ptr=loc if has_store else positions,
        T=T, D=D, R=rope_dim, eps=eps, stride_q_t=q.stride(0), stride_q_h=q.stride(1), stride_kv_t=kv.stride(0),
        stride_qo_t=q_out.stride(0), stride_qo_h=q_out.stride(1), stride_kvo_t=kv_out.stride(0),
        stride_ring_s=ring.stride(0) if has_store else 0, stride_cs_p=cos.stride(0),
        BLOCK_T=block_t, BLOCK_D=block_d, HAS_Q_WEIGHT=q_norm_weight is not None, HAS_STORE=has_store,
        IS_NEOX=rope_style == "neox", num_warps=num_warps,
    )
    n_t = triton.cdiv(T, block_t)
    f._qk_norm_rope_kernel[(n_t, H)](H=H, **args)  # BUG: launch 1, the q heads
    f._qk_norm_rope_kernel[(n_t, 1)](H=0, **args)  # BUG: launch 2, kv (+ the ring store in decode)
    return q_out, kv_out


def _qk_two_launches(*, forward_mode, ring, loc, verify_switch=None, **kw):
    """``fused.qk_norm_rope.qk_norm_rope_step`` (same gate, same store rule) over the two-launch wrapper."""
    from fused import qk_norm_rope as f

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


# ----------------------------------------------------------------------------- mla_fp8_prepare in two launches

def _mla_kernel_two_launches(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, loc, kv_descale=None,
                             fp8_policy="saturate"):
    """``fused.mla_fp8_prepare.mla_fp8_prepare`` with its grid split in two: the q programs in one
    launch, the k programs (``H = 0`` leaves no q blocks) in a second."""
    import triton

    from fused import mla_fp8_prepare as f

    T, H, Dn, R = mla_ref.validate(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer,
                                   loc=loc, kv_descale=kv_descale, fp8_policy=fp8_policy)
    q8 = torch.empty((T, H, Dn + R), dtype=kv_buffer.dtype, device=kv_buffer.device)
    if T == 0:
        return q8
    k_mul = f.k_mul_tensor(kv_descale, kv_buffer.device)
    block_rows, num_warps = f.block_config(_interpreted())
    args = dict(
        q8_ptr=q8, kv_ptr=kv_buffer, q_nope_ptr=q_nope, q_rope_ptr=q_rope, k_nope_ptr=k_nope, k_rope_ptr=k_rope,
        loc_ptr=loc, k_mul_ptr=k_mul if k_mul is not None else q8, T=T, DN=Dn, R=R,
        stride_qn_t=q_nope.stride(0), stride_qn_h=q_nope.stride(1), stride_qr_t=q_rope.stride(0),
        stride_qr_h=q_rope.stride(1), stride_kn_t=k_nope.stride(0), stride_kr_t=k_rope.stride(0),
        stride_q8_t=q8.stride(0), stride_q8_h=q8.stride(1), stride_kv_s=kv_buffer.stride(0),
        FP8_MAX=torch.finfo(kv_buffer.dtype).max, BLOCK_ROWS=block_rows, BLOCK_DN=triton.next_power_of_2(Dn),
        BLOCK_R=triton.next_power_of_2(R), HAS_K_MUL=k_mul is not None, num_warps=num_warps,
    )
    f._mla_fp8_prepare_kernel[(triton.cdiv(T * H, block_rows),)](H=H, **args)  # BUG: launch 1, q8
    f._mla_fp8_prepare_kernel[(triton.cdiv(T, block_rows),)](H=0, **args)  # BUG: launch 2, the KV rows
    return q8


def _mla_two_launches(**kw):
    from fused import mla_fp8_prepare as f

    return f.mla_fp8_prepare_step(kernel_fn=_mla_kernel_two_launches, **kw)


# ----------------------------------------------------------------------------- verify_attention

def _verify_falls_through(**kw):
    """The backend's routed kernel, then the split-KV kernel again into a fresh ``o``."""
    from fused import verify_attention as f

    out = f.verify_attention(**kw)
    if kw.get("topk", 1) == 1 and f.can_handle("split_kv", **kw) is True:
        out = f.verify_split_kv(**kw)  # BUG: no return after the first kernel succeeded
    return out


# ----------------------------------------------------------------------------- gates that flip per call

_QK_CALLS = itertools.count()
_VERIFY_CALLS = itertools.count()


def flipping_qk_gate(*, unified, forward_mode, verify_switch, fused_non_unified=True):
    """``fused.qk_norm_rope.gate`` with the verify switch read from a call counter: on every
    other call target-verify takes the two-launch chain instead of the fused kernel."""
    from fused import qk_norm_rope as f

    switch = verify_switch and next(_QK_CALLS) % 2 == 0  # BUG: a switch read at call time
    return f.gate(unified=unified, forward_mode=forward_mode, verify_switch=switch,
                  fused_non_unified=fused_non_unified)


def flipping_verify_gate(*, model_family, topk, use_mla, splitkv_switch, num_local_kv_heads):
    """``fused.verify_attention.gate`` whose shared-KV choice is dropped on every other call."""
    from fused import verify_attention as f

    route = f.gate(model_family=model_family, topk=topk, use_mla=use_mla, splitkv_switch=splitkv_switch,
                   num_local_kv_heads=num_local_kv_heads)
    if route.shared_kv and next(_VERIFY_CALLS) % 2:  # BUG: a switch read at call time
        return f.VerifyRoute(shared_kv=False, split_kv=route.split_kv)
    return route


def _qk_gate_flips(**kw):
    from fused import qk_norm_rope as f

    return f.qk_norm_rope_step(gate_fn=flipping_qk_gate, **kw)


def _verify_gate_flips(**kw):
    from fused import verify_attention as f

    return f.verify_attention(gate_fn=flipping_verify_gate, **kw)


MUTANTS = [
    Impl("qk_norm_rope", "mutant-two-launches", "mutant", _qk_two_launches,
         doc="a 'fused' qk-norm-rope that launches its kernel twice (q heads, then kv): right numbers, "
             "no launch saved", catches=(LAUNCHES,)),
    Impl("mla_fp8_prepare", "mutant-two-launches", "mutant", _mla_two_launches,
         doc="a 'fused' fp8 prepare that launches its kernel twice (q8, then the KV rows): byte-identical, "
             "no launch saved", catches=(LAUNCHES,)),
    Impl("verify_attention", "mutant-dispatch-falls-through", "mutant", _verify_falls_through,
         doc="the backend runs the routed kernel, then the split-KV kernel too (missing return): same o, "
             "twice the launches", catches=(LAUNCHES,)),
    Impl("qk_norm_rope", "mutant-gate-flips-per-call", "mutant", _qk_gate_flips,
         doc="the verify switch is read at call time (a counter): CUDA-graph capture bakes one branch, "
             "eager takes the other", catches=(GRAPH_GATE,)),
    Impl("verify_attention", "mutant-gate-flips-per-call", "mutant", _verify_gate_flips,
         doc="shared-KV vs split-KV decided by a switch read at call time (a counter): capture and "
             "replay-time eager disagree", catches=(GRAPH_GATE,)),
]


def is_gpu_mutant(impl: Impl) -> bool:
    """A mutant only the GPU checks are expected to flag."""
    return impl.kind == "mutant" and any(c.startswith("gpu:") for c in impl.catches)


def register(reg: Registry) -> list[Impl]:
    out = [m for m in MUTANTS if m.op in reg.ops]
    for m in out:
        reg.add(m)
    return out


def skip_note() -> str:
    """What the CPU kill matrix prints about the mutants it does not run."""
    names = ", ".join(m.key for m in MUTANTS)
    return (f"not in this matrix: {len(MUTANTS)} GPU-only mutants (cases/mutants/gpu.py: {names}); they compute "
            f"the right numbers, so parity and timelines cannot flag them: launch counts and CUDA-graph capture "
            f"need a GPU (python -m harness.gpu_checks)")
