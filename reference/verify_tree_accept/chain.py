"""Greedy (top-1) acceptance of a draft *tree* after the target forward of speculative decoding
(EAGLE-2/3 at top-k > 1) — the unfused reference chain.

The tree of request b has N node slots, given in the first-child / next-sibling layout SGLang's
``build_tree_kernel_efficient`` produces and its ``verify_tree_greedy`` walks (the argument names
keep that kernel schema's spelling, ``retrive_*``, so an adapter maps them one to one):

- node 0 is the root: the last verified token (``candidates[b, 0]``, never compared);
- ``candidates[b, i]``: the draft token of node i;
- ``retrive_index[b, i]``: the target row of node i (in ``target_logits``, and its entry in
  ``predicts``); a real request's entries are a permutation of its own block b·N … b·N + N − 1
  (SGLang's are b·N + i); row r's argmax is the target's next token after the path to its node;
- ``retrive_next_token[b, i]``: node i's first child, −1 for none;
- ``retrive_next_sibling[b, i]``: the next child of node i's parent, −1 at the list's end.
Every pointer goes forward (−1 or an index in (i, N)): a parent precedes its children and a sibling
list runs in increasing index order, which guarantees the walk ends; no node has two incoming
pointers (it is a tree). Slots no pointer reaches from the root (spare slots: a tree of fewer than
N nodes) are never on the accepted path.

A **padding request** (a CUDA-graph batch padded to its captured size) has ``retrive_index[b, 0]
< 0``; nothing else of it is read (its other entries may hold anything), its ``accept_index`` row
is all −1, its ``accept_token_num`` 0 and its block of ``predicts`` all −1. Rows of
``target_logits`` at and past B·N (the rest of a static buffer) are never read.

The acceptance (what SGLang's ``verify_tree_greedy`` computes, read for its meaning): start at the
root; at each level take the target's token t at the current node's row and accept the **first
child, in sibling-list order, whose draft token is t** (a later sibling carrying the same token
never wins); stop when no child matches or after S − 1 accepted drafts, S =
``num_speculative_tokens`` (the width of ``accept_index``: spec steps + 1). The **bonus** token is
the target's token at the *last accepted node's* row (the root's, when nothing was accepted).

Launches of the chain (each over the whole batch):
  1. ``row_argmax``     predict = argmax(target_logits[:B·N], -1), the rule of
                        ``reference.verify_accept.chain`` (lowest index among equal maxima, NaN the
                        maximum)                                               (B·N,) int64
  2. ``gather_targets`` target[b, i] = predict[retrive_index[b, i]]; −1 for padding   (B, N) int64
  3. ``tree_parents``   parent[b, i] (−1: the root, or a slot no pointer reaches) and rank[b, i]
                        (position in its sibling list), by pointer jumping along the sibling lists
                                                                               (B, N), (B, N) int64
  4. ``match``          match[b, i] = parent ≥ 0 and candidates[b, i] == target[b, parent]  (B, N) bool
  5. ``first_matches``  chosen[b, i] = match and no sibling of lower rank matches   (B, N) bool
  6. ``accept_path``    from the root, S − 1 times: the chosen child of the current node, if any
                        -> accept_index (B, S) int32 (rows, root first, −1 after),
                           accept_token_num (B,) int32
  7. ``write_predicts`` predicts[r] = predict[r] for every row r on an accepted path (the accepted
                        drafts' tokens, then the bonus at the last row), −1 elsewhere  (B·N,) int32

Contract: exact. The three outputs are integers; an implementation must produce exactly the
chain's. (SGLang's kernel writes only the path entries of a ``predicts`` its caller zero-fills;
here the other entries are −1, so an adapter pre-fills −1.)
"""
from __future__ import annotations

import numpy as np
import torch

from reference.checks import (
    INDEX_DTYPES,
    RangeError,
    ShapeError,
    check_index,
    check_int,
    check_rank,
    check_same_device,
    values_read,
)
from reference.launches import launch
from reference.verify_accept.chain import validate_logits

OUT_DTYPE = torch.int32  # rows, tokens and counts (a vocabulary of 160K fits, and so does -1)
PAD_ID = -1  # accept_index past the path; predicts off it
MAX_NODES = 1024  # N: node slots per request (EAGLE trees hold up to ~64; the kernel keeps one vector of N)
TREE_ARGS = ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")


# ----------------------------------------------------------------------------- validation

