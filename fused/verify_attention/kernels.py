"""Triton kernels of ``verify_attention`` (seeds 002, 003). One source of truth for the math:
``_attend_tile`` (one online-softmax step over a tile of keys) is the only place where scores,
masks, exponentials and the P·V product are computed; every kernel below calls it.

  verify_prefix_kernel   grid (B, H / BLOCK_H, S): BLOCK_H heads × L_PAD drafts per program
                         share each KV tile (BLOCK_H·L_PAD ≥ 16 rows): the shared-KV kernel;
                         at BLOCK_H = 1 (one query head × L drafts per program, rows padded to
                         L_PAD ≥ 16, the prefix re-read for every head) the per-head split-KV one.
  verify_combine_kernel  grid (B, H / BLOCK_H): the draft triangle (unscaled, causal or not)
                         then a log-sum-exp merge of the S prefix partials.

Rows are head-major: row r is head ``head_start + r // L_PAD``, draft ``r % L_PAD``; rows with
draft index ≥ L are padding (q = 0, never stored). Loaded bf16/fp8 values go to the dots as
bf16 (fp8 e4m3 converts exactly); everything else is fp32. P·V uses P = P_hi + P_lo, two bf16
dots with fp32 accumulation, i.e. ~16 mantissa bits of P (a single bf16 P would cost up to
half a bf16 ulp per weight — more than the exact-fp32 tolerance). ``SINGLE_P_DOT`` (the shared-KV
prefix, BLOCK_H > 1, and the combine kernel) makes that one dot with P rounded to bf16, the FlashAttention
design: precision class ``bf16-p`` (harness.tolerance), one tensor-core product instead of two.

``CHECK_VALUES`` (``checked="device"``, ``fused.device_checks``): the prefix programs check the
kv_indptr entries and the slots they read (a request whose slots are not inside kv_indices reads
none: an empty prefix; a slot outside the pool is no key), the combine programs qo_indptr (a bad
request's rows are still b·L + i: the kernels never index through qo_indptr); each breach is
noted in the device's error record.
"""
from __future__ import annotations

import triton
import triton.language as tl

from fused.device_checks import ATT_KV_INDICES, ATT_KV_INDPTR, ATT_QO_EMPTY, ATT_QO_RISE, ATT_QO_WIDTH, note


@triton.jit
def _load_q_rows(
    q_ptr,  # (T, H, D) bf16
    row_tok,  # [R] int64 token index of each row
    row_head,  # [R] query head of each row
    row_mask,  # [R] real (non-padding) row
    stride_q_t, stride_q_h,
    offs_dn,  # [BLOCK_DN]
    offs_dp,  # [BLOCK_DPE]
    NOPE_DIM: tl.constexpr,  # dims dotted with the nope/latent part (GQA: all of D)
    PE_DIM: tl.constexpr,  # rope dims after NOPE_DIM (MLA 64, GQA 0)
    R: tl.constexpr,
    BLOCK_DPE: tl.constexpr,
):
    base = row_tok * stride_q_t + row_head * stride_q_h  # [R] int64
    q_nope = tl.load(q_ptr + base[:, None] + offs_dn[None, :],
                     mask=row_mask[:, None] & (offs_dn[None, :] < NOPE_DIM), other=0.0).to(tl.bfloat16)
    if PE_DIM > 0:
        q_pe = tl.load(q_ptr + base[:, None] + (NOPE_DIM + offs_dp)[None, :],
                       mask=row_mask[:, None] & (offs_dp[None, :] < PE_DIM), other=0.0).to(tl.bfloat16)
    else:
        q_pe = tl.zeros([R, BLOCK_DPE], dtype=tl.bfloat16)
    return q_nope, q_pe


