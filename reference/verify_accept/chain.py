"""Greedy (top-1) chain acceptance after the target forward of speculative decoding — the unfused
reference chain.

A verify batch holds B requests. A real request ``b`` has L drafts ``draft_tokens[b·L : b·L + L]``
and L + 1 target rows ``target_logits[qo_indptr[b] : qo_indptr[b] + L + 1]``: row j is the target's
prediction after the prefix plus drafts 0..j-1 (row L: after the last draft). A padding request
(a CUDA-graph batch padded to its captured size) has 0 rows, ``qo_indptr[b + 1] == qo_indptr[b]``;
its drafts are never read, its output row is all −1 and its accept length 0. Rows at and past
``qo_indptr[B]`` (the rest of a static logits buffer) are never read either.

Launches of the chain (what SGLang's / vLLM's greedy verify do, one op each):
  1. ``row_argmax``     predict = argmax(target_logits, -1)                  (N,) int64
  2. ``gather_targets`` target[b, j] = predict[qo_indptr[b] + j]             (B, L + 1) int64
  3. ``match``          match[b, j] = target[b, j] == draft[b, j]           (B, L) bool
  4. ``accept_lengths`` accept_length[b] = sum_j cumprod(match[b])[j]       (B,) int32 in [0, L]
  5. ``bonus_tokens``   bonus[b] = target[b, accept_length[b]]              (B,) int64
     (the target's own token at the first mismatch, or after the last draft when all match)
  6. ``output_ids``     out[b, j] = draft[b, j] for j < accept_length[b], bonus[b] at
                        j == accept_length[b], −1 after                     (B, L + 1) int32

The argmax rule (torch.argmax, checked on the CPU in ``tests/test_verify_accept.py`` and the
same on every device the run compares): logits are compared as real numbers after the exact
bf16 -> fp32 upcast, so −0 == +0; among equal maxima the lowest index wins; NaN (either sign,
any payload) is greater than every number, +inf included, so a row with a NaN gives its first
NaN's index; a row of all −inf gives 0. NumPy's argmax follows the same rule (first occurrence,
NaN propagates); the oracle below uses it, independently of torch.

That is NaN policy ``max``, the default. An implementation may declare the other legitimate
design, ``ignore`` (``Impl.nan_policy``; vLLM's greedy sampler maps NaN to −inf on purpose): NaN
is taken as −inf, so the row's largest number wins (lowest index among equal maxima), and a row
with no number above −inf — all NaN, or NaN and −inf only — gives 0, the lowest index among its
equal (−inf) maxima, as a row of all −inf does. ``nan_policy`` selects it in the chain and the oracle.

Contract: exact. ``output_ids`` and ``accept_length`` are integers; an implementation must
produce exactly the chain's, with no tolerance.
"""
from __future__ import annotations

import numpy as np
import torch

from reference.checks import (
    INDEX_DTYPES,
    ChoiceError,
    RangeError,
    ShapeError,
    VerifyParityInputError,
    check_dtype,
    check_index,
    check_inner_contiguous,
    check_rank,
    check_same_device,
    values_read,
)
from reference.launches import launch

LOGIT_DTYPES = (torch.bfloat16,)
NAN_POLICIES = ("max", "ignore")  # the argmax rule's NaN handling: the first is the default (module docstring)
OUT_DTYPE = torch.int32  # token ids and lengths: a vocabulary of 160K fits, and so do -1 and L
PAD_ID = -1


# ----------------------------------------------------------------------------- validation

def validate_logits(target_logits) -> int:
    """The target logits of an acceptance op: (N, V) bf16, V >= 1, a unit innermost stride (any row
    stride: an LM head's output sliced to the vocabulary). Returns V."""
    check_rank("target_logits", target_logits, 2)
    check_dtype("target_logits", target_logits, LOGIT_DTYPES)
    check_inner_contiguous("target_logits", target_logits)
    V = target_logits.shape[1]
    if V == 0:
        raise ShapeError("target_logits", f"empty vocabulary: shape {tuple(target_logits.shape)}")
    return V


