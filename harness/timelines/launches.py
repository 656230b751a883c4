"""The attention and acceptance launches of a timeline step, each with its checks (the prepare
launch is the family's ``harness.prepares`` adapter's): ``attend`` runs the path's attention op on
what the backend hands it (the reference op for extend: prefill is setup) and records
``input:attn-indptr``, ``visible_kv:*`` and ``finite:attn:o`` / ``attn:o`` against the fp64 oracle
over the logical history; ``accept`` runs the path's acceptance op on logits whose greedy acceptance
is the script's and records ``accept:n``. Both take the ``harness.timelines.runner.TimelineRun`` whose step
it is and record through it."""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import torch

from harness import compare
from harness.timelines import tree as tree_mod
from harness.timelines import truth as timeline_truth
from harness.timelines.prepare import accept_spec, attention_spec, chunk_kv, exact_check, kv_views

if TYPE_CHECKING:
    from harness.timelines.runner import TimelineRun

ACCEPT_VOCAB = 16  # the acceptance step's target logits: (rows, ACCEPT_VOCAB) bf16


def accept(tr: TimelineRun, step, items) -> list[int]:
    """accept(n) of a verify step: the path's acceptance op on target logits whose greedy acceptance
    is the script's a per request (``timeline_truth.accept_inputs``) -> its n per request (what the
    backend keeps); ``accept:n`` records whether it is the script's."""
    args = timeline_truth.accept_inputs([a for _, a in items], tr.t.L, ACCEPT_VOCAB, tr.accept_g, tr.device)
    fn = tr.path.accept.fn if tr.path.accept is not None else accept_spec().reference
    n = fn(**args)["accept_length"]
    want = torch.tensor([a for _, a in items], dtype=n.dtype, device=n.device)
    tr.record(step, "target_verify", -1, "timeline", exact_check("accept:n", n, want))
    return [int(k) for k in n.tolist()]


def accept_tree(tr: TimelineRun, step, items, trees: dict, paths: dict) -> list[list[int]]:
    """A tree family's accept: the path's tree acceptance op (role ``tree-accept``) on target logits whose
    greedy walk accepts the script's path per request (``harness.timelines.tree.accept_inputs``);
    ``accept:n`` (its accept_token_num) and ``accept:path`` (its accept_index: the path's rows, root
    first, −1 after) are recorded against the script's. -> per request the path the op accepted as
    chunk indices in path order (its rows b·N + node, node − 1: what the backend commits)."""
    reqs = [r for r, _ in items]
    args, want = tree_mod.accept_inputs([trees[r] for r in reqs], [paths[r] for r in reqs], tr.fam.depth + 1,
                                        ACCEPT_VOCAB, tr.accept_g, tr.device)
    fn = tr.path.accept.fn if tr.path.accept is not None else accept_spec("tree-accept").reference
    out = fn(**args)
    n, acc = out["accept_token_num"], out["accept_index"]
    tr.record(step, "target_verify", -1, "timeline", exact_check(
        "accept:n", n, torch.tensor([len(paths[r]) for r in reqs], dtype=n.dtype, device=n.device)))
    tr.record(step, "target_verify", -1, "timeline", exact_check("accept:path", acc, want.to(acc.dtype)))
    N = tr.t.L + 1
    return [[row - b * N - 1 for row in rows[1: 1 + k]] for b, (rows, k) in enumerate(zip(acc.tolist(), n.tolist()))]