@triton.jit
def _attend_tile(
    q_nope, q_pe,  # [R, BLOCK_DN], [R, BLOCK_DPE] bf16
    k_ptr, v_ptr,  # key / value base pointers
    k_off, v_off,  # [BLOCK_N] int64 element offset of each key's row (head offset included)
    key_mask,  # [BLOCK_N] key exists
    score_mask,  # [R, BLOCK_N] or [1, BLOCK_N]: row may see key (causal rule etc.)
    scale,  # fp32 multiplier of q·k (sm_scale·k_scale on the prefix, sm_scale on drafts)
    m, l, acc,  # running max [R], sum [R], accumulator [R, BLOCK_DV] (fp32)
    offs_dn, offs_dp, offs_dv,
    NOPE_DIM: tl.constexpr, PE_DIM: tl.constexpr, DV: tl.constexpr,
    SINGLE_P_DOT: tl.constexpr,  # P·V as one dot of bf16(P) (class bf16-p), else P_hi + P_lo
):
    k_nope = tl.load(k_ptr + k_off[None, :] + offs_dn[:, None],
                     mask=(offs_dn[:, None] < NOPE_DIM) & key_mask[None, :], other=0.0).to(tl.bfloat16)
    s = tl.dot(q_nope, k_nope)  # [R, BLOCK_N] fp32; bf16 products are exact
    if PE_DIM > 0:
        k_pe = tl.load(k_ptr + k_off[None, :] + (NOPE_DIM + offs_dp)[:, None],
                       mask=(offs_dp[:, None] < PE_DIM) & key_mask[None, :], other=0.0).to(tl.bfloat16)
        s += tl.dot(q_pe, k_pe)
    s = tl.where(score_mask & key_mask[None, :], s * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    alpha = tl.exp(m - m_use)
    p = tl.exp(s - m_use[:, None])  # [R, BLOCK_N] fp32
    v = tl.load(v_ptr + v_off[:, None] + offs_dv[None, :],
                mask=key_mask[:, None] & (offs_dv[None, :] < DV), other=0.0).to(tl.bfloat16)
    p_hi = p.to(tl.bfloat16)
    if SINGLE_P_DOT:
        acc = acc * alpha[:, None] + tl.dot(p_hi, v)
    else:
        p_lo = (p - p_hi.to(tl.float32)).to(tl.bfloat16)
        acc = acc * alpha[:, None] + tl.dot(p_hi, v) + tl.dot(p_lo, v)
    l = l * alpha + tl.sum(p, 1)  # the unrounded p either way
    return m_new, l, acc


@triton.jit
def _prefix_partial(
    q_nope, q_pe,
    k_buffer_ptr, v_buffer_ptr, kv_indices_ptr,
    kv_start,  # offset of this request's slots in kv_indices
    n_lo, n_hi,  # [n_lo, n_hi): this split of the prefix
    k_head_off, v_head_off,  # KV-head offset into the buffers
    stride_kb_s, stride_vb_s,
    scale, v_scale,
    offs_dn, offs_dp, offs_dv,
    R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
    NOPE_DIM: tl.constexpr, PE_DIM: tl.constexpr, DV: tl.constexpr, SINGLE_P_DOT: tl.constexpr,
    flag_ptr, pool_rows,  # CHECK_VALUES: the error record, and the pool's rows (a slot's bound)
    CHECK_VALUES: tl.constexpr,
):
    m = tl.full([R], float("-inf"), dtype=tl.float32)
    l = tl.zeros([R], dtype=tl.float32)
    acc = tl.zeros([R, BLOCK_DV], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    all_rows = tl.full([1, BLOCK_N], 1, dtype=tl.int1)  # the prefix is fully visible
    for start in range(n_lo, n_hi, BLOCK_N):
        key_mask = start + offs_n < n_hi  # the last tile may be partial
        slot = tl.load(kv_indices_ptr + kv_start + start + offs_n, mask=key_mask, other=0).to(tl.int64)
        if CHECK_VALUES:  # a slot outside the pool is no key: never read
            bad = key_mask & ((slot < 0) | (slot >= pool_rows))
            key_mask = key_mask & ~bad
            first = tl.min(tl.where(bad, offs_n, BLOCK_N), axis=0)
            note(flag_ptr, ATT_KV_INDICES, first < BLOCK_N,
                 tl.max(tl.where(offs_n == first, slot, -(2 ** 62)), axis=0), pool_rows, 0, 0)
        m, l, acc = _attend_tile(q_nope, q_pe, k_buffer_ptr, v_buffer_ptr,
                                 slot * stride_kb_s + k_head_off, slot * stride_vb_s + v_head_off,
                                 key_mask, all_rows, scale, m, l, acc, offs_dn, offs_dp, offs_dv,
                                 NOPE_DIM=NOPE_DIM, PE_DIM=PE_DIM, DV=DV, SINGLE_P_DOT=SINGLE_P_DOT)
    return m, l, acc * v_scale


@triton.jit
def _head_block_rows(b, head_start, L, H, BLOCK_H: tl.constexpr, L_PAD: tl.constexpr):
    """The BLOCK_H·L_PAD rows of a head block, head-major: each row's draft index, query head,
    whether it is real (draft < L, head < H) and its token index b·L + draft (int64: b is)."""
    offs_r = tl.arange(0, BLOCK_H * L_PAD)
    row_l = offs_r % L_PAD
    row_head = head_start + offs_r // L_PAD
    row_mask = (row_l < L) & (row_head < H)
    return row_l, row_head, row_mask, b * L + row_l


@triton.jit
def _split_bounds(kv_indptr_ptr, b, split, num_kv_splits, flag_ptr, n_kv_indices, CHECK_VALUES: tl.constexpr):
    """This request's slot offset and the [lo, hi) of this split (cdiv partition, as the reference).
    ``CHECK_VALUES``: kv_indptr's rule (``reference.verify_attention.chain.validate``) at request b's
    two entries, noted; a request whose slots are not inside kv_indices gets none (n = 0)."""
    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    kv_end = tl.load(kv_indptr_ptr + b + 1).to(tl.int64)
    if CHECK_VALUES:
        outside = (kv_start < 0) | (kv_end < kv_start) | (kv_end > n_kv_indices)
        note(flag_ptr, ATT_KV_INDPTR, outside | ((b == 0) & (kv_start != 0)), b, kv_start, kv_end, n_kv_indices)
        kv_end = tl.where(outside, kv_start, kv_end)
    n = kv_end - kv_start
    split_len = tl.cdiv(n, num_kv_splits)
    lo = tl.minimum(split * split_len, n)
    hi = tl.minimum(lo + split_len, n)
    return kv_start, lo, hi


@triton.jit
def _store_partial(mid_acc_ptr, mid_ml_ptr, row_tok, row_head, row_mask, split, H, num_kv_splits,
                   m, l, acc, offs_dv, DV: tl.constexpr):
    """mid_ml (T, H, S, 2) fp32 = (m, l); mid_acc (T, H, S, DV) fp32."""
    cell = (row_tok * H + row_head) * num_kv_splits + split  # [R] int64
    tl.store(mid_ml_ptr + cell * 2, m, mask=row_mask)
    tl.store(mid_ml_ptr + cell * 2 + 1, l, mask=row_mask)
    tl.store(mid_acc_ptr + cell[:, None] * DV + offs_dv[None, :], acc,
             mask=row_mask[:, None] & (offs_dv[None, :] < DV))


@triton.jit(do_not_specialize=["L", "H", "num_kv_splits", "kv_group_num"])  # one compile per layout, not
# per batch shape or head grouping
def verify_prefix_kernel(
    mid_acc_ptr,  # (T, H, S, DV) fp32 out: v_scale·Σ p·v per split
    mid_ml_ptr,  # (T, H, S, 2) fp32 out: (max, sum) per split
    q_ptr,  # (T, H, D) bf16
    k_buffer_ptr, v_buffer_ptr,  # (S_pool, Hkv, D), (S_pool, Hkv, DV) bf16 / fp8
    kv_indptr_ptr,  # (B+1,) int
    kv_indices_ptr,  # (N,) int pool slots of the prefixes
    L,  # verify width (uniform)
    H,  # num_heads
    num_kv_splits,
    scale,  # sm_scale·k_scale
    v_scale,
    stride_q_t, stride_q_h,
    stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
    kv_group_num,  # H / Hkv; the wrapper guarantees kv_group_num % BLOCK_H == 0
    HAS_KV_HEADS: tl.constexpr,  # several KV heads (offset per head block) vs one (MLA / MQA)
    BLOCK_H: tl.constexpr,  # query heads per program, all on one KV head (1: the per-head split-KV kernel)
    L_PAD: tl.constexpr,  # drafts per head, padded: BLOCK_H·L_PAD ≥ 16 (tl.dot)
    BLOCK_N: tl.constexpr,
    NOPE_DIM: tl.constexpr, PE_DIM: tl.constexpr, DV: tl.constexpr,
    BLOCK_DN: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr,
    SINGLE_P_DOT: tl.constexpr,  # P·V as one bf16 dot (class bf16-p) instead of P_hi + P_lo
    flag_ptr=None,  # (FLAG_WORDS,) int64 error record of fused.device_checks, written when CHECK_VALUES
    n_kv_indices=0,  # len(kv_indices) (read when CHECK_VALUES)
    pool_rows=0,  # rows of k_buffer (read when CHECK_VALUES)
    CHECK_VALUES: tl.constexpr = False,  # checked="device": kv_indptr and the slots checked here
):
    """Launch 1 (module docstring): per (request, head block, split) the prefix partials (m, l, acc)."""
    b = tl.program_id(0).to(tl.int64)
    head_start = tl.program_id(1) * BLOCK_H
    split = tl.program_id(2)
    offs_dn = tl.arange(0, BLOCK_DN)
    offs_dp = tl.arange(0, BLOCK_DPE)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_l, row_head, row_mask, row_tok = _head_block_rows(b, head_start, L, H, BLOCK_H=BLOCK_H, L_PAD=L_PAD)
    kv_start, lo, hi = _split_bounds(kv_indptr_ptr, b, split, num_kv_splits, flag_ptr, n_kv_indices,
                                     CHECK_VALUES=CHECK_VALUES)
    if HAS_KV_HEADS:
        kv_head = head_start // kv_group_num  # seed 003: valid because BLOCK_H divides the group
    else:
        kv_head = 0
    q_nope, q_pe = _load_q_rows(q_ptr, row_tok, row_head, row_mask, stride_q_t, stride_q_h, offs_dn, offs_dp,
                                NOPE_DIM=NOPE_DIM, PE_DIM=PE_DIM, R=BLOCK_H * L_PAD, BLOCK_DPE=BLOCK_DPE)
    m, l, acc = _prefix_partial(q_nope, q_pe, k_buffer_ptr, v_buffer_ptr, kv_indices_ptr, kv_start, lo, hi,
                                kv_head * stride_kb_h, kv_head * stride_vb_h, stride_kb_s, stride_vb_s,
                                scale, v_scale, offs_dn, offs_dp, offs_dv,
                                R=BLOCK_H * L_PAD, BLOCK_N=BLOCK_N, BLOCK_DV=BLOCK_DV, NOPE_DIM=NOPE_DIM,
                                PE_DIM=PE_DIM, DV=DV, SINGLE_P_DOT=SINGLE_P_DOT, flag_ptr=flag_ptr,
                                pool_rows=pool_rows, CHECK_VALUES=CHECK_VALUES)
    _store_partial(mid_acc_ptr, mid_ml_ptr, row_tok, row_head, row_mask, split, H, num_kv_splits, m, l, acc,
                   offs_dv, DV=DV)


@triton.jit(do_not_specialize=["L", "H", "num_kv_splits", "kv_group_num"])  # one compile per layout, not
# per batch shape or head grouping
def verify_combine_kernel(
    o_ptr,  # (T, H, DV) bf16 out, contiguous
    mid_acc_ptr, mid_ml_ptr,  # partials of the prefix kernel
    q_ptr,  # (T, H, D) bf16
    k_ptr, v_ptr,  # drafts (T, Hkv, D), (T, Hkv, DV) bf16
    L, H, num_kv_splits,
    sm_scale,  # drafts: no k_scale / v_scale
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    kv_group_num,  # H / Hkv
    HAS_KV_HEADS: tl.constexpr,
    IS_CAUSAL: tl.constexpr,  # draft i sees drafts j ≤ i (else all L)
    BLOCK_H: tl.constexpr, L_PAD: tl.constexpr,
    L_KEYS: tl.constexpr,  # draft key tile: next_power_of_2(L), at least 16
    NOPE_DIM: tl.constexpr, PE_DIM: tl.constexpr, DV: tl.constexpr,
    BLOCK_DN: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr,
    SINGLE_P_DOT: tl.constexpr,  # the draft triangle's P·V as one bf16 dot (class bf16-p)
    flag_ptr=None,  # (FLAG_WORDS,) int64 error record of fused.device_checks, written when CHECK_VALUES
    qo_ptr=None,  # (B + 1,) int qo_indptr (read when CHECK_VALUES)
    CHECK_VALUES: tl.constexpr = False,  # checked="device": qo_indptr checked here
):
    """Launch 2 (module docstring): per (request, head block) the draft triangle, then the log-sum-exp merge."""
    b = tl.program_id(0).to(tl.int64)
    if CHECK_VALUES:  # qo_indptr's rules at request b's two entries (the host check's order), then the width
        start = tl.load(qo_ptr + b).to(tl.int64)
        end = tl.load(qo_ptr + b + 1).to(tl.int64)
        n_tok = tl.num_programs(0).to(tl.int64) * L
        last = b == tl.num_programs(0) - 1
        note(flag_ptr, ATT_QO_RISE, (end < start) | ((b == 0) & (start != 0)) | (last & (end != n_tok)),
             b, start, end, n_tok)
        note(flag_ptr, ATT_QO_EMPTY, end == start, b, start, end, 0)
        note(flag_ptr, ATT_QO_WIDTH, (start != b * L) | (end != b * L + L), b, start, end, L)
    head_start = tl.program_id(1) * BLOCK_H
    offs_dn = tl.arange(0, BLOCK_DN)
    offs_dp = tl.arange(0, BLOCK_DPE)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_j = tl.arange(0, L_KEYS)
    row_l, row_head, row_mask, row_tok = _head_block_rows(b, head_start, L, H, BLOCK_H=BLOCK_H, L_PAD=L_PAD)
    if HAS_KV_HEADS:
        kv_head = head_start // kv_group_num
    else:
        kv_head = 0
    q_nope, q_pe = _load_q_rows(q_ptr, row_tok, row_head, row_mask, stride_q_t, stride_q_h, offs_dn, offs_dp,
                                NOPE_DIM=NOPE_DIM, PE_DIM=PE_DIM, R=BLOCK_H * L_PAD, BLOCK_DPE=BLOCK_DPE)
    key_mask = offs_j < L  # padded draft keys never count (seed 002)
    if IS_CAUSAL:
        score_mask = offs_j[None, :] <= row_l[:, None]
    else:
        score_mask = tl.full([1, L_KEYS], 1, dtype=tl.int1)
    key_tok = b * L + offs_j
    m = tl.full([BLOCK_H * L_PAD], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_H * L_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H * L_PAD, BLOCK_DV], dtype=tl.float32)
    m, l, acc = _attend_tile(q_nope, q_pe, k_ptr, v_ptr,
                             key_tok * stride_k_t + kv_head * stride_k_h, key_tok * stride_v_t + kv_head * stride_v_h,
                             key_mask, score_mask, sm_scale, m, l, acc, offs_dn, offs_dp, offs_dv,
                             NOPE_DIM=NOPE_DIM, PE_DIM=PE_DIM, DV=DV, SINGLE_P_DOT=SINGLE_P_DOT)
    cell0 = (row_tok * H + row_head) * num_kv_splits  # [R] int64
    for s in range(0, num_kv_splits):
        m_s = tl.load(mid_ml_ptr + (cell0 + s) * 2, mask=row_mask, other=float("-inf"))
        l_s = tl.load(mid_ml_ptr + (cell0 + s) * 2 + 1, mask=row_mask, other=0.0)
        acc_s = tl.load(mid_acc_ptr + (cell0 + s)[:, None] * DV + offs_dv[None, :],
                        mask=row_mask[:, None] & (offs_dv[None, :] < DV), other=0.0)
        m_new = tl.maximum(m, m_s)  # finite: the draft part always has a key
        a = tl.exp(m - m_new)
        c = tl.exp(m_s - m_new)  # 0 for an empty split (m_s = -inf)
        l = l * a + l_s * c
        acc = acc * a[:, None] + acc_s * c[:, None]
        m = m_new
    out = acc / l[:, None]
    o_off = (row_tok * H + row_head) * DV
    tl.store(o_ptr + o_off[:, None] + offs_dv[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_mask[:, None] & (offs_dv[None, :] < DV))
