"""GPU-only mutants of ``mla_fp8_prepare`` (``harness.gpu.mutants``): the right numbers computed the wrong way."""
from __future__ import annotations

import torch

from harness.gpu.mutants import fused_step_with, interpreted, two_launches
from reference.mla_fp8_prepare import chain as mla_ref


# ----------------------------------------------------------------------------- mla_fp8_prepare in two launches

def _mla_kernel_two_launches(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, loc, kv_descale=None,
                             fp8_policy="saturate"):
    """``fused.mla_fp8_prepare.wrapper.mla_fp8_prepare`` with its grid split in two: the q programs in one
    launch, the k programs (``H = 0`` leaves no q blocks) in a second."""
    import triton

    from fused.mla_fp8_prepare import wrapper as f

    T, H, Dn, R = mla_ref.validate(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer,
                                   loc=loc, kv_descale=kv_descale, fp8_policy=fp8_policy)
    q8 = torch.empty((T, H, Dn + R), dtype=kv_buffer.dtype, device=kv_buffer.device)
    if T == 0:
        return q8
    k_mul = f.k_mul_tensor(kv_descale, kv_buffer.device)
    block_rows, num_warps = f.block_config(interpreted())
    args = dict(
        q8_ptr=q8, kv_ptr=kv_buffer, q_nope_ptr=q_nope, q_rope_ptr=q_rope, k_nope_ptr=k_nope, k_rope_ptr=k_rope,
        loc_ptr=loc, k_mul_ptr=k_mul if k_mul is not None else q8, T=T, DN=Dn, R=R,
        stride_qn_t=q_nope.stride(0), stride_qn_h=q_nope.stride(1), stride_qr_t=q_rope.stride(0),
        stride_qr_h=q_rope.stride(1), stride_kn_t=k_nope.stride(0), stride_kr_t=k_rope.stride(0),
        stride_q8_t=q8.stride(0), stride_q8_h=q8.stride(1), stride_kv_s=kv_buffer.stride(0),
        FP8_MAX=torch.finfo(kv_buffer.dtype).max, BLOCK_ROWS=block_rows, BLOCK_DN=triton.next_power_of_2(Dn),
        BLOCK_R=triton.next_power_of_2(R), HAS_K_MUL=k_mul is not None, num_warps=num_warps,
    )
    f.mla_fp8_prepare_kernel[(triton.cdiv(T * H, block_rows),)](H=H, **args)  # BUG: launch 1, q8
    f.mla_fp8_prepare_kernel[(triton.cdiv(T, block_rows),)](H=0, **args)  # BUG: launch 2, the KV rows
    return q8


MUTANTS = [
    two_launches("mla_fp8_prepare",
                 fused_step_with("mla_fp8_prepare", "mla_fp8_prepare_step", kernel_fn=_mla_kernel_two_launches),
                 "a 'fused' fp8 prepare that launches its kernel twice (q8, then the KV rows): byte-identical, "
                 "no launch saved"),
]
