"""Triton kernels of ``qk_norm_rope`` (seed 000; ``fused.qk_norm_rope.wrapper`` launches them, its docstring
describes the grid): ``qk_norm_rope_kernel`` normalises and rotates one q head (or, program ``H``,
kv) for BLOCK_T tokens, with ``_norm_rope_tile`` (the RMSNorm and RoPE of one tile; ``_rope_partner``
moves each rope dim's partner in registers) and, for a non-unified layer, ``_paged_fp8_store``.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rope_partner(y, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, IS_NEOX: tl.constexpr):
    """y [BLOCK_T, BLOCK_R], the rope dims, each column swapped for the one it rotates with, in
    registers (bit moves only: the values are y's own). Interleaved: pairs (2i, 2i+1); neox: the
    halves (i, i + R/2), R = BLOCK_R."""
    if IS_NEOX:
        a, b = tl.split(tl.permute(tl.reshape(y, (BLOCK_T, 2, BLOCK_R // 2)), (0, 2, 1)))  # the two halves
        return tl.reshape(tl.permute(tl.join(b, a), (0, 2, 1)), (BLOCK_T, BLOCK_R))
    a, b = tl.split(tl.reshape(y, (BLOCK_T, BLOCK_R // 2, 2)))
    return tl.reshape(tl.join(b, a), (BLOCK_T, BLOCK_R))


@triton.jit
def _norm_rope_tile(
    row_ptrs,  # [BLOCK_T, 1] pointers to the first element of each source row
    rope_ptrs,  # [BLOCK_T, 1] pointers to the first rope dim of each row (row + D - R)
    w_ptr,  # (D,) RMSNorm weight, read when HAS_W
    cos_row_ptrs,  # [BLOCK_T, 1] pointers to cos[pos[t], 0]
    sin_row_ptrs,  # [BLOCK_T, 1] pointers to sin[pos[t], 0]
    offs_d,  # [BLOCK_D] column index
    offs_r,  # [BLOCK_R] index inside the rope dims
    mask,  # [BLOCK_T, BLOCK_D] valid token and column
    mask_r,  # [BLOCK_T, BLOCK_R] valid token and rope dim
    D,  # head_dim
    R,  # rope_dim
    eps,  # RMSNorm epsilon
    HAS_W: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    IS_NEOX: tl.constexpr,
    PARTNER_IN_REGS: tl.constexpr,  # interleaved, or a power-of-two R: the partner moves in registers
):
    """(y [BLOCK_T, BLOCK_D] the normalised rows, valid outside the rope dims; yr [BLOCK_T, BLOCK_R]
    the rope dims normalised and rotated). The row is read once for the norm; its last R values are
    read again (from L1) as their own tile, so the rotation and its angle tables touch R columns
    only. Every value is the same fp32 product as ``x · rstd · w`` of its own column; a rotated one
    is ``y·c + sign·y_partner·s``. Without PARTNER_IN_REGS (neox, R not a power of two) the partner
    is read from its address and normalised the same way."""
    # upcast right after loading: no bf16 arithmetic anywhere (and none under the interpreter)
    x = tl.load(row_ptrs + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)  # [BLOCK_T]
    y = x * rstd[:, None]
    if HAS_W:
        y = y * tl.load(w_ptr + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)[None, :]
    in_r = offs_r < R
    xr = tl.load(rope_ptrs + offs_r[None, :], mask=mask_r, other=0.0).to(tl.float32)
    yr = xr * rstd[:, None]
    if HAS_W:
        yr = yr * tl.load(w_ptr + (D - R) + offs_r, mask=in_r, other=0.0).to(tl.float32)[None, :]
    half = R // 2
    if IS_NEOX:
        first = offs_r < half
        cs_idx = tl.where(first, offs_r, offs_r - half)
        partner = tl.where(first, offs_r + half, offs_r - half)
    else:
        first = (offs_r % 2) == 0
        cs_idx = offs_r // 2
        partner = tl.where(first, offs_r + 1, offs_r - 1)
    sign = tl.where(first, -1.0, 1.0)
    if PARTNER_IN_REGS:
        yp = _rope_partner(yr, BLOCK_T, BLOCK_R, IS_NEOX)
    else:
        yp = tl.load(rope_ptrs + partner[None, :], mask=mask_r, other=0.0).to(tl.float32) * rstd[:, None]
        if HAS_W:
            yp = yp * tl.load(w_ptr + (D - R) + partner, mask=in_r, other=0.0).to(tl.float32)[None, :]
    c = tl.load(cos_row_ptrs + cs_idx[None, :], mask=mask_r, other=1.0)
    s = tl.load(sin_row_ptrs + cs_idx[None, :], mask=mask_r, other=0.0)
    return y, yr * c + sign[None, :] * yp * s


@triton.jit
def _paged_fp8_store(
    kv_y,  # [BLOCK_T, BLOCK_D] bf16 normalised kv rows (their nope dims are kv_out's)
    kv_r,  # [BLOCK_T, BLOCK_R] bf16 rotated rope dims (kv_out's)
    pool_ptr,  # uint8 pool, (num_pages, page_bytes)
    pool_fp8_ptr,  # the pool as float8_e4m3fn
    loc,  # [BLOCK_T] int64 token slots (loaded by the caller); negative = padding
    offs_d, offs_r, mask_t,
    stride_pool_p, page_size, n_slots, D, R,
    FP8_MAX: tl.constexpr,
    AMAX_FLOOR: tl.constexpr,
):
    """The non-unified store (reference.qk_norm_rope.swa.SwaLayout): per 64-value nope tile a ue8m0
    exponent e = ceil(log2(max(|max|, 1e-8) / 448)) from the fp32 quotient's bits (no log2),
    codes fp8(clamp(x · 2**-e, ±448)), the rope dims' bf16 bytes; the pad byte is left alone."""
    write = mask_t & (loc >= 0) & (loc < n_slots)  # a slot past the pool (unchecked input): skipped
    page = tl.where(write, loc, 0) // page_size
    in_page = tl.where(write, loc, 0) % page_size
    nope = D - R
    value_bytes = nope + 2 * R
    tiles = nope // 64
    v_base = page * stride_pool_p + in_page * value_bytes  # [BLOCK_T] byte offset of the value record
    s_base = page * stride_pool_p + page_size * value_bytes + in_page * (tiles + 1)
    is_nope = offs_d < nope
    y = kv_y.to(tl.float32)  # bf16 -> fp32, exact
    ay = tl.where(write[:, None] & is_nope[None, :], tl.abs(y), 0.0)
    inv = tl.zeros_like(y)
    for i in range(0, tiles):
        in_tile = is_nope & (offs_d // 64 == i)
        amax = tl.max(tl.where(in_tile[None, :], ay, 0.0), axis=1)  # [BLOCK_T]
        bits = (tl.maximum(amax, AMAX_FLOOR) / FP8_MAX).to(tl.int32, bitcast=True)  # > 0, normal
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # exact ceil(log2)
        inv_t = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2**-e
        inv = tl.where(in_tile[None, :], inv_t[:, None], inv)
        tl.store(pool_ptr + s_base + i, (e + 127).to(tl.uint8), mask=write)
    x = tl.minimum(tl.maximum(y * inv, -FP8_MAX), FP8_MAX)  # in range: the cast only rounds
    m_nope = write[:, None] & is_nope[None, :]
    tl.store(pool_fp8_ptr + v_base[:, None] + offs_d[None, :], x.to(pool_fp8_ptr.dtype.element_ty), mask=m_nope)
    half = kv_r.to(tl.int16, bitcast=True)
    lo = (half & 0xFF).to(tl.uint8)
    hi = ((half >> 8) & 0xFF).to(tl.uint8)
    rope_at = pool_ptr + v_base[:, None] + nope + 2 * offs_r[None, :]
    m_rope = write[:, None] & (offs_r < R)[None, :]
    tl.store(rope_at, lo, mask=m_rope)
    tl.store(rope_at + 1, hi, mask=m_rope)


@triton.jit
def _check_values(flag_ptr, pos_in, pos_ok, loc_ptr, offs_t, mask_t, T, n_pos, n_slots,
                  HAS_SLOTS: tl.constexpr, BLOCK_S: tl.constexpr):
    """The device-side value checks of one kv program's BLOCK_T tokens (``fused.device_checks``):
    a position outside [0, n_pos), and with a store a slot past its n_slots rows or one that another
    token names too (an O(T) scan of loc). Each kind seen sets its bit in flag_ptr[0] and records one
    offending value and its bound; returns the rows the store may write (valid ones, neither kind)."""
    bad_pos = mask_t & (pos_ok == 0)
    any_pos = tl.max(bad_pos.to(tl.int32), axis=0) > 0
    tl.atomic_or(flag_ptr, 1, mask=any_pos)
    tl.atomic_xchg(flag_ptr + 1, tl.max(tl.where(bad_pos, pos_in, -(2**62)), axis=0), mask=any_pos)
    tl.atomic_xchg(flag_ptr + 2, n_pos.to(tl.int64), mask=any_pos)
    keep = mask_t & pos_ok
    if HAS_SLOTS:
        slot = tl.load(loc_ptr + offs_t, mask=mask_t, other=-1).to(tl.int64)
        past = mask_t & (slot >= n_slots)
        any_past = tl.max(past.to(tl.int32), axis=0) > 0
        tl.atomic_or(flag_ptr, 2, mask=any_past)
        tl.atomic_xchg(flag_ptr + 3, tl.max(tl.where(past, slot, -1), axis=0), mask=any_past)
        tl.atomic_xchg(flag_ptr + 4, n_slots.to(tl.int64), mask=any_past)
        twice = tl.zeros_like(mask_t)
        for j0 in range(0, T, BLOCK_S):
            offs_j = j0 + tl.arange(0, BLOCK_S)
            other = tl.load(loc_ptr + offs_j, mask=offs_j < T, other=-1).to(tl.int64)
            same = (slot[:, None] == other[None, :]) & (offs_j[None, :] != offs_t[:, None]) & (other >= 0)[None, :]
            twice = twice | (tl.max(same.to(tl.int32), axis=1) > 0)
        twice = twice & mask_t
        any_twice = tl.max(twice.to(tl.int32), axis=0) > 0
        tl.atomic_or(flag_ptr, 4, mask=any_twice)
        tl.atomic_xchg(flag_ptr + 5, tl.max(tl.where(twice, slot, -1), axis=0), mask=any_twice)
        keep = keep & (twice == 0)  # a slot past the store: skipped by the store itself
    return keep


@triton.jit(do_not_specialize=["T", "H", "stride_q_t", "stride_q_h", "stride_kv_t", "stride_qo_t", "stride_qo_h",
                               "stride_kvo_t", "stride_ring_s", "stride_cs_p", "stride_pool_p", "page_size",
                               "n_pos", "n_slots"])
def qk_norm_rope_kernel(
    q_out_ptr,  # (T, H, D) out, contiguous
    kv_out_ptr,  # (T, D) out, contiguous
    ring_ptr,  # (S, D) ring, rows loc[t] written when HAS_STORE
    q_ptr,  # (T, H, D) in, unit stride on D
    kv_ptr,  # (T, D) in, unit stride on D (a strided slice of qkv_a in real models)
    q_w_ptr,  # (D,) q RMSNorm weight, read when HAS_Q_WEIGHT
    kv_w_ptr,  # (D,) kv RMSNorm weight
    cos_ptr,  # (max_pos, R/2) fp32
    sin_ptr,  # (max_pos, R/2) fp32
    pos_ptr,  # (T,) int positions
    loc_ptr,  # (T,) int ring slots; negative = padding, nothing written
    T,  # num_tokens
    H,  # num_heads
    D,  # head_dim
    R,  # rope_dim (last R dims rotate)
    eps,  # RMSNorm epsilon (shared by q and kv)
    stride_q_t, stride_q_h,
    stride_kv_t,
    stride_qo_t, stride_qo_h,
    stride_kvo_t,
    stride_ring_s,
    stride_cs_p,
    n_pos,  # rows of cos / sin: a position outside [0, n_pos) reads row 0 (memory-safe unchecked input)
    n_slots,  # rows (ring) or token slots (pool) of the store target: a slot past them is skipped
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_STORE: tl.constexpr,
    IS_NEOX: tl.constexpr,
    BLOCK_R: tl.constexpr = 64,  # the rope tile: max(fused.qk_norm_rope.wrapper.ROPE_TILE, next_power_of_2(R)) (masked past R)
    PARTNER_IN_REGS: tl.constexpr = True,  # interleaved, or R a power of two (``_norm_rope_tile``)
    VEC: tl.constexpr = 1,  # D, R and every row stride are multiples of VEC elements (16-byte vectors at 8)
    pool_ptr=None,  # (num_pages, page_bytes) uint8 paged SWA cache, written when PAGED_FP8_STORE
    pool_fp8_ptr=None,  # the same bytes viewed as float8_e4m3fn
    stride_pool_p=0,  # page_bytes
    page_size=1,  # tokens per page
    PAGED_FP8_STORE: tl.constexpr = False,  # non-unified KV: loc are token slots of pool_ptr
    FP8_MAX: tl.constexpr = 448.0,
    AMAX_FLOOR: tl.constexpr = 1e-8,
    flag_ptr=None,  # (FLAG_WORDS,) int64 error record of fused.device_checks, written when CHECK_VALUES
    CHECK_VALUES: tl.constexpr = False,  # the kv programs check positions and slots (fused.device_checks)
    BLOCK_S: tl.constexpr = 256,  # slots compared per step of the duplicate scan
):
    """The op's one launch (``fused.qk_norm_rope.wrapper.launch``): RMSNorm + RoPE of one q head, or of kv
    (program H, with its ring or paged store), for BLOCK_T tokens."""
    pid_t = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)  # int64: T*H*D can pass 2**31
    offs_d = tl.arange(0, BLOCK_D)
    mask_t = offs_t < T
    mask_d = offs_d < D
    mask = mask_t[:, None] & mask_d[None, :]

    offs_r = tl.arange(0, BLOCK_R)
    nope_mask = mask & (offs_d < D - R)[None, :]  # the rope dims are stored from their own tile
    mask_r = mask_t[:, None] & (offs_r < R)[None, :]

    pos_in = tl.load(pos_ptr + offs_t, mask=mask_t, other=0).to(tl.int64)
    pos_ok = (pos_in >= 0) & (pos_in < n_pos)
    pos = tl.where(pos_ok, pos_in, 0)  # the wrapper checked them, unless told not to
    cos_rows = cos_ptr + pos[:, None] * stride_cs_p
    sin_rows = sin_ptr + pos[:, None] * stride_cs_p

    if pid_h < H:
        src = tl.multiple_of(offs_t * stride_q_t + pid_h * stride_q_h, VEC)  # [BLOCK_T] row starts
        dst = tl.multiple_of(offs_t * stride_qo_t + pid_h * stride_qo_h, VEC)
        src_r, dst_r = tl.multiple_of(src + (D - R), VEC), tl.multiple_of(dst + (D - R), VEC)
        q_y, q_r = _norm_rope_tile(q_ptr + src[:, None], q_ptr + src_r[:, None], q_w_ptr, cos_rows, sin_rows,
                                   offs_d, offs_r, mask, mask_r, D, R, eps, HAS_W=HAS_Q_WEIGHT, BLOCK_T=BLOCK_T,
                                   BLOCK_R=BLOCK_R, IS_NEOX=IS_NEOX, PARTNER_IN_REGS=PARTNER_IN_REGS)
        tl.store(q_out_ptr + dst[:, None] + offs_d[None, :], q_y.to(q_out_ptr.dtype.element_ty), mask=nope_mask)
        tl.store(q_out_ptr + dst_r[:, None] + offs_r[None, :], q_r.to(q_out_ptr.dtype.element_ty), mask=mask_r)
    else:
        if HAS_STORE or PAGED_FP8_STORE:  # loaded first: its latency overlaps the row's (T 1 decode)
            slot_in = tl.load(loc_ptr + offs_t, mask=mask_t, other=-1).to(tl.int64)
        src = tl.multiple_of(offs_t * stride_kv_t, VEC)
        dst = tl.multiple_of(offs_t * stride_kvo_t, VEC)
        src_r, dst_r = tl.multiple_of(src + (D - R), VEC), tl.multiple_of(dst + (D - R), VEC)
        kv_y, kv_r = _norm_rope_tile(kv_ptr + src[:, None], kv_ptr + src_r[:, None], kv_w_ptr, cos_rows, sin_rows,
                                     offs_d, offs_r, mask, mask_r, D, R, eps, HAS_W=True, BLOCK_T=BLOCK_T,
                                     BLOCK_R=BLOCK_R, IS_NEOX=IS_NEOX, PARTNER_IN_REGS=PARTNER_IN_REGS)
        kv_y = kv_y.to(kv_out_ptr.dtype.element_ty)
        kv_r = kv_r.to(kv_out_ptr.dtype.element_ty)
        tl.store(kv_out_ptr + dst[:, None] + offs_d[None, :], kv_y, mask=nope_mask)
        tl.store(kv_out_ptr + dst_r[:, None] + offs_r[None, :], kv_r, mask=mask_r)
        keep = mask_t  # rows the store may write
        if CHECK_VALUES:
            keep = _check_values(flag_ptr, pos_in, pos_ok, loc_ptr, offs_t, mask_t, T, n_pos, n_slots,
                                 HAS_SLOTS=HAS_STORE or PAGED_FP8_STORE, BLOCK_S=BLOCK_S)
        if HAS_STORE:
            slot = tl.where(keep & (slot_in < n_slots), slot_in, -1)  # past the ring (unchecked input): skipped
            ring_row = tl.multiple_of(slot * stride_ring_s, VEC)  # padding rows (-1): masked off
            ring_r = tl.multiple_of(ring_row + (D - R), VEC)
            tl.store(ring_ptr + ring_row[:, None] + offs_d[None, :], kv_y, mask=nope_mask & (slot >= 0)[:, None])
            tl.store(ring_ptr + ring_r[:, None] + offs_r[None, :], kv_r, mask=mask_r & (slot >= 0)[:, None])
        if PAGED_FP8_STORE:
            _paged_fp8_store(kv_y, kv_r, pool_ptr, pool_fp8_ptr, slot_in, offs_d, offs_r, keep,
                             stride_pool_p, page_size, n_slots, D, R, FP8_MAX=FP8_MAX, AMAX_FLOOR=AMAX_FLOOR)
