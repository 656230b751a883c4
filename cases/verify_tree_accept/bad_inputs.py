"""Bad inputs of ``verify_tree_accept`` (``harness.fuzz``): the arguments of its public call, its
public entry points, and the small valid cases every one of them takes."""
from __future__ import annotations

import dataclasses

import torch

from harness.fuzz.declared import Arg, Target

OP = "verify_tree_accept"
R, F = "reference", "fused"

# its public call's arguments, as the classes see them (candidates: token ids, in [0, V) for real requests;
# the tree's pointers and row permutation are kind "tree": -1 is legal there, so the range classes do not
# apply, and tests/test_verify_tree_accept.py breaks their layout rules one by one)
ARGS = (
    Arg("target_logits", "data", "rows"),
    Arg("candidates", "index"),
    Arg("retrive_index", "tree"),
    Arg("retrive_next_token", "tree"),
    Arg("retrive_next_sibling", "tree"),
    Arg("num_speculative_tokens", "int"),
)

# value-nan-unread: the logits rows at and past B·N (a static buffer's tail)
UNREAD = ("target_logits",)

# its public entry points, each called like the step
TARGETS = (
    Target("reference.verify_tree_accept.chain:verify_tree_accept", OP, R,
           "reference.verify_tree_accept.chain:verify_tree_accept"),
    Target("fused.verify_tree_accept.wrapper:verify_tree_accept", OP, F,
           "reference.verify_tree_accept.chain:verify_tree_accept"),
)


def base_cases(device):
    """Small valid cases that every target of the op takes on ``device`` (the op's own strategy,
    narrowed: small vocabularies, trees and batches, no padding requests, so that every candidate
    is an entry a class may break; value-nan-unread adds a tail)."""
    from cases.verify_tree_accept import catalog as c

    return c.cases(max_batch=3, max_nodes=16, vocabs=(2, 17, 100, 1000)).map(
        lambda k: dataclasses.replace(k, padding=0))


def index_high(a: str, kw: dict) -> int:
    """One past the largest legal candidate token: the vocabulary size."""
    return kw["target_logits"].shape[1]


def nan_unread(kw, a, p, ctx):
    """NaN in every logits row at and past B·N (never read)."""
    from harness.fuzz.surgery import fill_rows_nan

    n, R = kw["candidates"].numel(), kw[a].shape[0]
    fill_rows_nan(kw[a], torch.arange(n, R))


def nan_unread_case(case):
    """value-nan-unread's case: a tail of rows past B·N."""
    return dataclasses.replace(case, tail=max(2, case.tail))


def t0(kw, ctx) -> None:
    """No tokens to verify: every request padding (retrive_index[:, 0] = -1). Legal: every output −1,
    lengths 0."""
    ri = kw["retrive_index"].clone()
    ri[:, 0] = -1
    kw["retrive_index"] = ri
