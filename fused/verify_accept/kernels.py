"""The two launches of fused greedy chain acceptance: a split-V argmax, then the combine and the walk.

Launch 1, ``verify_accept_partial_kernel``, grid ``(B·(L + 1), n_chunks)``: program (r, c) takes row
j = r mod (L + 1) of request b = r div (L + 1) and the c-th ``chunk_len`` columns of it, scans them in
BLOCK_V tiles through the row stride (an LM head's output sliced to the vocabulary has stride > V),
keeping per lane the best (value, index) seen, and writes the chunk's best: its maximum (NaN when the
chunk holds a NaN) and the lowest index that has it (the first NaN). A padding request's programs
read nothing and write nothing.

Launch 2, ``verify_accept_combine_kernel``, grid ``(B,)``: program b loads the (L + 1) × n_chunks
partials of request b as one tile, reduces each row's chunks under the same rule, and takes the
acceptance walk at once: accept_length = the first row j < L whose token differs from draft j (L
when none does), the ids are the row tokens up to it (equal to the drafts before it, the bonus at
it) and −1 after. A padding request reads no partial and writes −1 and length 0.

The argmax rule, the chain's (``reference.verify_accept.chain``): values compare as fp32 after the
exact bf16 upcast (−0 == +0); NaN (any sign or payload) is above every number, +inf included; among
equal maxima, and among NaNs, the lowest index wins. ``_best_of_lanes`` is that rule over a set of
lanes, and both launches use it: over a tile's lanes in launch 1 (each lane holds the best of the
indices it saw, in increasing order, so an equal later value never replaces it), over a row's chunks
in launch 2 (chunk c covers lower indices than chunk c + 1, and each partial already holds its
chunk's lowest index of the maximum: the lowest chunk index among the equal partial maxima is the
row's lowest index). A row of all −inf gives 0: every valid lane's first element is its best.

The partials live in a workspace the wrapper allocates per call: launch 1 writes every partial of
every real request's rows and launch 2 reads only those, so nothing needs zeroing and nothing
survives a call (an aborted call leaves no state; a CUDA graph captures both launches and the
allocation). Every output element has one writer: exact and bitwise deterministic.
"""
from __future__ import annotations

import triton
import triton.language as tl

from fused.device_checks import DRAFT, QO_ROWS, QO_SIZE, QO_START, note

SENTINEL = tl.constexpr(2 ** 31 - 1)  # an index no row has: lanes that saw no element (constexpr: the compiler reads no other global)


@triton.jit
def _better(x, x_nan, idx, valid, best_v, best_nan, best_i):
    """Per lane: does (x, idx) replace the lane's best, seen at lower indices? Strictly better only
    (an equal value keeps the lower index); a NaN replaces any number; nothing replaces a NaN."""
    return valid & ((best_i == SENTINEL) | (x_nan & ~best_nan) | (~x_nan & ~best_nan & (x > best_v)))


@triton.jit
def _best_of_lanes(best_v, best_nan, best_i, AXIS: tl.constexpr):
    """The rule over lanes along ``AXIS``: (any NaN, the largest non-NaN value, the winning index).
    Lanes with index SENTINEL saw nothing and never win."""
    any_nan = tl.max(best_nan.to(tl.int32), axis=AXIS, keep_dims=True) > 0
    v_max = tl.max(tl.where(best_nan, float("-inf"), best_v), axis=AXIS, keep_dims=True)
    cand = tl.where(any_nan, best_nan, (best_v == v_max) & ~best_nan & (best_i != SENTINEL))
    tok = tl.min(tl.where(cand, best_i, SENTINEL), axis=AXIS)
    return tl.max(any_nan.to(tl.int32), axis=AXIS) > 0, tl.max(v_max, axis=AXIS), tok


# V, chunk_len and stride_row stay specialized (Triton compiles a variant per divisibility by 16, not per value):
# the row's tile loads are 16-byte vectors only when the compiler knows them aligned. Unspecialized, every
# bf16 element was a 2-byte load of its own (the PTX of sm90: 16 `ld.global.b16` per tile instead of `cp.async`;
# tests/test_vector_loads.py)
@triton.jit
def _rows_ok(start, end, L, n_logit_rows):
    """checked="device": request [start, end) is a real one whose L + 1 rows lie in target_logits."""
    return (end - start == L + 1) & (start >= 0) & (end <= n_logit_rows)


