"""Mutants of verify_tree_accept: the bugs a tree walk can ship while a chain-shaped tree still
passes.

Four are the reference chain with one launch replaced (the walk's rules live in a few integer ops,
so the chain is where such a bug would be written); one is the real fused kernel told something
else. ``catches`` names the checks that flag each; ``tests/test_verify_tree_accept.py`` names the
catalog case that shows it and one where it hides.
"""
from __future__ import annotations

from harness.registry import Impl

OP = "verify_tree_accept"


def _fused():
    from fused.verify_tree_accept import wrapper as f

    return f


def _chain(*, first_fn=None, path_fn=None, bonus_fn=None, **kw):
    """The reference chain with launches swapped: ``first_fn`` (match, parent, rank) -> chosen (None: the
    chain's ``first_matches``);
    ``path_fn`` (candidates, target, parent, retrive_index, S) -> (accept_index, n) replaces
    launches 4–6; ``bonus_fn`` (predict, accept_index, n, retrive_index) -> predicts replaces 7."""
    from reference.verify_tree_accept import chain as ref

    first_fn = first_fn or ref.first_matches
    B, N, _, S = ref.validate(**kw)
    predict = ref.row_argmax(kw["target_logits"], B * N)
    target = ref.gather_targets(predict, kw["retrive_index"])
    parent, rank = ref.tree_parents(kw["retrive_next_token"], kw["retrive_next_sibling"])
    if path_fn is None:
        chosen = first_fn(ref.match(kw["candidates"], target, parent), parent, rank)
        acc, n = ref.accept_path(chosen, parent, kw["retrive_index"], S)
    else:
        acc, n = path_fn(kw["candidates"], target, parent, kw["retrive_index"], S)
    p = ref.write_predicts(predict, acc) if bonus_fn is None else bonus_fn(predict, acc, n, kw["retrive_index"])
    return {"predicts": p, "accept_index": acc, "accept_token_num": n}


def _last_sibling_wins(**kw):
    """Among matching siblings the LAST in list order is accepted (a scan that keeps overwriting its
    hit instead of stopping at the first)."""
    import torch

    def last(matched, parent, rank):
        B, N = matched.shape
        best = torch.full((B, N + 1), -1, dtype=torch.long, device=rank.device)
        best.scatter_reduce_(1, torch.where(matched, parent, N), torch.where(matched, rank, -1), reduce="amax")
        return matched & (best.gather(1, torch.where(matched, parent, N)) == rank)  # BUG: amax, not amin

    return _chain(first_fn=last, **kw)


def _first_child_only(**kw):
    """Only the first child of each node is compared (the sibling list never scanned: the tree walked
    as if it were a chain): a shorter path is accepted whenever the match is a later sibling."""
    from reference.verify_tree_accept import chain as ref

    def first_child(matched, parent, rank):
        return ref.first_matches(matched & (rank == 0), parent, rank)  # BUG: siblings never tried

    return _chain(first_fn=first_child, **kw)


def _bonus_at_node_n(**kw):
    """The bonus token read at node n (n = accepted drafts: chain indexing, ``retrive_index[b, n]``)
    instead of at the last accepted node; written where it belongs. Right on a path 0, 1, …, n only."""
    import torch

    from reference.verify_tree_accept import chain as ref

    def bonus(predict, acc, n, ri):
        p = ref.write_predicts(predict, acc).long()
        real = ri[:, 0] >= 0
        last = acc.long().gather(1, n.long()[:, None])[:, 0]  # the last accepted row
        wrong = ri.long().gather(1, n.long()[:, None])[:, 0]  # BUG: node n's row, not the last accepted node's
        rows = torch.where(real, last, p.shape[0])
        vals = predict[torch.where(real, wrong, 0)]
        out = torch.cat((p, p.new_full((1,), -1)))
        out.scatter_(0, rows, torch.where(real, vals, -1))
        return out[:-1].to(ref.OUT_DTYPE)

    return _chain(bonus_fn=bonus, **kw)


