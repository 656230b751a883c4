"""The draft tree of a tree family's verify step (``cases.timeline_family.Family.topk`` > 1): its shape
drawn from the timeline's seed, the truth the runner holds the backend to (each node's level, its
ancestors, the accepted path) and the tree acceptance op's inputs (``accept_inputs``).

A tree of one request and one verify step has N = L + 1 nodes in the parent-array form: node 0 is the
root, the request's last committed token (its KV is history already, as in the chain families, whose
verify chunk holds drafts only; SGLang's chunk also carries the root, the previous step's bonus token:
the same tree shifted by one position); nodes 1 … L are the verify chunk, chunk token i being node
i + 1. Nodes are numbered level by level, a parent before its children, each node's children in
increasing order: the first-child / next-sibling layout (``layout``) the acceptance op takes, with
``retrive_index`` = b·N + node (SGLang's). A node at level k (the root's children: level 1) sits at
position n + k − 1 (n: the committed length; the root at n − 1): SGLang's "prefix length + depth".

``V:r.a`` on a tree family: the accepted path is a root-to-node path of ``a`` drafts, its end drawn
among the level-``a`` nodes, and the target logits make the op's greedy walk accept exactly that path
(siblings carry distinct tokens; at the path's end the target's token is none of the children's)."""
from __future__ import annotations

import torch

from cases import timelines as tl
from cases.verify_tree_accept.catalog import layout  # (next_token, next_sibling): the op's own layout


def generator(t: tl.Timeline) -> torch.Generator:
    """The stream of a timeline's trees and accepted paths (its own: the other draws stay as they are)."""
    return torch.Generator().manual_seed(5000 + t.seed)


def step_trees(t: tl.Timeline, items: list[tuple[int, int]], g: torch.Generator) -> tuple[dict, dict]:
    """One verify batch of a tree family: per request (in batch order) its tree (``draft_tree``) and the
    path its script accepts (``choose_path``) -> ({r: parents}, {r: path})."""
    fam = tl.FAMILIES[t.family]
    trees, paths = {}, {}
    for r, a in items:
        trees[r] = draft_tree(t.L, fam.topk, fam.depth, g)
        paths[r] = choose_path(trees[r], a, g)
    return trees, paths


def timeline_trees(t: tl.Timeline) -> list[tuple[int, int, list[int], list[int]]]:
    """Every verify step's (step, request, parents, accepted path) of a tree family's timeline, as its run
    draws them."""
    g, out = generator(t), []
    for step, (mode, items) in enumerate(tl.parse_steps(t.steps)):
        if mode == "target_verify":
            trees, paths = step_trees(t, items, g)
            out += [(step, r, trees[r], paths[r]) for r, _ in items]
    return out


def draft_tree(L: int, topk: int, depth: int, g: torch.Generator) -> list[int]:
    """Parents (−1 for the root) of a tree of L + 1 nodes, depth exactly ``depth``, at most ``topk``
    children a node: a spine of ``depth`` nodes, the other L − depth attached to random nodes that
    have room (level < depth, fewer than ``topk`` children), each node's children in a random order,
    then numbered level by level. (L + 1,)."""
    if not depth <= L <= sum(topk ** k for k in range(1, depth + 1)):
        raise ValueError(f"L: a tree of depth {depth} and top-k {topk} holds {depth} … "
                         f"{sum(topk ** k for k in range(1, depth + 1))} drafts, got {L}")
    level, kids = [0], [[]]

    def add(p: int) -> int:
        level.append(level[p] + 1)
        kids.append([])
        kids[p].append(len(level) - 1)
        return len(level) - 1

    node = 0
    for _ in range(depth):
        node = add(node)
    for _ in range(L - depth):
        room = [i for i in range(len(level)) if level[i] < depth and len(kids[i]) < topk]
        add(room[int(torch.randint(0, len(room), (), generator=g))])
    order, frontier = [], [0]  # level by level, each node's children in a random order
    while frontier:
        order += frontier
        nxt = []
        for i in frontier:
            nxt += [kids[i][int(k)] for k in torch.randperm(len(kids[i]), generator=g)]
        frontier = nxt
    new = {old: k for k, old in enumerate(order)}
    parents = [-1] * len(order)
    for old, k in new.items():
        for c in kids[old]:
            parents[new[c]] = k
    return parents