@triton.jit(do_not_specialize=["L", "n_chunks"])  # one compile per layout, not per batch
def verify_accept_partial_kernel(
    part_v_ptr,  # (B·(L + 1), n_chunks) fp32 out: each chunk's maximum, NaN when the chunk holds one
    part_i_ptr,  # (B·(L + 1), n_chunks) int32 out: the chunk's lowest index of that maximum (first NaN)
    logits_ptr,  # (N, V) bf16, unit stride on the last axis, rows stride_row apart
    qo_ptr,  # (B + 1,) int32/int64: request b's rows start at qo[b]; qo[b + 1] == qo[b]: padding
    V,  # vocabulary
    L,  # drafts per request (L + 1 rows)
    chunk_len,  # columns per program, a multiple of BLOCK_V
    n_chunks,  # programs per row: cdiv(V, chunk_len)
    stride_row,  # elements between target rows (>= V)
    BLOCK_V: tl.constexpr,  # columns per tile and lane count
    NUM_STAGES: tl.constexpr,  # software-pipelined tile loads in flight (compiled; the interpreter ignores it)
    n_logit_rows=0,  # rows of target_logits (read when CHECK_VALUES)
    CHECK_VALUES: tl.constexpr = False,  # checked="device": a request whose rows are not its own reads nothing
):
    """Launch 1 (module docstring): the best (value, index) of one chunk of one row."""
    r = tl.program_id(0).to(tl.int64)  # b·(L + 1) + j
    c = tl.program_id(1)
    b = r // (L + 1)
    j = r - b * (L + 1)
    start = tl.load(qo_ptr + b).to(tl.int64)
    end = tl.load(qo_ptr + b + 1).to(tl.int64)
    if CHECK_VALUES:
        real = _rows_ok(start, end, L, n_logit_rows)
    else:
        real = end > start  # padding requests read no row
    row = logits_ptr + (start + j) * stride_row
    lo = c * chunk_len
    offs = tl.arange(0, BLOCK_V)
    best_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_nan = tl.zeros([BLOCK_V], dtype=tl.int1)
    best_i = tl.full([BLOCK_V], SENTINEL, tl.int32)
    n_tiles = tl.cdiv(tl.minimum(V - lo, chunk_len), BLOCK_V)
    for t in tl.range(0, tl.where(real, n_tiles, 0), num_stages=NUM_STAGES):
        idx = lo + t * BLOCK_V + offs
        valid = idx < V
        x = tl.load(row + idx, mask=valid, other=float("-inf")).to(tl.float32)  # bf16 -> fp32: exact
        x_nan = x != x
        better = _better(x, x_nan, idx, valid, best_v, best_nan, best_i)
        best_v = tl.where(better, x, best_v)
        best_nan = tl.where(better, x_nan, best_nan)
        best_i = tl.where(better, idx, best_i)
    any_nan, v_max, tok = _best_of_lanes(best_v, best_nan, best_i, 0)
    slot = r * n_chunks + c
    tl.store(part_v_ptr + slot, tl.where(any_nan, float("nan"), v_max), mask=real)
    tl.store(part_i_ptr + slot, tok, mask=real)


@triton.jit(do_not_specialize=["L", "n_chunks", "stride_out"])
def verify_accept_combine_kernel(
    out_ptr,  # (B, L + 1) int32 out: accepted drafts, the bonus token, then -1
    len_ptr,  # (B,) int32 out: accepted drafts
    part_v_ptr,  # (B·(L + 1), n_chunks) fp32: launch 1's chunk maxima
    part_i_ptr,  # (B·(L + 1), n_chunks) int32: launch 1's chunk indices
    draft_ptr,  # (B·L,) int32/int64 drafts
    qo_ptr,  # (B + 1,) int32/int64 (as launch 1's)
    L,  # drafts per request
    n_chunks,  # partials per row
    stride_out,  # elements between output rows (L + 1)
    BLOCK_L: tl.constexpr,  # rows per request, padded: next_power_of_2(L + 1)
    BLOCK_C: tl.constexpr,  # chunks per row, padded: next_power_of_2(n_chunks)
    flag_ptr=None,  # (FLAG_WORDS,) int64 error record of fused.device_checks, written when CHECK_VALUES
    n_logit_rows=0,  # rows of target_logits (read when CHECK_VALUES)
    V=0,  # vocabulary (read when CHECK_VALUES)
    CHECK_VALUES: tl.constexpr = False,  # checked="device": qo_indptr and the drafts checked here
):
    """Launch 2 (module docstring): request b's row tokens from the partials, then the walk."""
    b = tl.program_id(0).to(tl.int64)
    start = tl.load(qo_ptr + b).to(tl.int64)
    end = tl.load(qo_ptr + b + 1).to(tl.int64)
    if CHECK_VALUES:  # the host check's rules (reference.verify_accept.chain.validate), request b's part
        real = _rows_ok(start, end, L, n_logit_rows)
        size = end - start
        sized = (size == 0) | (size == L + 1)
        note(flag_ptr, QO_START, (b == 0) & (start != 0), start, 0, 0, 0)
        note(flag_ptr, QO_SIZE, ~sized, b, size, L + 1, 0)
        note(flag_ptr, QO_ROWS, sized & (size > 0) & ~real, b, start, end, n_logit_rows)
    else:
        real = end > start
    n_rows = tl.where(real, L + 1, 0)  # padding: no partial or draft read, all -1, length 0
    rows = tl.arange(0, BLOCK_L)
    chunks = tl.arange(0, BLOCK_C)
    tile = (rows < n_rows)[:, None] & (chunks < n_chunks)[None, :]
    slot = (b * (L + 1) + rows)[:, None] * n_chunks + chunks[None, :]
    v = tl.load(part_v_ptr + slot, mask=tile, other=float("-inf"))
    i = tl.load(part_i_ptr + slot, mask=tile, other=SENTINEL)
    _, _, tok = _best_of_lanes(v, v != v, i, 1)  # (BLOCK_L,) the row tokens; SENTINEL off the tile
    is_draft = rows < n_rows - 1
    d = tl.load(draft_ptr + b * L + rows, mask=is_draft, other=-1).to(tl.int64)
    if CHECK_VALUES:  # a draft outside [0, V) never equals a row token: the walk stops at it
        bad_d = is_draft & ((d < 0) | (d >= V))
        first = tl.min(tl.where(bad_d, rows, BLOCK_L), axis=0)
        note(flag_ptr, DRAFT, first < BLOCK_L, tl.max(tl.where(rows == first, d, -(2 ** 62)), axis=0), V, 0, 0)
    stop = ~is_draft | (tok.to(tl.int64) != d)  # the walk ends at the first mismatch, or at row L
    n_acc = tl.min(tl.where(stop, rows, BLOCK_L), axis=0)  # padding: 0
    ids = tl.where((rows <= n_acc) & (rows < n_rows), tok, -1)  # before n_acc the token is the draft
    tl.store(out_ptr + b * stride_out + rows, ids, mask=rows < L + 1)
    tl.store(len_ptr + b, n_acc)