def _level_match(**kw):
    """The walk matches by level, not by parent: at each step it accepts the first node (in index
    order) one level deeper whose token is the target's, a child of the current node or not."""
    import torch

    from reference.verify_tree_accept import chain as ref

    def path(candidates, target, parent, ri, S):
        B, N = candidates.shape
        depth = torch.zeros((B, N), dtype=torch.long, device=candidates.device)
        for i in range(1, N):  # parents precede children
            p = parent[:, i]
            depth[:, i] = torch.where(p >= 0, depth.gather(1, p.clamp(min=0)[:, None])[:, 0] + 1, -1)
        real = ri[:, 0] >= 0
        cur = torch.zeros(B, dtype=torch.long, device=candidates.device)
        alive = real.clone()
        acc = torch.full((B, S), -1, dtype=torch.long, device=candidates.device)
        acc[:, 0] = torch.where(real, ri[:, 0].long(), -1)
        n = torch.zeros(B, dtype=torch.long, device=candidates.device)
        for d in range(1, S):
            t = target.gather(1, cur[:, None])
            ok = (depth == d) & (candidates.long() == t)  # BUG: any node of level d, not cur's children
            alive = alive & ok.any(1)
            cur = torch.where(alive, torch.argmax(ok.int(), dim=1), cur)
            acc[:, d] = torch.where(alive, ri.long().gather(1, cur[:, None])[:, 0], -1)
            n += alive.long()
        return acc.to(ref.OUT_DTYPE), n.to(ref.OUT_DTYPE)

    return _chain(path_fn=path, **kw)


def _rows_assumed_identity(**kw):
    """The real kernel given retrive_index = b·N + i (SGLang's usual layout assumed instead of read):
    with rows permuted within a block it argmaxes other nodes' rows and writes other entries."""
    import torch

    from reference.verify_tree_accept import chain as ref

    f = _fused()
    B, N, _, S = ref.validate(**kw)
    ri = kw["retrive_index"]
    ident = torch.arange(B * N, device=ri.device, dtype=ri.dtype).view(B, N)
    ident = torch.where(ri[:, :1] >= 0, ident, ri)  # padding stays padding
    dev = ri.device
    out = {"predicts": torch.empty((B * N,), dtype=ref.OUT_DTYPE, device=dev),
           "accept_index": torch.empty((B, S), dtype=ref.OUT_DTYPE, device=dev),
           "accept_token_num": torch.empty((B,), dtype=ref.OUT_DTYPE, device=dev)}
    f.launch(**out, target_logits=kw["target_logits"], candidates=kw["candidates"], retrive_index=ident,  # BUG
             retrive_next_token=kw["retrive_next_token"], retrive_next_sibling=kw["retrive_next_sibling"])
    return out


MUTANTS = [
    Impl(OP, "mutant-last-sibling-wins", "mutant", _last_sibling_wins,
         doc="sibling order: the last matching sibling in list order is accepted instead of the first; invisible "
             "unless two siblings carry the target's token, so the cases plant later duplicates",
         catches=("exact:accept_index", "exact:predicts")),
    Impl(OP, "mutant-first-child-only", "mutant", _first_child_only,
         doc="a shorter path accepted: only each node's first child is compared (the tree walked as a chain)",
         catches=("exact:accept_index", "exact:accept_token_num", "exact:predicts")),
    Impl(OP, "mutant-bonus-at-node-n", "mutant", _bonus_at_node_n,
         doc="the bonus token from the wrong node: node n's row (chain indexing) instead of the last accepted "
             "node's",
         catches=("exact:predicts",)),
    Impl(OP, "mutant-level-match", "mutant", _level_match,
         doc="a non-child followed: the walk accepts the first node one level down carrying the target token, "
             "whoever its parent",
         catches=("exact:accept_index", "exact:accept_token_num", "exact:predicts")),
    Impl(OP, "mutant-rows-assumed-identity", "mutant", _rows_assumed_identity,
         doc="kernel told retrive_index = b*N + i (the usual layout assumed, not read): wrong rows when a "
             "request's rows are permuted",
         catches=("exact:accept_index", "exact:predicts")),
]