def validate_tensors(*, target_logits, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                     num_speculative_tokens) -> tuple[int, int, int, int]:
    """Ranks, dtypes, layouts, devices and the shapes that tie the inputs together; reads no
    values (no device sync). Returns (B, N, V, S).

    Shapes: target_logits (R, V) bf16, V >= 1, R >= B·N, unit innermost stride (any row stride);
    candidates, retrive_index, retrive_next_token, retrive_next_sibling (B, N) int32/int64
    contiguous, B >= 1, 1 <= N <= MAX_NODES; num_speculative_tokens an int >= 1.
    """
    V = validate_logits(target_logits)
    check_rank("candidates", candidates, 2)
    check_index("candidates", candidates, (None, None), INDEX_DTYPES)
    B, N = candidates.shape
    if B < 1 or not 1 <= N <= MAX_NODES:
        raise ShapeError("candidates", f"expected (B, N) with B >= 1 and 1 <= N <= {MAX_NODES}, got "
                                       f"{tuple(candidates.shape)}")
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        check_rank(name, t, 2)
        check_index(name, t, (B, N), INDEX_DTYPES)
    if target_logits.shape[0] < B * N:
        raise ShapeError("target_logits", f"{target_logits.shape[0]} rows, fewer than B·N = {B}·{N} (one per node)")
    S = check_int("num_speculative_tokens", num_speculative_tokens, low=1)
    check_same_device(target_logits=target_logits, candidates=candidates, retrive_index=retrive_index,
                      retrive_next_token=retrive_next_token, retrive_next_sibling=retrive_next_sibling)
    return B, N, V, S


