"""Fused greedy tree acceptance: the tree walk of every request and the vocabulary argmax of the
rows it visits, in one launch.

Grid ``(B,)``: program ``b`` owns request ``b``. It takes the argmax of the root's row
(``fused.row_argmax``: the chain's rule), then walks down: the root's first child, then its
next siblings, until a node whose draft token equals the current target token — the first in
list order; that node is accepted, its row's argmax is the next target token, and the walk goes
on from it, at most S − 1 times. When no child matches the walk ends and the last target token
is the bonus. Only the rows on the accepted path are read (at most S rows of the request's N;
the chain takes the argmax of all B·N and throws most away). The program keeps the request's
``accept_index`` row (BLOCK_S lanes) and its block of ``predicts`` (BLOCK_N lanes, indexed by
row − b·N) in registers and stores each once at the end: every output element has exactly one
writer and one store, so the result is exact and bitwise deterministic, with no scratch or
atomics. A padding request (``retrive_index[b, 0] < 0``) reads no other input and writes −1 and
length 0.

The sibling scan is bounded by N steps per level (pointers go forward, so a valid tree never
needs more; with ``checked=False`` and a cyclic layout the walk stops instead of hanging).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from fused import device_checks
from fused.compile_specs import variant
from fused.device_checks import (
    TREE_CANDIDATES,
    TREE_INDEX,
    TREE_NEXT_SIBLING,
    TREE_NEXT_TOKEN,
    TREE_TWO_PARENTS,
    note,
)
from fused.row_argmax import row_argmax
from reference.checks import value_check_mode
from reference.verify_tree_accept import chain as ref


@triton.jit
def _first(bad, offs_n, val, BLOCK_N: tl.constexpr):
    """(any lane bad, the first bad lane, its value)."""
    i = tl.min(tl.where(bad, offs_n, BLOCK_N), axis=0)
    return i < BLOCK_N, i, tl.max(tl.where(offs_n == i, val, -(2 ** 62)), axis=0)


@triton.jit
def _check_tree(flag_ptr, live, b, base, cand_ptr, index_ptr, next_token_ptr, next_sibling_ptr, V, N,
                BLOCK_N: tl.constexpr):
    """checked="device": the layout rules of ``reference.verify_tree_accept.chain.tree_faults`` over
    request b's whole block (a real request's), each rule's first breaking node recorded
    (``fused.device_checks``: TREE_CANDIDATES ...). Returns whether the request keeps every rule.
    The pairwise rules (a row twice, two incoming pointers) compare BLOCK_N x BLOCK_N lanes."""
    offs_n = tl.arange(0, BLOCK_N)
    m = offs_n < N
    c = tl.load(cand_ptr + base + offs_n, mask=m, other=0).to(tl.int64)
    ri = tl.load(index_ptr + base + offs_n, mask=m, other=0).to(tl.int64)
    nt = tl.load(next_token_ptr + base + offs_n, mask=m, other=-1).to(tl.int64)
    ns = tl.load(next_sibling_ptr + base + offs_n, mask=m, other=-1).to(tl.int64)
    m = m & (live | (offs_n < 0))  # padding requests (live False) are exempt
    bad_c = m & ((c < 0) | (c >= V))
    out_of_block = (ri < base) | (ri >= base + N)
    same = (ri[:, None] == ri[None, :]) & (offs_n[None, :] < offs_n[:, None]) & m[None, :]
    bad_ri = m & (out_of_block | (tl.max(same.to(tl.int32), axis=1) > 0))  # the later slot of a repeat
    bad_nt = m & (nt != -1) & ((nt <= offs_n) | (nt >= N))
    bad_ns = m & (ns != -1) & ((ns <= offs_n) | (ns >= N))
    into = ((nt[None, :] == offs_n[:, None]).to(tl.int32) + (ns[None, :] == offs_n[:, None]).to(tl.int32)) * \
        m[None, :].to(tl.int32)  # [j, i]: pointers of node i into node j
    indeg = tl.sum(into, axis=1)
    bad_in = m & (offs_n > 0) & (indeg > 1)
    hit, i, v = _first(bad_c, offs_n, c, BLOCK_N)
    note(flag_ptr, TREE_CANDIDATES, hit, b, i, v, V)
    ok = ~hit
    hit, i, v = _first(bad_ri, offs_n, ri, BLOCK_N)
    note(flag_ptr, TREE_INDEX, hit, b, i, v, N)
    ok = ok & ~hit
    hit, i, v = _first(bad_nt, offs_n, nt, BLOCK_N)
    note(flag_ptr, TREE_NEXT_TOKEN, hit, b, i, v, 0)
    ok = ok & ~hit
    hit, i, v = _first(bad_ns, offs_n, ns, BLOCK_N)
    note(flag_ptr, TREE_NEXT_SIBLING, hit, b, i, v, 0)
    ok = ok & ~hit
    hit, i, v = _first(bad_in, offs_n, indeg.to(tl.int64), BLOCK_N)
    note(flag_ptr, TREE_TWO_PARENTS, hit, b, i, v, 0)
    return ok & ~hit


# V and stride_row stay specialized (a variant per divisibility by 16): unspecialized, the row loads are 2-byte
# scalar loads (fused.verify_accept.kernels says more; tests/test_vector_loads.py)
@triton.jit(do_not_specialize=["N", "S"])  # one compile per layout and tile, not per size
def verify_tree_accept_kernel(
    predicts_ptr,  # (B * N,) int32 out: the target token at each accepted row, -1 elsewhere
    accept_index_ptr,  # (B, S) int32 out: the accepted rows, root first, then -1
    accept_num_ptr,  # (B,) int32 out: accepted drafts (the root not counted)
    logits_ptr,  # (R, V) bf16, unit stride on the last axis, rows stride_row apart
    cand_ptr,  # (B, N) int32/int64: node tokens (node 0: the root, never compared)
    index_ptr,  # (B, N) int32/int64: node -> target row, a permutation of b*N .. b*N + N - 1; [b, 0] < 0: padding
    next_token_ptr,  # (B, N) int32/int64: first child, -1 for none
    next_sibling_ptr,  # (B, N) int32/int64: next sibling, -1 for none
    V,  # vocabulary
    N,  # node slots per request
    S,  # num_speculative_tokens: accept_index width (at most S - 1 accepted drafts)
    stride_row,  # elements between target rows (>= V)
    BLOCK_N: tl.constexpr,  # >= N: lanes of the request's predicts block
    BLOCK_S: tl.constexpr,  # >= S: lanes of its accept_index row
    BLOCK_V: tl.constexpr,  # vocabulary entries per chunk of the argmax
    NUM_STAGES: tl.constexpr,  # chunk loads in flight (compiled; the interpreter ignores it)
    flag_ptr=None,  # (FLAG_WORDS,) int64 error record of fused.device_checks, written when CHECK_VALUES
    CHECK_VALUES: tl.constexpr = False,  # checked="device": a real request's layout checked first (_check_tree)
):
    """The op's one launch (module docstring): program b, request b's walk."""
    b = tl.program_id(0).to(tl.int64)
    base = b * N  # the request's first node slot, and its first row
    offs_n = tl.arange(0, BLOCK_N)
    offs_s = tl.arange(0, BLOCK_S)
    row = tl.load(index_ptr + base).to(tl.int64)  # the root's row
    walking = row >= 0  # padding requests read nothing more
    if CHECK_VALUES:  # a request that breaks a rule is walked as padding
        walking = walking & _check_tree(flag_ptr, walking, b, base, cand_ptr, index_ptr, next_token_ptr, next_sibling_ptr,
                                        V, N, BLOCK_N=BLOCK_N)
    real = walking
    tok = row_argmax(logits_ptr + row * stride_row, V, walking, BLOCK_V=BLOCK_V, NUM_STAGES=NUM_STAGES).to(tl.int64)
    acc = tl.where((offs_s == 0) & walking, row, -1)
    pred = tl.full([BLOCK_N], -1, tl.int64)
    node = b * 0  # int64 scalar: the last accepted node
    n_acc = b * 0
    for d in range(1, S):
        c = tl.load(next_token_ptr + base + node, mask=walking, other=-1).to(tl.int64)
        hit = c * 0 - 1
        steps = c * 0
        while (c >= 0) & (hit < 0) & (steps < N):  # the sibling list, first match wins
            t = tl.load(cand_ptr + base + c).to(tl.int64)
            is_hit = t == tok
            hit = tl.where(is_hit, c, hit)
            c = tl.where(is_hit, c, tl.load(next_sibling_ptr + base + c).to(tl.int64))
            steps += 1
        walking = walking & (hit >= 0)
        if walking:
            pred = tl.where(offs_n == row - base, tok, pred)  # the accepted draft's token, at its parent's row
            node = hit
            row = tl.load(index_ptr + base + hit).to(tl.int64)
            acc = tl.where(offs_s == d, row, acc)
            n_acc += 1
            tok = row_argmax(logits_ptr + row * stride_row, V, walking, BLOCK_V=BLOCK_V,
                             NUM_STAGES=NUM_STAGES).to(tl.int64)
    pred = tl.where((offs_n == row - base) & real, tok, pred)  # the bonus, at the last accepted row
    tl.store(predicts_ptr + base + offs_n, pred.to(tl.int32), mask=offs_n < N)
    tl.store(accept_index_ptr + b * S + offs_s, acc.to(tl.int32), mask=offs_s < S)
    tl.store(accept_num_ptr + b, n_acc.to(tl.int32))


def block_config(interpreted: bool) -> tuple[int, int, int]:
    """(BLOCK_V, num_warps, num_stages) of the argmax: ``fused.verify_accept.wrapper.block_config``'s
    reasoning (one program streams a request's path rows). Not tuned on a GPU yet:
    ``cases/verify_tree_accept/bench.py``."""
    return (4096, 1, 1) if interpreted else (8192, 8, 3)


def launch(*, predicts, accept_index, accept_token_num, target_logits, candidates, retrive_index, retrive_next_token,
           retrive_next_sibling, stride_row: int | None = None, flags: torch.Tensor | None = None) -> None:
    """The one launch. Arguments already validated. ``stride_row``: the row stride the kernel is
    told (default: the tensor's own); ``flags``: the device's error record (``fused.device_checks``):
    the kernel checks the layout."""
    B, N = candidates.shape
    S = accept_index.shape[1]
    block_v, num_warps, num_stages = block_config(os.environ.get("TRITON_INTERPRET") == "1")
    verify_tree_accept_kernel[(B,)](
        predicts_ptr=predicts, accept_index_ptr=accept_index, accept_num_ptr=accept_token_num,
        logits_ptr=target_logits, cand_ptr=candidates, index_ptr=retrive_index, next_token_ptr=retrive_next_token,
        next_sibling_ptr=retrive_next_sibling, V=target_logits.shape[1], N=N, S=S,
        stride_row=target_logits.stride(0) if stride_row is None else stride_row,
        BLOCK_N=triton.next_power_of_2(N), BLOCK_S=triton.next_power_of_2(S), BLOCK_V=block_v,
        NUM_STAGES=num_stages, num_warps=num_warps,
        **({"flag_ptr": flags, "CHECK_VALUES": True} if flags is not None else {}),
    )


def verify_tree_accept(*, target_logits, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                       num_speculative_tokens, checked=None):
    """Same contract as ``reference.verify_tree_accept.chain.verify_tree_accept``, in one launch.

    Shapes: target_logits (R, V) bf16, R >= B·N, any row stride with a unit innermost one;
    candidates, retrive_index, retrive_next_token, retrive_next_sibling (B, N) int32/int64;
    num_speculative_tokens S >= 1. Returns {"predicts": (B·N,) int32, "accept_index": (B, S) int32,
    "accept_token_num": (B,) int32}.

    Checks: shapes, dtypes, strides and devices on every call (no sync). The tree's values (the
    layout rules of ``reference.verify_tree_accept.chain.tree_faults``, real requests only) by
    ``checked`` (None: ``VP_CHECK_VALUES``; ``reference.checks.value_check_mode``):

    - True (the default): on the host, one sync, before the launch; a RangeError naming the argument.
    - ``"device"``: by the kernel, no sync (``fused.device_checks``): each program checks its
      request's whole block before it walks; a request that breaks a rule reads no logits row and
      gets the padding outputs (−1, length 0), and ``fused.device_checks.raise_pending()`` raises the
      host check's RangeError later.
    - False: the caller guarantees them (a bad row index is then read out of bounds; a cyclic layout
      stops after N steps a level).
    """
    mode = value_check_mode(checked)
    B, N, _, S = ref.validate(target_logits=target_logits, candidates=candidates, retrive_index=retrive_index,
                              retrive_next_token=retrive_next_token, retrive_next_sibling=retrive_next_sibling,
                              num_speculative_tokens=num_speculative_tokens, check_values=mode == "host")
    dev = target_logits.device
    predicts = torch.empty((B * N,), dtype=ref.OUT_DTYPE, device=dev)
    acc = torch.empty((B, S), dtype=ref.OUT_DTYPE, device=dev)
    n = torch.empty((B,), dtype=ref.OUT_DTYPE, device=dev)
    launch(predicts=predicts, accept_index=acc, accept_token_num=n, target_logits=target_logits,
           candidates=candidates, retrive_index=retrive_index, retrive_next_token=retrive_next_token,
           retrive_next_sibling=retrive_next_sibling, flags=device_checks.record(dev) if mode == "device" else None)
    return {"predicts": predicts, "accept_index": acc, "accept_token_num": n}


def compile_specs():
    """Signatures for the ahead-of-time compile check (``python -m harness compile``): both index
    dtypes of the tree tensors (the kernel's own arguments: ``fused.compile_specs``); an EAGLE tree
    of 64 slots and 8 steps; each also with ``checked="device"``'s checks (CHECK_VALUES)."""
    block_v, warps, stages = block_config(interpreted=False)
    return [variant(f"tree={sig[1:]}{',checked' if chk else ''}", verify_tree_accept_kernel,
                    {"predicts_ptr": "*i32", "accept_index_ptr": "*i32", "accept_num_ptr": "*i32", "logits_ptr": "*bf16",
                     "cand_ptr": sig, "index_ptr": sig, "next_token_ptr": sig, "next_sibling_ptr": sig,
                     "flag_ptr": "*i64"},
                    {"BLOCK_N": 64, "BLOCK_S": 8, "BLOCK_V": block_v, "NUM_STAGES": stages, "CHECK_VALUES": chk}, warps)
            for sig in ("*i32", "*i64") for chk in (False, True)]