def attend(tr: TimelineRun, step, mode, layer, q, k_d, v_d, chunk_rows, buf, owners, loc_logical, *, as_history,
           one_source, tree=None):
    """Layer ``layer``'s attention of a step: the path's attention op (the reference op in extend) on the
    chunk ``k_d``/``v_d`` and the pool ``buf`` through the backend's page table (``as_history``: the
    chunk read as history; ``one_source``: the chunk came from the pool), with its checks recorded on
    ``tr``. ``tree``: a tree family's verify, (the backend's custom_mask, its topk, the truth's mask
    (Σ L² ,) bool): ``input:tree-mask`` checks the first against the last, the oracle takes the truth's.
    Returns its output ``o``."""
    fam, kv = tr.fam, tr.kv
    kb, vb = kv_views(fam, buf)
    qo, kvp, idx = tr.backend.read_meta(kv, owners, loc_logical, as_history, tr.device)
    custom_mask, topk = (tree[0], tree[1]) if tree else (None, 1)
    args = dict(q=q.contiguous(), k=k_d.contiguous(), v=v_d.contiguous(), k_buffer=kb, v_buffer=vb,
                qo_indptr=qo, kv_indptr=kvp, kv_indices=idx.contiguous(), sm_scale=1.0 / math.sqrt(fam.D),
                is_causal=fam.causal, k_scale=fam.kv_descale, v_scale=fam.kv_descale, num_kv_splits=fam.splits,
                custom_mask=custom_mask, o=None, topk=topk, model_family=fam.model_family, splitkv_switch=True)
    attention = attention_spec()
    if mode == "extend":
        out = attention.reference(**args)  # prefill is setup, not the path under test
    else:
        out = tr.path.attn.fn(**args)
    o = out["o"]
    # the page table against the request: each chunk's width and history length
    hist_rows = [kv.truth_history(layer, r) for r, _ in owners]
    lens = [h.shape[0] for h in hist_rows]
    starts = [0] + list(itertools.accumulate(c for _, c in owners))
    qo_l = torch.tensor(starts, device=tr.device).to(torch.int32)
    kvp_l = torch.tensor([0] + list(itertools.accumulate(lens)), device=tr.device).to(torch.int32)
    tr.record(step, mode, layer, "timeline", exact_check("input:attn-indptr", torch.cat((qo, kvp)),
                                                         torch.cat((qo_l, kvp_l))))
    if tree:  # the tree mask handed to attention: each token sees itself and its ancestors, no other draft
        if custom_mask is None or topk != fam.topk:
            given = "None" if custom_mask is None else "given"
            tr.record(step, mode, layer, "timeline", compare.Record(
                "input:tree-mask", False, detail=f"topk {topk}, custom_mask {given}: a tree of top-k {fam.topk} "
                                                 f"attended without its mask"))
        else:
            tr.record(step, mode, layer, "timeline", exact_check("input:tree-mask", custom_mask, tree[2]))
    # visible KV: every row read equals the request's logical history, row count included (the
    # page table read on the host in one transfer: each group's rows are gathered without a wait)
    meta = torch.cat((qo.reshape(-1).long(), kvp.reshape(-1).long(), idx.reshape(-1).long())).tolist()
    qo_h, kvp_h = meta[: qo.numel()], meta[qo.numel(): qo.numel() + kvp.numel()]
    idx_h = meta[qo.numel() + kvp.numel():]
    for g in range(qo.shape[0] - 1):
        r = owners[max(i for i, s in enumerate(starts[:-1]) if s <= qo_h[g])][0]
        rows_read = [x for x in idx_h[kvp_h[g]: kvp_h[g + 1]] if 0 <= x < buf.shape[0]]
        got = buf[torch.tensor(rows_read, dtype=torch.int64, device=buf.device)]
        tr.record(step, mode, layer, "timeline", exact_check(f"visible_kv:r{r}", got, kv.truth_history(layer, r)))
    if one_source:  # the chunk itself came from the pool: it must be the chunk's logical rows
        tr.record(step, mode, layer, "timeline", exact_check("visible_kv:chunk", k_d, chunk_kv(fam, chunk_rows)[0]))
    # attention against the oracle over the logical history + the logical chunk
    lk, lv = chunk_kv(fam, chunk_rows)
    lbuf = torch.cat(hist_rows) if hist_rows else buf[:0]
    lkb, lvb = kv_views(fam, lbuf)
    largs = dict(args, k=lk.contiguous(), v=lv.contiguous(), k_buffer=lkb, v_buffer=lvb, qo_indptr=qo_l,
                 kv_indptr=kvp_l, kv_indices=torch.arange(sum(lens), dtype=torch.int32, device=tr.device))
    if tree:  # the truth's draft rule
        largs.update(custom_mask=tree[2], topk=fam.topk)
    oracle = attention.oracle(**largs)["o"]
    ref = attention.reference(**largs)["o"]
    tol = attention.tolerance("o", torch.bfloat16)
    tr.record_numeric(step, mode, layer, "attn:o", o, oracle, ref, tol)
    return o
