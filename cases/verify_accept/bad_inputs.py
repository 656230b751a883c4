"""Bad inputs of ``verify_accept`` (``harness.fuzz``): the arguments of its public call, its public
entry points, and the small valid cases every one of them takes."""
from __future__ import annotations

import dataclasses

import torch

from harness.fuzz.declared import Arg, Target

OP = "verify_accept"
R, F = "reference", "fused"

# its public call's arguments, as the classes see them (draft_tokens: token ids, in [0, V) for real requests)
ARGS = (
    Arg("target_logits", "data", "rows"),
    Arg("draft_tokens", "index"),
    Arg("qo_indptr", "indptr"),
)

# shape-token-mismatch: one more draft than B·L (with B = 1 that is L + 1 drafts, so qo_indptr's L + 2
# rows per request are what is wrong, and the error may name it)
MISMATCHED = {"token": ("draft_tokens",), "token-names": ("qo_indptr",)}

# value-nan-unread: the logits rows at and past qo_indptr[B] (a padded CUDA-graph batch's tail)
UNREAD = ("target_logits",)

# its public entry points, each called like the step
TARGETS = (
    Target("reference.verify_accept.chain:verify_accept", OP, R, "reference.verify_accept.chain:verify_accept"),
    Target("fused.verify_accept.wrapper:verify_accept", OP, F, "reference.verify_accept.chain:verify_accept"),
)


def base_cases(device):
    """Small valid cases that every target of the op takes on ``device`` (the op's own strategy,
    narrowed: small vocabularies and batches, no padding requests, so that every draft is an entry
    a class may break; value-nan-unread adds padding)."""
    from cases.verify_accept import catalog as c

    return c.cases(max_batch=3, max_drafts=3, vocabs=(1, 17, 100, 1000)).map(
        lambda k: dataclasses.replace(k, padding=0))


def index_high(a: str, kw: dict) -> int:
    """One past the largest legal draft token: the vocabulary size."""
    return kw["target_logits"].shape[1]


def indptr_rows(a: str, kw: dict) -> int:
    """The rows qo_indptr indexes: the logits rows."""
    return kw["target_logits"].shape[0]


def t0(kw, ctx) -> None:
    """No tokens: no logits rows, every request padding (0 rows). Legal: every output −1, length 0."""
    kw["target_logits"] = kw["target_logits"][:0]
    kw["qo_indptr"] = torch.zeros_like(kw["qo_indptr"])


def b0(kw, ctx) -> None:
    """No requests: qo_indptr of one entry (the drafts cut to none as well)."""
    kw["qo_indptr"] = kw["qo_indptr"][:1]
    kw["draft_tokens"] = kw["draft_tokens"][:0]


def nan_unread(kw, a, p, ctx):
    """NaN in every logits row at and past qo_indptr[B] (never read)."""
    from harness.fuzz.surgery import fill_rows_nan

    end, n = int(kw["qo_indptr"][-1]), kw[a].shape[0]
    fill_rows_nan(kw[a], torch.arange(end, n))


def nan_unread_case(case):
    """value-nan-unread's case: padding requests beside a real one, so the buffer has a tail."""
    B = max(2, case.B)
    return dataclasses.replace(case, B=B, padding=max(1, min(case.padding, B - 1)))