def tree_faults(candidates, retrive_index, retrive_next_token, retrive_next_sibling, V: int) -> torch.Tensor:
    """(5, 3) int64 on the inputs' device, no sync: for each value rule of the layout (``TREE_FAULTS``'
    order) the first breaking (request, node, entry) in slot order, or (−1, −1, 0) — candidates in
    [0, V); retrive_index a permutation of the request's block (its node's entry outside the block,
    or repeated); next_token and next_sibling pointing forward (−1 or i < p < N); no node with two
    incoming pointers (the entry: the count). Padding requests (retrive_index[b, 0] < 0) are exempt."""
    B, N = candidates.shape
    dev = candidates.device
    real = (retrive_index[:, :1] >= 0)
    node = torch.arange(N, device=dev)
    lo = torch.arange(B, device=dev)[:, None] * N
    ri, c = retrive_index.long(), candidates.long()
    nt, ns = retrive_next_token.long(), retrive_next_sibling.long()
    out_of_block = (ri < lo) | (ri >= lo + N)
    s = torch.sort(torch.where(out_of_block, -1 - node, ri), dim=1)  # in-block repeats sit next to their twin
    rep = torch.zeros_like(out_of_block)
    rep.scatter_(1, s.indices[:, 1:], (s.values[:, 1:] == s.values[:, :-1]) & (s.values[:, 1:] >= 0))
    targets = torch.cat((nt, ns), dim=1)  # (B, 2N)
    indeg = torch.zeros((B, N + 1), dtype=torch.long, device=dev)
    indeg.scatter_add_(1, torch.where((targets > 0) & (targets < N), targets, N), torch.ones_like(targets))
    rules = (((c < 0) | (c >= V), c), (out_of_block | rep, ri),
             ((nt != -1) & ((nt <= node) | (nt >= N)), nt), ((ns != -1) & ((ns <= node) | (ns >= N)), ns),
             (indeg[:, :N] > 1, indeg[:, :N]))
    first = []
    for bad, val in rules:
        flat = (bad & real).flatten()
        k = torch.argmax(flat.int())
        hit = flat.any()
        first.append(torch.stack((torch.where(hit, k // N, -1), torch.where(hit, k % N, -1),
                                  torch.where(hit, val.flatten()[k], 0))))
    return torch.stack(first)


TREE_FAULTS = (
    ("candidates", "node {i} carries token {v}, outside [0, {V}) (V = vocabulary)"),
    ("retrive_index", ("node {i} has row {v}: the entries must be a permutation of the request's rows "
                       "{lo} … {hi} (its own block of N)")),
    ("retrive_next_token", "node {i} points to {v}: a first child is −1 or a later node (i < next < N)"),
    ("retrive_next_sibling", "node {i} points to {v}: a next sibling is −1 or a later node (i < next < N)"),
    ("retrive_next_sibling", ("node {i} has {v} incoming pointers (next_token and next_sibling together): "
                              "not a tree")),
)


def validate(*, target_logits, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
             num_speculative_tokens, check_values: bool = True) -> tuple[int, int, int, int]:
    """``validate_tensors``, then the values (one host sync, only with ``check_values``:
    ``reference.checks.values_checked``): ``tree_faults``' rules, each a ``RangeError`` naming the
    argument and the request. Returns (B, N, V, S)."""
    kw = dict(candidates=candidates, retrive_index=retrive_index, retrive_next_token=retrive_next_token,
              retrive_next_sibling=retrive_next_sibling)
    B, N, V, S = validate_tensors(target_logits=target_logits, num_speculative_tokens=num_speculative_tokens, **kw)
    if not check_values or not values_read() or (candidates.is_cuda and torch.cuda.is_current_stream_capturing()):
        return B, N, V, S
    faults = tree_faults(candidates, retrive_index, retrive_next_token, retrive_next_sibling, V).tolist()  # the sync
    for (arg, what), (b, i, v) in zip(TREE_FAULTS, faults):
        if b >= 0:
            raise RangeError(arg, f"request {b}: " + what.format(i=i, v=v, V=V, lo=b * N, hi=b * N + N - 1))
    return B, N, V, S


# ----------------------------------------------------------------------------- the chain

@launch
def row_argmax(target_logits: torch.Tensor, rows: int) -> torch.Tensor:
    """Launch 1. (R, V) bf16 -> (rows,) int64: each of the first ``rows`` rows' argmax (torch.argmax:
    the lowest index among equal maxima, NaN the maximum)."""
    return torch.argmax(target_logits[:rows], dim=-1)


@launch
def gather_targets(predict: torch.Tensor, retrive_index: torch.Tensor) -> torch.Tensor:
    """Launch 2. (B·N,) predictions, (B, N) rows -> (B, N) int64 target tokens; padding requests −1."""
    real = retrive_index[:, :1] >= 0
    idx = torch.where(real, retrive_index.long(), 0)
    return torch.where(real, predict[idx], PAD_ID)


@launch
def tree_parents(retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch 3. The layout's pointers -> (parent (B, N) int64, −1 for the root and for a slot no
    first-child pointer leads to; rank (B, N) int64, the slot's position in its sibling list).
    List ranking by pointer jumping over the previous-sibling links (ceil(log2 N) rounds): each
    slot finds the head of its sibling list and its distance to it; the parent is the slot whose
    first child that head is. Padding requests' entries are read like any others (their results
    are never used); only forward pointers in range are followed."""
    B, N = retrive_next_token.shape
    dev = retrive_next_token.device
    node = torch.arange(N, device=dev).expand(B, N)
    nt, ns = retrive_next_token.long(), retrive_next_sibling.long()
    spare = torch.full((B, 1), -1, dtype=torch.long, device=dev)  # column N: where pointers out of range go
    fwd_ns = torch.where((ns > node) & (ns < N), ns, N)
    # prev[b, j]: the sibling before j in its list; a list head keeps itself (distance 0)
    prev = torch.cat((node, spare), 1).scatter(1, fwd_ns, node)[:, :N]
    dist = (prev != node).long()
    for _ in range(max(1, (N - 1).bit_length())):
        dist = dist + dist.gather(1, prev)
        prev = prev.gather(1, prev)
    fwd_nt = torch.where((nt > node) & (nt < N), nt, N)
    owner = torch.cat((torch.full_like(nt, -1), spare), 1).scatter(1, fwd_nt, torch.cat((node, spare), 1)[:, :N])
    return owner[:, :N].gather(1, prev), dist


@launch
def match(candidates: torch.Tensor, target: torch.Tensor, parent: torch.Tensor) -> torch.Tensor:
    """Launch 4. (B, N) bool: node i has a parent and carries the target's token at its parent's row."""
    at_parent = target.gather(1, parent.clamp(min=0))
    return (parent >= 0) & (candidates.long() == at_parent)


@launch
def first_matches(matched: torch.Tensor, parent: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Launch 5. (B, N) bool: the matching node of lowest rank among its siblings (first in list order)."""
    B, N = matched.shape
    big = torch.full_like(rank, N)
    best = torch.full((B, N + 1), N, dtype=torch.long, device=rank.device)  # per parent: the lowest matching rank
    best.scatter_reduce_(1, torch.where(matched, parent, N), torch.where(matched, rank, big), reduce="amin")
    return matched & (best.gather(1, torch.where(matched, parent, N)) == rank)


@launch
def accept_path(chosen: torch.Tensor, parent: torch.Tensor, retrive_index: torch.Tensor, S: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch 6. -> (accept_index (B, S) int32: the accepted nodes' rows, root first, −1 after; all −1
    for padding; accept_token_num (B,) int32: accepted drafts, the root not counted)."""
    B = chosen.shape[0]
    real = retrive_index[:, 0] >= 0
    cur = torch.zeros(B, dtype=torch.long, device=chosen.device)
    alive = real.clone()
    acc = torch.full((B, S), PAD_ID, dtype=torch.long, device=chosen.device)
    acc[:, 0] = torch.where(real, retrive_index[:, 0].long(), PAD_ID)
    n = torch.zeros(B, dtype=torch.long, device=chosen.device)
    for d in range(1, S):
        nxt = chosen & (parent == cur[:, None])  # at most one per row (first_matches)
        alive = alive & nxt.any(1)
        cur = torch.where(alive, torch.argmax(nxt.int(), dim=1), cur)
        acc[:, d] = torch.where(alive, retrive_index.long().gather(1, cur[:, None])[:, 0], PAD_ID)
        n += alive.long()
    return acc.to(OUT_DTYPE), n.to(OUT_DTYPE)


@launch
def write_predicts(predict: torch.Tensor, accept_index: torch.Tensor) -> torch.Tensor:
    """Launch 7. (B·N,) int32: the target's token at every accepted row (the accepted drafts, then
    the bonus at the last), −1 elsewhere. A scatter through a spare last entry (no boolean
    indexing: no host sync, so the chain can be captured in a CUDA graph)."""
    n = predict.shape[0]
    rows = accept_index.long().flatten()
    idx = torch.where(rows >= 0, rows, n)  # unaccepted entries land in entry n, dropped
    out = torch.full((n + 1,), PAD_ID, dtype=torch.long, device=predict.device)
    out.scatter_(0, idx, torch.cat((predict, predict.new_full((1,), PAD_ID)))[idx])
    return out[:n].to(OUT_DTYPE)


def verify_tree_accept(*, target_logits, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                       num_speculative_tokens):
    """The seven-launch reference chain. Returns {"predicts": (B·N,) int32, "accept_index": (B, S)
    int32, "accept_token_num": (B,) int32}."""
    B, N, _, S = validate(target_logits=target_logits, candidates=candidates, retrive_index=retrive_index,
                          retrive_next_token=retrive_next_token, retrive_next_sibling=retrive_next_sibling,
                          num_speculative_tokens=num_speculative_tokens)
    predict = row_argmax(target_logits, B * N)
    target = gather_targets(predict, retrive_index)
    parent, rank = tree_parents(retrive_next_token, retrive_next_sibling)
    chosen = first_matches(match(candidates, target, parent), parent, rank)
    acc, n = accept_path(chosen, parent, retrive_index, S)
    return {"predicts": write_predicts(predict, acc), "accept_index": acc, "accept_token_num": n}


# ----------------------------------------------------------------------------- the independent oracle

def verify_tree_accept_oracle(*, target_logits, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                              num_speculative_tokens, **_unused):
    """The same contract as the walk SGLang's kernel does, in a Python loop over requests with
    NumPy's argmax (fp32; first occurrence, NaN propagates) taken only at the rows the walk
    visits: from the root, follow the first-child pointer, then next-sibling pointers until a
    node's token equals the target's token at the last accepted row. Returns CPU tensors."""
    B, N = candidates.shape
    S = int(num_speculative_tokens)
    logits = target_logits.cpu().float().numpy()
    cand, ri = candidates.cpu().tolist(), retrive_index.cpu().tolist()
    nt, ns = retrive_next_token.cpu().tolist(), retrive_next_sibling.cpu().tolist()
    predicts = np.full(B * N, PAD_ID, dtype=np.int32)
    acc = np.full((B, S), PAD_ID, dtype=np.int32)
    num = np.zeros(B, dtype=np.int32)
    for b in range(B):
        if ri[b][0] < 0:
            continue
        node, row = 0, ri[b][0]
        acc[b, 0] = row
        tok = int(np.argmax(logits[row]))
        for k in range(1, S):
            c = nt[b][node]
            while c != -1 and cand[b][c] != tok:
                c = ns[b][c]
            if c == -1:
                break
            predicts[row] = tok
            node, row = c, ri[b][c]
            acc[b, k] = row
            num[b] = k
            tok = int(np.argmax(logits[row]))
        predicts[row] = tok  # the bonus
    return {"predicts": torch.from_numpy(predicts), "accept_index": torch.from_numpy(acc),
            "accept_token_num": torch.from_numpy(num)}
