"""Fused greedy chain acceptance: the vocabulary argmax of every target row and the acceptance
walk of every request in one launch.

Grid ``(B,)``: program ``b`` owns request ``b``. It walks the request's rows j = 0..L in order;
for each it scans the row in BLOCK_V chunks through the row stride (an LM head's output sliced
to the vocabulary has stride > V), keeping per lane the best (value, index) seen, then reduces
the lanes to the row's argmax under the chain's rule (``reference.verify_accept.chain``): NaN above
every number, the lowest index among equal maxima, −0 == +0. It stores the token into
``output_ids[b, j]`` and compares it with draft j; the first mismatch (or row L) ends the walk:
that row's token is the bonus, the rest of the row is −1, and the rows after it are never read
(the chain computes them and throws them away). A padding request (0 rows) reads nothing and
writes −1 and length 0. Every output element is written by exactly one program; no scratch,
no atomics, so the result is exact and bitwise deterministic.

Why one program per request and not a split of the vocabulary over programs: a split needs a
second phase that combines the partial argmaxes, i.e. a zeroed workspace (a memset: a second
launch) or a workspace the kernel re-zeroes itself (state that survives the call and breaks on
an aborted one). One program per request keeps one launch with nothing between calls; it uses
B programs, so at B = 1 one SM streams the (L + 1)·V logits, and each program's bandwidth is
set by the chunk loads it keeps in flight (wide chunks, ``tl.range`` pipelining;
``cases/verify_accept/bench.py`` measures what that costs against a copy).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from fused.compile_specs import variant
from fused.row_argmax import row_argmax
from reference.verify_accept import chain as ref
from reference.checks import values_checked


@triton.jit(do_not_specialize=["V", "L", "stride_row"])  # one compile per layout, not per vocabulary or L
def verify_accept_kernel(
    out_ptr,  # (B, L + 1) int32 out: accepted drafts, the bonus token, then -1
    len_ptr,  # (B,) int32 out: accepted drafts
    logits_ptr,  # (N, V) bf16, unit stride on the last axis, rows stride_row apart
    draft_ptr,  # (B * L,) int32/int64 drafts
    qo_ptr,  # (B + 1,) int32/int64: request b's rows start at qo[b]; qo[b + 1] == qo[b]: padding
    V,  # vocabulary
    L,  # drafts per request
    stride_row,  # elements between target rows (>= V)
    stride_out,  # elements between output rows (L + 1)
    BLOCK_V: tl.constexpr,  # vocabulary entries per chunk and lane count
    NUM_STAGES: tl.constexpr,  # software-pipelined chunk loads in flight (compiled; the interpreter ignores it)
):
    """The op's one launch (module docstring): program b, request b's argmax rows and acceptance walk."""
    b = tl.program_id(0)
    start = tl.load(qo_ptr + b).to(tl.int64)
    end = tl.load(qo_ptr + b + 1).to(tl.int64)
    accepting = end > start  # padding requests never accept and never read a row
    n_acc = b * 0  # int32 scalar
    for j in range(0, L + 1):
        # rows after the walk ended are not read (``active`` False)
        tok = row_argmax(logits_ptr + (start + j) * stride_row, V, accepting, BLOCK_V=BLOCK_V, NUM_STAGES=NUM_STAGES)
        tl.store(out_ptr + b.to(tl.int64) * stride_out + j, tl.where(accepting, tok, -1))
        is_draft = j < L
        d = tl.load(draft_ptr + b.to(tl.int64) * L + j, mask=accepting & is_draft, other=-1).to(tl.int64)
        accepting = accepting & is_draft & (tok.to(tl.int64) == d)
        n_acc += accepting.to(tl.int32)
    tl.store(len_ptr + b, n_acc)


def block_config(interpreted: bool) -> tuple[int, int, int]:
    """(BLOCK_V, num_warps, num_stages). The interpreter pays per op, hardly per element: wide
    chunks (catalog cases have V one past and one short of 4096). Compiled: one program streams a
    whole request, so its loads in flight set its bandwidth: 8192 bf16 per chunk over 256 threads
    (32 contiguous elements, four 16-byte loads, per thread; ~130 registers for the lanes' running
    bests) and 3 chunks in flight. Not tuned on a GPU yet: ``cases/verify_accept/bench.py``."""
    return (4096, 1, 1) if interpreted else (8192, 8, 3)


def launch(*, output_ids, accept_length, target_logits, draft_tokens, qo_indptr, stride_row: int | None = None
           ) -> None:
    """The one launch. Arguments already validated. ``stride_row``: the row stride the kernel is
    told (default: the tensor's own)."""
    B, Lp1 = output_ids.shape
    block_v, num_warps, num_stages = block_config(os.environ.get("TRITON_INTERPRET") == "1")
    verify_accept_kernel[(B,)](
        out_ptr=output_ids, len_ptr=accept_length, logits_ptr=target_logits, draft_ptr=draft_tokens,
        qo_ptr=qo_indptr, V=target_logits.shape[1], L=Lp1 - 1,
        stride_row=target_logits.stride(0) if stride_row is None else stride_row, stride_out=output_ids.stride(0),
        BLOCK_V=block_v, NUM_STAGES=num_stages, num_warps=num_warps,
    )


def verify_accept(*, target_logits, draft_tokens, qo_indptr, checked=None):
    """Same contract as ``reference.verify_accept.chain.verify_accept``, in one launch.

    Shapes: target_logits (N, V) bf16, any row stride with a unit innermost one; draft_tokens
    (B·L,) int; qo_indptr (B + 1,) int, each request L + 1 rows or 0 (padding).
    Returns {"output_ids": (B, L + 1) int32, "accept_length": (B,) int32}.

    Checks: shapes, dtypes, strides and devices on every call (no sync); ``checked`` (None:
    ``VP_CHECK_VALUES``, on by default; see ``reference.checks``): also the values of qo_indptr
    and of the real requests' drafts, one host sync. ``checked=False``: the caller guarantees
    them (a bad qo_indptr is then read past target_logits) and nothing waits on the device.
    """
    B, L, V = ref.validate(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr,
                           check_values=values_checked(checked))
    dev = target_logits.device
    out = torch.empty((B, L + 1), dtype=ref.OUT_DTYPE, device=dev)
    n = torch.empty((B,), dtype=ref.OUT_DTYPE, device=dev)
    launch(output_ids=out, accept_length=n, target_logits=target_logits, draft_tokens=draft_tokens,
           qo_indptr=qo_indptr)
    return {"output_ids": out, "accept_length": n}


def compile_specs():
    """Signatures for the ahead-of-time compile check (``python -m harness compile``): both index
    dtypes of the drafts and of qo_indptr (the kernel's own arguments: ``fused.compile_specs``)."""
    block_v, warps, stages = block_config(interpreted=False)
    return [variant(f"draft={draft_sig[1:]},qo={qo_sig[1:]}", verify_accept_kernel,
                    {"out_ptr": "*i32", "len_ptr": "*i32", "logits_ptr": "*bf16", "draft_ptr": draft_sig,
                     "qo_ptr": qo_sig}, {"BLOCK_V": block_v, "NUM_STAGES": stages}, warps)
            for draft_sig in ("*i32", "*i64") for qo_sig in ("*i32", "*i64")]