def validate_tensors(*, target_logits, draft_tokens, qo_indptr) -> tuple[int, int, int]:
    """Ranks, dtypes, layouts, devices and the shapes that tie the three together; reads no
    values (no device sync). Returns (B, L, V).

    Shapes: target_logits (N, V) bf16, V >= 1, any row stride with a unit innermost one (an LM
    head's output sliced to the vocabulary); draft_tokens (B·L,) int32/int64 contiguous, L >= 1;
    qo_indptr (B + 1,) int32/int64 contiguous, B >= 1.
    """
    V = validate_logits(target_logits)
    check_index("qo_indptr", qo_indptr, (None,), INDEX_DTYPES)
    B = qo_indptr.shape[0] - 1
    if B < 1:
        raise ShapeError("qo_indptr", f"needs B + 1 >= 2 entries (one request at least), got shape "
                                      f"{tuple(qo_indptr.shape)}")
    check_index("draft_tokens", draft_tokens, (None,), INDEX_DTYPES)
    n = draft_tokens.shape[0]
    if n == 0 or n % B:
        raise ShapeError("draft_tokens", f"expected B·L entries with L >= 1 for B = {B} requests, got {n}")
    check_same_device(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr)
    return B, n // B, V


def validate(*, target_logits, draft_tokens, qo_indptr, check_values: bool = True) -> tuple[int, int, int]:
    """``validate_tensors``, then the values (one host sync, only with ``check_values``:
    ``reference.checks.values_checked``, and outside ``reference.checks.values_unchecked``): qo_indptr starts at 0, every request has 0 rows
    (padding) or L + 1, the rows fit in target_logits; the drafts of real requests lie in [0, V).
    Returns (B, L, V)."""
    B, L, V = validate_tensors(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr)
    if not check_values or not values_read() or (qo_indptr.is_cuda and torch.cuda.is_current_stream_capturing()):
        return B, L, V
    qo_dev = qo_indptr.long()
    real = (qo_dev[1:] > qo_dev[:-1]).repeat_interleave(L, output_size=B * L)  # on the device: no sync
    d = draft_tokens.long()
    big = torch.iinfo(torch.int64).max
    lo_hi = torch.stack((torch.where(real, d, big).min(), torch.where(real, d, -big).max()))
    got = torch.cat((qo_dev, lo_hi)).tolist()  # the one sync
    qo, (lo, hi) = got[:-2], got[-2:]
    if qo[0] != 0:
        raise RangeError("qo_indptr", f"must start at 0, got {qo}")
    sizes = [b - a for a, b in zip(qo, qo[1:])]
    bad = [(i, s) for i, s in enumerate(sizes) if s not in (0, L + 1)]
    if bad:
        i, s = bad[0]
        raise RangeError("qo_indptr", f"request {i} has {s} rows; every request has L + 1 = {L + 1} "
                                      f"(or 0: padding), got {qo}")
    N = target_logits.shape[0]
    if qo[-1] > N:
        raise RangeError("qo_indptr", f"ends at {qo[-1]}, past the {N} rows of target_logits")
    if lo != big and (lo < 0 or hi >= V):  # lo == big: no real request
        raise RangeError("draft_tokens", f"entry {lo if lo < 0 else hi} outside [0, {V}) (V = vocabulary)")
    return B, L, V


# ----------------------------------------------------------------------------- the chain

def check_nan_policy(nan_policy) -> str:
    if nan_policy not in NAN_POLICIES:
        raise ChoiceError("nan_policy", f"must be one of {NAN_POLICIES}, got {nan_policy!r}")
    return nan_policy


@launch
def row_argmax(target_logits: torch.Tensor, nan_policy: str = "max") -> torch.Tensor:
    """Launch 1. (N, V) bf16 -> (N,) int64: the lowest index of each row's maximum (``max``: NaN is
    the maximum; ``ignore``: NaN is −inf)."""
    if check_nan_policy(nan_policy) == "ignore":
        target_logits = target_logits.masked_fill(torch.isnan(target_logits), float("-inf"))
    return torch.argmax(target_logits, dim=-1)


