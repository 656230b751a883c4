"""What SGLang 0.5.23's four JIT-compiled CUDA kernels compute, written in torch from their ``.cuh`` sources,
behind the Python signatures of SGLang's own entry points, so that ``harness.adapters.sglang_jit``'s input
translation runs unchanged on the CPU (``KERNELS``; tests/test_sglang_jit.py) and the conventions are on record:

  set_mla_kv_concat_q_fp8   sglang/kernels/jit/csrc/elementwise/set_mla_kv_concat_q.cuh (SetMlaKVConcatQFp8Kernel)
      One launch: warp ``t < n`` quantises token t's k row ``[k_nope (512) | k_rope (64)]`` bf16 -> fp32 ->
      e4m3 with ``__nv_cvt_float2_to_fp8x2(.., __NV_SATFINITE, __NV_E4M3)`` (round to nearest even,
      subnormals kept, finite overflow and ±inf to ±448, NaN to NaN) into shared memory and TMA-stores the
      576 bytes at row ``loc[t]`` (DCP: row ``loc // world`` when ``loc % world == rank``, C++ ``/`` and
      ``%``; its only skip); the other warps quantise q rows the same way into a new (n, H, 576) tensor.
      No scale, no bounds check: ``loc = -1`` writes the 576 bytes before the pool.
  fused_q_norm_rope         sglang/kernels/jit/csrc/deepseek_v4/main_norm_rope.cuh (FusedQNormRopeKernel)
      Warp per (token, head). RMSNorm without a weight: ``bf16(x · rsqrtf(Σx² / D + eps))``; then RoPE on
      the last 64 dims of that **bf16** row: lane l rotates the pair (2l, 2l + 1) by ``freqs[pos, 2l],
      freqs[pos, 2l + 1]`` = (cos, sin) of ``view_as_real(freqs_cis)`` (interleaved, GPT-J pairs), in fp32,
      rounded to bf16 again. ``eps`` None: no norm (a copy with RoPE).
  fused_norm_rope_inplace   sglang/kernels/jit/csrc/deepseek_v4/fused_norm_rope.cuh (FusedNormRopeKernel, mode 2)
      The same on kv (T, D), contiguous, in place, with the weight: ``bf16((x · rsqrtf(..)) · w)``, positions
      int64.
  verify_tree_greedy        sglang/kernels/jit/csrc/speculative/tree.cuh -> include/sgl_kernel/speculative/eagle.cuh
                            (VerifyTreeGreedy<int32_t, int64_t>)
      One thread per request b: accept_index[b, 0] = retrive_index[b, 0]; then for each of S - 1 levels, the
      first child of the current node, and along ``retrive_next_sibling`` (``while (cur != -1)``, unbounded)
      the first whose candidate equals ``target_predict`` at the flat row of the last accepted node: predicts
      at that row gets the token, the child's row is appended to accept_index; no match or a leaf ends it.
      Last, the count, and predicts at the last accepted row = target_predict there (the bonus). Nothing else
      is written; nothing is bounds-checked (a negative retrive_index is used as an offset).

Σx² is the warp's: lane l adds its tiles in order (element ``(i·32 + l)·vec + j``, ``vec = min(8, D/32)``),
each ``x·x + s`` one rounding (nvcc contracts it to an FMA), then a butterfly over ``__shfl_xor`` 16…1.
These are emulations, not the kernels: ``rsqrtf`` is the hardware's approximate reciprocal square root and
nvcc may contract the RoPE products too, so a value can land one fp32 ulp away and, rarely, its bf16 one
ulp away. The GPU run is the judge; here they check the adapters' translation against the reference.
"""
from __future__ import annotations

import torch

from harness.adapters.sglang_jit import Kernels

FP8_NOPE, FP8_ROPE = 512, 64  # kFp8NopeDim, kFp8RopeDim: fixed in the fp8 kernel
E4M3_MAX = 448.0
E4M3_NAN = 0x7F
WARP = 32


