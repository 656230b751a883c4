"""Cases for ``verify_tree_accept``: EAGLE-2/3 draft trees in SGLang's first-child / next-sibling
layout, with the target logits and draft tokens arranged so that every rule of the walk decides
something.

Trees: per request, the EAGLE-2 construction — the root's top-k children, then at each of the next
steps the top-k scoring nodes of the last level each expand their own top-k, and the N − 1 best
scoring nodes of all levels are kept (a child scores its parent's log-probability plus its own,
so a kept node's ancestors are kept). Top-k 4–10, 3–8 steps, up to 64 draft tokens per request,
as EAGLE-2/3 deployments run them; top-k 1 gives a chain, N = 1 the root alone. The sharpness
of the draft's distributions is drawn per request (deep narrow trees and shallow wide ones).
Nodes are numbered level by level in score order (``bfs``: SGLang's order) or depth first
(``dfs``); either way a parent precedes its children and a sibling list runs in increasing index
order. ``spare`` slots of the N stay outside the tree (no pointer reaches them), at random places.
``shuffled_rows``: each request's rows are a random permutation of its block (SGLang's are
b·N + i): an implementation must read ``retrive_index``.

Values: target logits ``randn`` (or ``coarse``: round(2·randn)/2, ties at the top everywhere) in
bf16; ``row_pad`` > 0: the rows are a slice of a wider LM-head output. Padding requests' rows and
the ``tail`` rows past B·N hold +inf (never read; a kernel that reads them picks them).

Tokens: the walk's path is planned first — from the root, while ``accept`` says go on (``all``:
as deep as the tree and the S − 1 limit allow; ``none``: nothing; ``mixed``: each level with
probability 0.7), one child (``match``: ``first``, ``last`` or ``any`` position in the sibling
list) gets the target's token at its parent's row (``torch.argmax`` of that row, the chain's
rule) and every other child of that parent another token. ``dup_siblings``: the fraction of path
levels where a *later* sibling of the accepted child carries the same token (the first in list
order must win). ``decoys``: at each path level a node of the next level that is *not* a child
of the current node (a cousin, the lowest-indexed one) carries the target's token too (a walk
that matches by level and not by parent follows it). Off-path nodes get random tokens.
``steps`` < ``depth``: S − 1 = steps truncates the walk (the tree is deeper than the
accept_index row), and matches are planted below the limit as well.

Padding requests: ``retrive_index[b, 0] = −1``; their other entries hold values that would be
wrong if read (pointers 0, candidates −1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cases.base import composite

if TYPE_CHECKING:  # annotations only: reading the declarations imports no torch (python -m harness list)
    import torch

ACCEPT = ("mixed", "all", "none")
MATCH = ("any", "first", "last")
INDEX_DTYPES = ("int32", "int64")  # names in torch of the index dtypes a case may ask for


@dataclass(frozen=True)
class VerifyTreeAcceptCase:
    B: int  # requests (padding included)
    topk: int = 4  # children per expanded node, and nodes expanded per step
    depth: int = 3  # draft steps (tree levels below the root)
    N: int = 8  # node slots per request, the root included (num_draft_tokens)
    V: int = 32000  # vocabulary
    steps: int = 0  # accepted drafts at most, S - 1 (0: depth)
    spare: int = 0  # slots outside the tree
    order: Literal["bfs", "dfs"] = "bfs"  # bfs | dfs
    accept: Literal["mixed", "all", "none"] = "mixed"
    match: Literal["any", "first", "last"] = "any"  # any | first | last: the accepted child's place in its sibling list
    dup_siblings: float = 0.0  # fraction of path levels with a later sibling carrying the same token
    decoys: bool = False  # cousins carrying the target token
    padding: int = 0  # padding requests
    shuffled_rows: bool = False
    row_pad: int = 0  # extra columns per logits row
    tail: int = 0  # logits rows past B·N
    values: str = "randn"  # randn | coarse
    cand_dtype: str = "int64"
    index_dtype: str = "int64"
    seed: int = 0
    name: str = ""

    @property
    def S(self) -> int:
        return (self.steps or self.depth) + 1


def catalog(*, big: bool = False) -> list[VerifyTreeAcceptCase]:
    C = VerifyTreeAcceptCase
    cases = [
        # EAGLE-2/3 trees at deployed sizes (top-k, steps, draft tokens), real vocabularies
        C(B=4, topk=8, depth=5, N=64, V=32000, name="eagle-k8-d5-n64-v32000", seed=1),
        C(B=2, topk=10, depth=6, N=60, V=32000, dup_siblings=0.5, decoys=True, name="eagle-k10-d6-n60", seed=2),
        C(B=4, topk=4, depth=5, N=16, V=128256, row_pad=256, name="eagle-k4-d5-n16-v128256-strided", seed=3),
        C(B=3, topk=10, depth=8, N=64, V=4099, accept="all", name="eagle-k10-d8-n64-all", seed=4),
        C(B=6, topk=4, depth=3, N=8, V=151936, name="eagle-k4-d3-n8-v151936", seed=5),
        C(B=8, topk=8, depth=7, N=48, V=5000, order="dfs", name="eagle-k8-d7-n48-dfs", seed=6),
        # the walk's rules, one each: the accepted child last in its list; a later duplicate sibling (first
        # wins); cousins carrying the target token; a path through non-consecutive nodes (bfs, not first)
        C(B=6, topk=4, depth=4, N=24, V=4096, accept="all", match="last", name="match-last-sibling", seed=7),
        C(B=6, topk=4, depth=4, N=24, V=4096, accept="all", match="first", dup_siblings=1.0,
          name="duplicate-siblings", seed=8),
        C(B=8, topk=4, depth=4, N=24, V=4096, decoys=True, name="cousin-decoys", seed=9),
        C(B=6, topk=6, depth=5, N=32, V=4096, accept="all", match="any", name="bfs-path-any-sibling", seed=10),
        C(B=6, topk=4, depth=4, N=20, V=4096, accept="none", name="none-accepted", seed=11),
        C(B=4, topk=8, depth=8, N=64, V=3000, accept="all", steps=3, name="truncated-at-s", seed=12),
        # single-node and chain-shaped trees
        C(B=4, topk=4, depth=3, N=1, V=4096, name="single-node", seed=13),
        C(B=4, topk=1, depth=5, N=6, V=4096, accept="all", name="chain-k1-d5-all", seed=14),
        C(B=6, topk=1, depth=7, N=8, V=32000, name="chain-k1-d7-mixed", seed=15),
        # padding requests, spare slots, the tail of a static logits buffer
        C(B=8, topk=4, depth=4, N=16, V=4096, padding=3, tail=5, name="padding-requests", seed=16),
        C(B=3, topk=4, depth=4, N=16, V=1024, padding=3, name="all-padding", seed=17),
        C(B=4, topk=8, depth=5, N=64, V=4096, spare=20, accept="all", name="spare-slots", seed=18),
        # rows permuted within each block (retrive_index is not b·N + i)
        C(B=5, topk=4, depth=4, N=20, V=4096, shuffled_rows=True, accept="all", match="any",
          name="shuffled-rows", seed=19),
        # ties in the logits (the argmax rule), tiny and chunk-edge vocabularies, index dtypes
        C(B=4, topk=4, depth=4, N=16, V=4097, values="coarse", name="coarse-ties-v4097", seed=20),
        C(B=4, topk=4, depth=3, N=12, V=2, name="v-two", seed=21),
        C(B=4, topk=4, depth=4, N=16, V=4095, cand_dtype="int32", index_dtype="int32", name="int32-everything",
          seed=22),
        C(B=4, topk=4, depth=4, N=16, V=4096, cand_dtype="int64", index_dtype="int32", row_pad=3,
          name="int32-tree-strided", seed=23),
    ]
    if big:
        cases += [
            C(B=64, topk=8, depth=5, N=64, V=128256, name="b64-k8-d5-n64-v128256", seed=40),
            C(B=32, topk=10, depth=8, N=64, V=151936, padding=5, accept="all", name="b32-k10-d8-n64-v151936", seed=41),
            C(B=1, topk=4, depth=3, N=8, V=160000, accept="all", name="b1-k4-d3-n8-v160k", seed=42),
        ]
    return cases


# ----------------------------------------------------------------------------- strategies

VOCABS = (2, 17, 1000, 4095, 4097, 32000)


@composite
def cases(draw, *, max_batch: int = 6, max_nodes: int = 64, vocabs=VOCABS):
    """Generated cases; shrink toward B = 1, top-k 1, one step, N = 1, the smallest vocabulary, no
    padding, contiguous rows."""
    from hypothesis import strategies as st

    B = draw(st.sampled_from((1, 1, *range(1, max_batch + 1))))
    topk = draw(st.sampled_from((1, 2, 4, 4, 8, 10)))
    depth = draw(st.integers(1, 8))
    N = draw(st.sampled_from((1, 2, 4, 8, 16, 24, 32, 48, 64)).filter(lambda n: n <= max_nodes))
    return VerifyTreeAcceptCase(
        B=B, topk=topk, depth=depth, N=N, V=draw(st.sampled_from(vocabs)),
        steps=draw(st.sampled_from((0, 0, 0, 1, 2, 3))),
        spare=draw(st.sampled_from((0, 0, 0, 1, N // 4))) if N > 1 else 0,
        order=draw(st.sampled_from(("bfs", "bfs", "dfs"))),
        accept=draw(st.sampled_from(ACCEPT + ("mixed",) * 2 + ("all",))),
        match=draw(st.sampled_from(MATCH)),
        dup_siblings=draw(st.sampled_from((0.0, 0.5, 1.0))),
        decoys=draw(st.booleans()),
        padding=draw(st.sampled_from((0, 0)) | st.integers(0, B)),
        shuffled_rows=draw(st.sampled_from((False, False, True))),
        row_pad=draw(st.sampled_from((0, 0, 3, 128))),
        tail=draw(st.sampled_from((0, 0, 2))),
        values=draw(st.sampled_from(("randn", "randn", "coarse"))),
        cand_dtype=draw(st.sampled_from(INDEX_DTYPES)),
        index_dtype=draw(st.sampled_from(INDEX_DTYPES)),
        seed=draw(st.integers(0, 2 ** 16)),
    )


# ----------------------------------------------------------------------------- trees

def eagle_tree(topk: int, depth: int, nodes: int, g: torch.Generator) -> list[int]:
    """The parents (−1 for the root) of an EAGLE-2 tree of at most ``nodes`` nodes, numbered level
    by level in creation order (SGLang's order): per step the top-k scoring nodes of the last level
    expand their top-k; the ``nodes − 1`` best of all levels are kept (ties: the earlier created).
    Fewer when the construction has fewer candidates."""
    import torch

    sharp = 0.5 + 3.0 * float(torch.rand((), generator=g))  # draft confidence: deep narrow or shallow wide

    def child_logp() -> list[float]:
        p = torch.softmax(torch.randn(topk, generator=g) * sharp, 0).sort(descending=True).values
        return torch.log(p).tolist()

    made = []  # (score, parent candidate or -1 for the root)
    frontier = [(0.0, -1)]  # (score, candidate index)
    for _ in range(depth):
        new = []
        for score, idx in frontier:
            for lp in child_logp():
                made.append((score + lp, idx))
                new.append((score + lp, len(made) - 1))
        frontier = sorted(new, key=lambda t: -t[0])[:topk]
    keep = sorted(sorted(range(len(made)), key=lambda i: (-made[i][0], i))[: nodes - 1])  # creation order
    slot = {c: k + 1 for k, c in enumerate(keep)}
    return [-1] + [0 if made[c][1] < 0 else slot[made[c][1]] for c in keep]


def _dfs_order(parents: list[int]) -> list[int]:
    """A depth-first (preorder) renumbering: new -> old node, children in their order."""
    kids = [[] for _ in parents]
    for i, p in enumerate(parents[1:], 1):
        kids[p].append(i)
    out, stack = [], [0]
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(reversed(kids[i]))
    return out


def request_tree(case: VerifyTreeAcceptCase, g: torch.Generator) -> list[int]:
    """One request's parents over its N slots: −2 for a spare slot, −1 for the root."""
    import torch

    parents = eagle_tree(case.topk, case.depth, max(1, case.N - case.spare), g)
    if case.order == "dfs":
        old = _dfs_order(parents)
        new_of = {o: n for n, o in enumerate(old)}
        parents = [-1] + [new_of[parents[o]] for o in old[1:]]
    n = len(parents)
    # spare slots at random places among 1..N-1; the tree's nodes keep their order
    used = [0] + sorted((torch.randperm(case.N - 1, generator=g)[: n - 1] + 1).tolist())
    out = [-2] * case.N
    for k, p in enumerate(parents):
        out[used[k]] = -1 if p < 0 else used[p]
    return out


def layout(parents: list[int]) -> tuple[list[int], list[int]]:
    """(next_token, next_sibling) of one request from its parents (children in index order)."""
    N = len(parents)
    nt, ns = [-1] * N, [-1] * N
    last = {}
    for i, p in enumerate(parents):
        if p < 0:
            continue
        if p in last:
            ns[last[p]] = i
        else:
            nt[p] = i
        last[p] = i
    return nt, ns


def depths(parents: list[int]) -> list[int]:
    """Each slot's level (root 0; −1 for a spare slot)."""
    d = [0] * len(parents)
    for i, p in enumerate(parents):
        d[i] = d[p] + 1 if p >= 0 else (0 if p == -1 else -1)
    return d


def _other(t: int, V: int, g: torch.Generator) -> int:
    import torch

    d = int(torch.randint(0, V - 1, (), generator=g))
    return d + (d >= t)  # uniform over the other V - 1 tokens


def real_requests(case: VerifyTreeAcceptCase) -> list[bool]:
    """Which requests are real (the others padding), drawn from the case's seed."""
    import torch

    g = torch.Generator().manual_seed(case.seed)
    real = torch.ones(case.B, dtype=torch.bool)
    real[torch.randperm(case.B, generator=g)[: case.padding]] = False
    return real.tolist()


def trees(case: VerifyTreeAcceptCase) -> list[list[int] | None]:
    """Each request's parents over its slots (``request_tree``; None for padding), each from a
    generator of its own seeded by the case's seed and the request."""
    import torch

    return [request_tree(case, torch.Generator().manual_seed(case.seed * 4096 + b + 1)) if r else None
            for b, r in enumerate(real_requests(case))]


def tree_tensors(case: VerifyTreeAcceptCase, pred: torch.Tensor) -> dict:
    """The tree of every request as CPU int64 tensors (candidates, retrive_index, retrive_next_token,
    retrive_next_sibling), its tokens planted against ``pred`` ((B·N,) the argmax of each target row,
    the chain's rule): the module docstring's path, duplicates and decoys."""
    import torch

    g = torch.Generator().manual_seed(case.seed + 1)
    B, N, V = case.B, case.N, case.V
    cand = torch.full((B, N), -1, dtype=torch.long)
    ri = torch.full((B, N), 0, dtype=torch.long)
    nt = torch.zeros((B, N), dtype=torch.long)  # padding requests keep pointers 0 (a loop, were they read)
    ns = torch.zeros((B, N), dtype=torch.long)
    for b, parents in enumerate(trees(case)):
        if parents is None:
            ri[b, 0] = -1
            continue
        perm = torch.randperm(N, generator=g) if case.shuffled_rows else torch.arange(N)
        ri[b] = b * N + perm
        nxt, sib = layout(parents)
        nt[b], ns[b] = torch.tensor(nxt), torch.tensor(sib)
        cand[b] = torch.randint(0, V, (N,), generator=g)
        depth = depths(parents)
        kids = [[c for c in range(N) if parents[c] == p] for p in range(N)]
        target = [int(pred[int(ri[b, i])]) for i in range(N)]
        cur, level = 0, 0
        while kids[cur]:
            t = target[cur]
            go = {"all": True, "none": False}.get(case.accept, bool(torch.rand((), generator=g) < 0.7))
            for c in kids[cur]:
                cand[b, c] = _other(t, V, g)
            if case.decoys:  # a cousin (the lowest-indexed node of the next level that is not cur's child)
                cousins = [c for c in range(N) if depth[c] == level + 1 and parents[c] != cur]
                if cousins:
                    cand[b, cousins[0]] = t
            if not go:
                break
            k = {"first": 0, "last": len(kids[cur]) - 1}.get(
                case.match, int(torch.randint(0, len(kids[cur]), (), generator=g)))
            chosen = kids[cur][k]
            cand[b, chosen] = t
            later = kids[cur][k + 1:]
            if later and torch.rand((), generator=g) < case.dup_siblings:
                cand[b, later[int(torch.randint(0, len(later), (), generator=g))]] = t
            cur, level = chosen, level + 1
    return dict(candidates=cand, retrive_index=ri, retrive_next_token=nt, retrive_next_sibling=ns)


def build_inputs(case: VerifyTreeAcceptCase, device) -> dict:
    """Keyword arguments of ``verify_tree_accept`` on ``device`` (a harness.devices.Device)."""
    import torch

    g = torch.Generator().manual_seed(case.seed)
    B, N, V = case.B, case.N, case.V
    R = B * N + case.tail
    x = torch.randn(R, V, generator=g)
    if case.values == "coarse":
        x = (2 * x).round() / 2
    x = x.bfloat16()
    x[B * N:] = float("inf")  # the buffer's tail: never read
    for b, real in enumerate(real_requests(case)):
        if not real:
            x[b * N:(b + 1) * N] = float("inf")  # padding requests' rows: never read
    tree = tree_tensors(case, torch.argmax(x, dim=-1))  # the chain's rule, only to craft the drafts
    storage = torch.full((R, V + case.row_pad), float("inf"), dtype=torch.bfloat16)
    storage[:, :V] = x
    dev = device.torch_device
    idx = getattr(torch, case.index_dtype)
    return dict(target_logits=storage.to(dev)[:, :V],
                candidates=tree["candidates"].to(getattr(torch, case.cand_dtype)).to(dev),
                **{k: tree[k].to(idx).to(dev) for k in ("retrive_index", "retrive_next_token", "retrive_next_sibling")},
                num_speculative_tokens=case.S)


def case_from_display(display: str) -> VerifyTreeAcceptCase:
    """The case behind a report row's ``case`` column (catalog name or full case id)."""
    named = {f"verify_tree_accept/{c.name}": c for c in catalog(big=True)}
    if display in named:
        return named[display]
    from cases.base import parse_case

    return parse_case(VerifyTreeAcceptCase, display.split(":", 1)[1])


def reach_facts(case: VerifyTreeAcceptCase) -> dict:
    """What the case alone does not say: the shape of the trees it builds (its real requests')."""
    ts = [t for t in trees(case) if t is not None] or [[-1]]
    return {"max_children": max(sum(1 for q in t if q == p) for t in ts for p in range(len(t))),
            "tree_depth": max(max(depths(t)) for t in ts)}


# Regions of the case space the generated cases must each reach (cases/reach.py: a fifth of the ci
# profile's draws, tests/test_reach.py): tree shapes (branching, depth, size), the walk's rules (where the
# match sits, duplicates, decoys, truncation), padding, layouts, dtypes
REACH = {
    "branching tree (a node with >= 2 children)": lambda c, f: f["max_children"] >= 2,
    "deep tree (>= 3 levels)": lambda c, f: f["tree_depth"] >= 3,
    "chain or single node (no branching)": lambda c, f: f["max_children"] <= 1,
    "large tree (N >= 32)": lambda c, f: c.N >= 32,
    "accept: all": lambda c, f: c.accept == "all",
    "accept: mixed or none": lambda c, f: c.accept != "all",
    "match not the first sibling": lambda c, f: c.match != "first",
    "duplicate siblings": lambda c, f: c.dup_siblings > 0,
    "cousin decoys": lambda c, f: c.decoys,
    "truncated walk (steps < depth)": lambda c, f: 0 < c.steps < c.depth,
    "depth-first numbering": lambda c, f: c.order == "dfs",
    "spare slots": lambda c, f: c.spare > 0,
    "padding requests": lambda c, f: c.padding > 0,
    "shuffled rows": lambda c, f: c.shuffled_rows,
    "padded rows (row stride > V)": lambda c, f: c.row_pad > 0,
    "several requests (B >= 4)": lambda c, f: c.B >= 4,
    "one request": lambda c, f: c.B == 1,
    "int32 tree": lambda c, f: c.index_dtype == "int32",
    "int64 tree": lambda c, f: c.index_dtype == "int64",
    "coarse logits (ties)": lambda c, f: c.values == "coarse",
}