def request_rows(qo_indptr: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows (B, L + 1) int64: the row of each request's token j; real (B,) bool: not padding)."""
    start = qo_indptr[:-1].long()
    real = qo_indptr[1:].long() > start
    return start[:, None] + torch.arange(L + 1, device=qo_indptr.device), real


@launch
def gather_targets(predict: torch.Tensor, rows: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Launch 2. (N,) and (B, L + 1) rows -> (B, L + 1) int64 target tokens; padding requests: −1."""
    padded = torch.cat((predict, predict.new_full((1,), PAD_ID)))  # index N: padding reads it
    idx = torch.where(real[:, None], rows, torch.full_like(rows, predict.shape[0]))
    return padded[idx]


@launch
def match(target: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """Launch 3. (B, L + 1) targets, (B, L) drafts -> (B, L) bool: draft j is the target's token j."""
    return target[:, :-1] == drafts.long()


@launch
def accept_lengths(matched: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Launch 4. (B, L) bool -> (B,) int32: the drafts before the first mismatch (cumulative
    product); 0 for padding requests."""
    n = torch.cumprod(matched.int(), dim=1).sum(dim=1)
    return torch.where(real, n, torch.zeros_like(n)).to(OUT_DTYPE)


@launch
def bonus_tokens(target: torch.Tensor, accept_length: torch.Tensor) -> torch.Tensor:
    """Launch 5. (B, L + 1) targets -> (B,) int64: the target's token at row accept_length."""
    return target.gather(1, accept_length.long()[:, None])[:, 0]


@launch
def output_ids(drafts: torch.Tensor, bonus: torch.Tensor, accept_length: torch.Tensor, real: torch.Tensor
               ) -> torch.Tensor:
    """Launch 6. -> (B, L + 1) int32: accepted drafts, the bonus token, then −1; all −1 for padding."""
    B, L = drafts.shape
    j = torch.arange(L + 1, device=drafts.device)[None, :]
    n = accept_length.long()[:, None]
    body = torch.cat((drafts.long(), drafts.new_full((B, 1), PAD_ID).long()), dim=1)
    out = torch.where(j < n, body, torch.where(j == n, bonus[:, None], torch.full_like(body, PAD_ID)))
    return torch.where(real[:, None], out, torch.full_like(out, PAD_ID)).to(OUT_DTYPE)


def verify_accept(*, target_logits, draft_tokens, qo_indptr, nan_policy: str = "max"):
    """The six-launch reference chain. Returns {"output_ids": (B, L + 1) int32,
    "accept_length": (B,) int32}. ``nan_policy``: the argmax's NaN rule (``NAN_POLICIES``)."""
    check_nan_policy(nan_policy)
    B, L, V = validate(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr)
    rows, real = request_rows(qo_indptr, L)
    target = gather_targets(row_argmax(target_logits, nan_policy), rows, real)
    drafts = draft_tokens.view(B, L)
    n = accept_lengths(match(target, drafts), real)
    return {"output_ids": output_ids(drafts, bonus_tokens(target, n), n, real), "accept_length": n}


# ----------------------------------------------------------------------------- the independent oracle

def verify_accept_oracle(*, target_logits, draft_tokens, qo_indptr, nan_policy: str = "max", **_unused):
    """The same contract from NumPy and a Python loop over requests (no torch reduction): NumPy's
    argmax in fp32 (first occurrence of the maximum, NaN propagates; ``ignore``: NaN replaced by
    −inf first), then the acceptance walk written out. Returns the chain's outputs, as CPU tensors."""
    qo = qo_indptr.cpu().tolist()
    B = len(qo) - 1
    L = draft_tokens.numel() // B
    logits = target_logits.cpu().float().numpy()
    if check_nan_policy(nan_policy) == "ignore":
        logits = np.where(np.isnan(logits), np.float32(-np.inf), logits)
    drafts = draft_tokens.cpu().tolist()
    out = np.full((B, L + 1), PAD_ID, dtype=np.int32)
    n = np.zeros(B, dtype=np.int32)
    for b in range(B):
        if qo[b + 1] == qo[b]:
            continue
        k = 0
        while True:
            t = int(np.argmax(logits[qo[b] + k]))
            out[b, k] = t
            if k == L or t != drafts[b * L + k]:
                break
            k += 1
        n[b] = k
    return {"output_ids": torch.from_numpy(out), "accept_length": torch.from_numpy(n)}