def fp8_satfinite(x: torch.Tensor) -> torch.Tensor:
    """bf16 (any shape) -> e4m3fn as ``__NV_SATFINITE`` converts it: fp32 upcast (exact), round to nearest
    even, ±448 past the range (±inf too), NaN to 0x7F."""
    f = x.float()
    nan = f.isnan()
    codes = torch.where(nan, torch.zeros_like(f), f.clamp(-E4M3_MAX, E4M3_MAX)).to(torch.float8_e4m3fn)
    return torch.where(nan, torch.full_like(codes.view(torch.uint8), E4M3_NAN),
                       codes.view(torch.uint8)).view(torch.float8_e4m3fn)


def set_mla_kv_concat_q_fp8(kv_buffer, loc, cache_k_nope, cache_k_rope, q_nope, q_rope, num_warps=0,
                            dcp_world_size=1, dcp_rank=0):
    """SGLang's ``set_mla_kv_concat_q_fp8``: writes ``kv_buffer`` rows, returns q8 (n, H, 576) e4m3fn.
    IndexError where the kernel would write outside the pool (it has no bounds check)."""
    n = loc.shape[0]
    k_nope, k_rope = cache_k_nope.reshape(n, -1), cache_k_rope.reshape(n, -1)
    if k_nope.shape[-1] != FP8_NOPE or k_rope.shape[-1] != FP8_ROPE:
        raise ValueError(f"the kernel's rows are {FP8_NOPE} + {FP8_ROPE} wide")
    buf = kv_buffer.view(kv_buffer.shape[0], -1).view(torch.uint8)
    rows = torch.cat((fp8_satfinite(k_nope), fp8_satfinite(k_rope)), dim=-1).view(torch.uint8)  # (n, 576)
    vloc = loc.long()
    own = torch.fmod(vloc, dcp_world_size) == dcp_rank  # C++ %: the dividend's sign
    phys = torch.div(vloc, dcp_world_size, rounding_mode="trunc")[own]
    if bool(((phys < 0) | (phys >= buf.shape[0])).any()):
        raise IndexError(f"rows {phys[(phys < 0) | (phys >= buf.shape[0])].tolist()} lie outside the pool of "
                         f"{buf.shape[0]}: the kernel would write there (no bounds check)")
    buf[phys, : FP8_NOPE + FP8_ROPE] = rows[own]
    return torch.cat((fp8_satfinite(q_nope), fp8_satfinite(q_rope)), dim=-1)  # (n, H, 576), new