def levels(parents: list[int]) -> list[int]:
    """Each node's level (the root 0)."""
    out = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def ancestors(parents: list[int], i: int) -> list[int]:
    """Node ``i``'s ancestors, the root excluded, nearest first."""
    out = []
    while parents[i] > 0:
        i = parents[i]
        out.append(i)
    return out


def truth_mask(parents: list[int]) -> torch.Tensor:
    """(L, L) bool: chunk token i may see chunk token j — j is i or one of its ancestors (the root is
    history, seen by every token)."""
    L = len(parents) - 1
    m = torch.zeros(L, L, dtype=torch.bool)
    for i in range(1, L + 1):
        for j in [i] + ancestors(parents, i):
            m[i - 1, j - 1] = True
    return m


def choose_path(parents: list[int], a: int, g: torch.Generator) -> list[int]:
    """The accepted path of ``a`` drafts: nodes from level 1 to a level-``a`` node drawn uniformly. []
    for a = 0."""
    if a == 0:
        return []
    lv = levels(parents)
    ends = [i for i, k in enumerate(lv) if k == a]
    if not ends:
        raise ValueError(f"accepted {a}: the tree has no node at level {a} (depth {max(lv)})")
    end = ends[int(torch.randint(0, len(ends), (), generator=g))]
    return list(reversed(ancestors(parents, end))) + [end]


def accept_inputs(trees: list[list[int]], paths: list[list[int]], S: int, vocab: int, g: torch.Generator,
                  device) -> tuple[dict, torch.Tensor]:
    """The tree acceptance op's inputs for one verify batch whose greedy walk accepts ``paths`` (one
    per request, node ids), and the ``accept_index`` it must give. Every request's tree has N nodes;
    siblings carry distinct tokens; on the path each node's row argmax is the next path node's token,
    at the path's end a token none of its children carries (the row's maximum 8.0 over a randn row).
    Shapes: target_logits (B·N, vocab) bf16, candidates / retrive_* (B, N) int64; accept_index (B, S)
    int32 (rows, root first, −1 after)."""
    B, N = len(trees), len(trees[0])
    cand = torch.randint(0, vocab, (B, N), generator=g)
    logits = torch.randn(B * N, vocab, generator=g)
    nt, ns = torch.empty(B, N, dtype=torch.long), torch.empty(B, N, dtype=torch.long)
    want = torch.full((B, S), -1, dtype=torch.int32)
    for b, (parents, path) in enumerate(zip(trees, paths)):
        nt[b], ns[b] = (torch.tensor(x) for x in layout(parents))
        kids = [[c for c in range(N) if parents[c] == p] for p in range(N)]
        for p in range(N):
            if kids[p]:
                cand[b, kids[p]] = torch.randperm(vocab, generator=g)[: len(kids[p])]
        walk = [0] + path
        for u, v in zip(walk, walk[1:]):
            logits[b * N + u, cand[b, v]] = 8.0
        end = walk[-1]
        free = [t for t in range(vocab) if t not in set(cand[b, kids[end]].tolist())]
        logits[b * N + end, free[int(torch.randint(0, len(free), (), generator=g))]] = 8.0
        want[b, : len(walk)] = torch.tensor([b * N + u for u in walk], dtype=torch.int32)
    rows = torch.arange(B * N).view(B, N)
    args = dict(target_logits=logits.to(torch.bfloat16).to(device), candidates=cand.to(device),
                retrive_index=rows.to(device), retrive_next_token=nt.to(device), retrive_next_sibling=ns.to(device),
                num_speculative_tokens=S)
    return args, want.to(device)
