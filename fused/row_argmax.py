"""The vocabulary argmax of one logits row in one program, as a ``triton.jit`` function a kernel
inlines (``fused.verify_tree_accept.wrapper``: it reads only the rows on the accepted path; the
chain kernel ``fused.verify_accept`` splits each row over programs instead).

The rule is ``reference.verify_accept.chain``'s (torch.argmax): values compare as real numbers
after the exact bf16 -> fp32 upcast (−0 == +0), the lowest index wins among equal maxima, NaN
(either sign, any payload) is above every number and the first NaN wins, a row of −inf gives 0.
The row is scanned in BLOCK_V chunks; each lane keeps the best (value, NaN, index) it has seen —
lanes see indices in increasing order, so an equal value keeps the lower one — then the lanes
reduce under the same rule.
"""
from __future__ import annotations

import triton
import triton.language as tl

SENTINEL = tl.constexpr(2 ** 31 - 1)  # an index no row has: lanes that saw no element (constexpr: the compiler reads no other global)


@triton.jit
def row_argmax(
    row_ptr,  # the row's first element (bf16, unit stride)
    V,  # vocabulary
    active,  # scalar bool: False reads nothing and gives SENTINEL
    BLOCK_V: tl.constexpr,  # vocabulary entries per chunk and lane count
    NUM_STAGES: tl.constexpr,  # software-pipelined chunk loads in flight (compiled; the interpreter ignores it)
):
    """-> int32 scalar: the row's argmax (SENTINEL when not ``active``)."""
    offs = tl.arange(0, BLOCK_V)
    best_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_nan = tl.zeros([BLOCK_V], dtype=tl.int1)
    best_i = tl.full([BLOCK_V], SENTINEL, tl.int32)
    # later chunks' loads are issued while this one reduces
    for c in tl.range(0, tl.where(active, tl.cdiv(V, BLOCK_V), 0), num_stages=NUM_STAGES):
        idx = c * BLOCK_V + offs
        valid = idx < V
        x = tl.load(row_ptr + idx, mask=valid, other=float("-inf")).to(tl.float32)  # bf16 -> fp32: exact
        x_nan = x != x
        # strictly better: an equal value keeps the lower index
        better = valid & ((best_i == SENTINEL) | (x_nan & ~best_nan) | (~x_nan & ~best_nan & (x > best_v)))
        best_v = tl.where(better, x, best_v)
        best_nan = tl.where(better, x_nan, best_nan)
        best_i = tl.where(better, idx, best_i)
    any_nan = tl.max(best_nan.to(tl.int32), axis=0) > 0
    v_max = tl.max(tl.where(best_nan, float("-inf"), best_v), axis=0)
    cand = tl.where(any_nan, best_nan, (best_v == v_max) & ~best_nan & (best_i != SENTINEL))
    return tl.min(tl.where(cand, best_i, SENTINEL), axis=0)