def warp_sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """x (..., D) fp32 -> (...,) fp32: Σx² as one warp adds it (module docstring)."""
    D = x.shape[-1]
    vec = min(8, D // WARP)
    local = D // (WARP * vec)
    tiles = x.reshape(*x.shape[:-1], local, WARP, vec)  # element (i·32 + l)·vec + j at [i, l, j]
    s = torch.zeros(*x.shape[:-1], WARP, dtype=torch.float32, device=x.device)
    for i in range(local):
        for j in range(vec):
            v = tiles[..., i, :, j].double()
            s = (v * v + s.double()).float()  # fma(x, x, s): x·x exact in fp64, one rounding to fp32
    lanes = torch.arange(WARP, device=x.device)
    for mask in (16, 8, 4, 2, 1):  # __shfl_xor_sync butterfly: every lane ends with the same sum
        s = s + s[..., lanes ^ mask]
    return s[..., 0]


def _norm_rope(x, weight, eps, freqs_cis, positions):
    """x (T, ..., D) bf16 -> (T, ..., D) bf16: the kernels' norm (bf16) then RoPE on the last R dims (bf16)."""
    freqs = torch.view_as_real(freqs_cis).flatten(-2)  # (max_pos, R) fp32: cos0, sin0, cos1, sin1, ...
    R, D = freqs.shape[-1], x.shape[-1]
    xf = x.float()
    if eps is not None:
        norm = torch.rsqrt(warp_sum_of_squares(xf) / D + eps)  # rsqrtf(Σx² / kHeadDim + eps)
        y = xf * norm[..., None]
        if weight is not None:
            y = y * weight.float()
        y = y.to(x.dtype)  # the normalised row in bf16: what RoPE reads
    else:
        y = x
    f = freqs[positions.long()].view(x.shape[0], *([1] * (x.dim() - 2)), R)  # (T, 1.., R)
    re, im = y[..., D - R::2].float(), y[..., D - R + 1::2].float()
    c, s = f[..., 0::2], f[..., 1::2]
    rot = torch.stack((re * c - im * s, re * s + im * c), dim=-1).flatten(-2).to(x.dtype)
    return torch.cat((y[..., : D - R], rot), dim=-1)


def fused_q_norm_rope(q_input, q_output, eps, freqs_cis, positions) -> None:
    """SGLang's ``fused_q_norm_rope`` (bf16 q_output): q_input (T, H, D) heads packed -> q_output."""
    if q_input.stride()[1:] != (q_input.shape[2], 1) or q_output.stride()[1:] != (q_output.shape[2], 1):
        raise ValueError("q_input / q_output: the kernel wants strides (-1, D, 1)")
    q_output.copy_(_norm_rope(q_input, None, eps, freqs_cis, positions))


def fused_norm_rope_inplace(kv, weight, eps, freq_cis, positions) -> None:
    """SGLang's ``fused_norm_rope_inplace``: kv (T, D) contiguous, normalised and rotated in place."""
    if not kv.is_contiguous() or positions.dtype != torch.int64 or weight.dtype != kv.dtype:
        raise ValueError("kv contiguous, positions int64 and weight in kv's dtype (the kernel's TensorMatcher)")
    kv.copy_(_norm_rope(kv, weight, eps, freq_cis, positions))


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                       retrive_next_sibling, target_predict) -> None:
    """The CUDA kernel's walk, per request, on its host-checked arguments (int64 (B, N) tree tensors and
    target_predict, int32 outputs). A sibling walk that has not ended after N steps would spin on the GPU:
    RuntimeError here."""
    for name, t in (("candidates", candidates), ("retrive_index", retrive_index),
                    ("retrive_next_token", retrive_next_token), ("retrive_next_sibling", retrive_next_sibling),
                    ("target_predict", target_predict)):
        if t.dtype != torch.int64 or t.shape != candidates.shape:
            raise TypeError(f"{name}: the kernel's TensorMatcher wants int64 {tuple(candidates.shape)}")
    B, N = candidates.shape
    S = accept_index.shape[1]
    cand, ridx, nxt, sib = (t.tolist() for t in (candidates, retrive_index, retrive_next_token, retrive_next_sibling))
    tp = target_predict.reshape(-1).tolist()
    pred, acc, num = predicts.tolist(), accept_index.tolist(), accept_token_num.tolist()
    for b in range(B):
        last = ridx[b][0]
        acc[b][0] = last
        n, cur = 0, 0
        for _ in range(1, S):
            cur = nxt[b][cur]
            steps = 0
            while cur != -1:
                if cand[b][cur] == tp[last]:
                    pred[last] = tp[last]
                    n += 1
                    acc[b][n] = ridx[b][cur]
                    last = ridx[b][cur]
                    break
                cur = sib[b][cur]
                steps += 1
                if steps > N:
                    raise RuntimeError(f"request {b}: the sibling list does not end (the CUDA kernel would spin)")
            if cur == -1:
                break
        num[b] = n
        pred[last] = tp[last]
    predicts.copy_(torch.tensor(pred, dtype=predicts.dtype))
    accept_index.copy_(torch.tensor(acc, dtype=accept_index.dtype).view(accept_index.shape))
    accept_token_num.copy_(torch.tensor(num, dtype=accept_token_num.dtype))


# the four kernels as the adapters take them (harness.adapters.sglang_jit.impls); covered_fp8: the adapter's reading
KERNELS = Kernels(name="emulated", set_mla_kv_concat_q_fp8=set_mla_kv_concat_q_fp8, covered_fp8=None,
                  fused_q_norm_rope=fused_q_norm_rope, fused_norm_rope_inplace=fused_norm_rope_inplace,
                  verify_tree_greedy=verify_tree_greedy, missing=lambda kernel: "", first_call=None)


def IMPLS():
    """The sglang_jit adapters over the emulation: ``--impl harness.adapters.sglang_jit_emulation:IMPLS`` (any device)."""
    from harness.adapters.sglang_jit import impls

    return impls(KERNELS)
