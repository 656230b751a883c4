"""The draft-tree timeline family (``Family.topk`` > 1): its trees and acceptance inputs are what they
claim, the backend commits exactly the accepted path, and each tree path mutant is caught by the check
aimed at it — and passes where its bug cannot show (a chain-shaped tree). The named tree timelines'
clean runs are in tests/test_timelines.py (every catalog timeline, every family)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cases import base, timeline_family
from cases.verify_tree_accept.catalog import layout
from cases import timelines as tl
from cases.mutants import timelines as mt
from harness.backend import CLEAN
from harness.timelines import path as path_mod
from harness.timelines import runner as timeline
from harness.timelines import tree
from harness.timelines.launches import ACCEPT_VOCAB
from harness.timelines.prepare import accept_spec
from reference import kv_model

FAMILY = "qwen35-gqa-tree"
FAM = tl.FAMILIES[FAMILY]
CATALOG = {t.name: t for t in tl.catalog() if t.family == FAMILY}
TREE_MUTANTS = {m.name: m for m in mt.PATH_MUTANTS if m.families == (FAMILY,)}
# a short tree timeline: every accepted depth but the full one, a decode reading the committed path
SHORT = tl.Timeline(family=FAMILY, steps="P:0.3;V:0.2;D:0;V:0.1;V:0.0", L=6, window=6, seed=3)
# the same on a chain-shaped tree (L = depth: one child a node, the nodes in path order)
SPINE = dataclasses.replace(SHORT, L=FAM.depth)


def _run(path, t, device, **kw):
    return timeline.run_timeline(path, t, device.torch_device, device.fp8_dtype, **kw)


def _explain(bad) -> str:
    return "\n".join(f"step {s.step} ({s.mode}) layer {s.layer} [{s.record.check}] {s.record.detail} {s.record.worst}"
                     for s in bad[:5])


def test_a_tree_family_on_a_ring_is_refused():
    """A ring puts a token at the slot of its position: siblings would share one. Refused by name."""
    with pytest.raises(ValueError, match="needs the paged layout"):
        dataclasses.replace(FAM, name="tree-on-a-ring", layout="ring")
    with pytest.raises(ValueError, match="depth >= 1"):
        dataclasses.replace(FAM, depth=0)
    with pytest.raises(ValueError, match="L: family qwen35-gqa-tree"):
        tl.validate(dataclasses.replace(SHORT, L=FAM.max_nodes() + 1))
    with pytest.raises(ValueError, match="past the tree's depth"):
        tl.validate(dataclasses.replace(SHORT, steps="P:0.3;V:0.4", L=6))
    assert timeline_family.Family("chain", "ring", "projection", 1, 1, 8, 8, 0, True, "generic", "pre").tree is False


@settings(max_examples=40, deadline=None)
@given(L=st.integers(1, 40), topk=st.integers(2, 4), depth=st.integers(1, 5), seed=st.integers(0, 2 ** 16))
def test_draft_tree_has_its_size_depth_and_fan_out(L, topk, depth, seed):
    fits = depth <= L <= sum(topk ** k for k in range(1, depth + 1))
    g = torch.Generator().manual_seed(seed)
    if not fits:
        with pytest.raises(ValueError, match="L: a tree of depth"):
            tree.draft_tree(L, topk, depth, g)
        return
    parents = tree.draft_tree(L, topk, depth, g)
    lv = tree.levels(parents)
    assert len(parents) == L + 1 and parents[0] == -1 and max(lv) == depth
    assert all(0 <= parents[i] < i for i in range(1, L + 1)), "a parent precedes its children"
    assert lv == sorted(lv), "numbered level by level"
    assert max(sum(p == i for p in parents) for i in range(L + 1)) <= topk
    mask = tree.truth_mask(parents)
    for i in range(1, L + 1):  # row i: itself and its ancestors (the root is history)
        seen = {j + 1 for j in range(L) if mask[i - 1, j]}
        assert seen == {i} | set(tree.ancestors(parents, i))
    got, topk_handed = CLEAN.tree_mask(FAM, [parents], "cpu")
    assert topk_handed == FAM.topk and torch.equal(got, mask.reshape(-1)), "the clean backend's mask is the truth's"
    assert CLEAN.tree_positions(0, 7, parents) == [7 + k - 1 for k in lv[1:]]


@settings(max_examples=25, deadline=None)
@given(L=st.integers(3, 14), seed=st.integers(0, 2 ** 16), B=st.integers(1, 3), data=st.data())
def test_acceptance_inputs_make_the_tree_ops_accept_the_chosen_path(L, seed, B, data):
    """The target logits built for a path: the tree acceptance op's reference and its oracle both accept
    exactly that path (rows root first), whatever its depth and however far down its sibling list."""
    g = torch.Generator().manual_seed(seed)
    trees = [tree.draft_tree(L, FAM.topk, FAM.depth, g) for _ in range(B)]
    paths = [tree.choose_path(p, data.draw(st.integers(0, FAM.depth)), g) for p in trees]
    args, want = tree.accept_inputs(trees, paths, FAM.depth + 1, ACCEPT_VOCAB, g, "cpu")
    spec = accept_spec("tree-accept")
    for fn in (spec.reference, spec.oracle):
        out = fn(**args)
        assert out["accept_token_num"].tolist() == [len(p) for p in paths]
        assert torch.equal(out["accept_index"].int(), want)


def test_named_tree_timelines_cover_every_depth_a_later_sibling_and_chain_steps():
    got = [(t.name, s, r, parents, path) for t in CATALOG.values() for s, r, parents, path in tree.timeline_trees(t)]
    depths = {len(path) for *_, path in got}
    assert depths == set(range(FAM.depth + 1)), depths
    later = [x for x in got if any(layout(x[3])[0][x[3][u]] != u for u in x[4])]
    assert later, "some accepted path goes through a sibling other than the first"
    assert any(t.pad for t in CATALOG.values()) and any(t.L == FAM.max_nodes() for t in CATALOG.values())
    assert any(t.L == FAM.depth for t in CATALOG.values()), "a chain-shaped tree"
    modes = {m for t in CATALOG.values() for m, _ in tl.parse_steps(t.steps)}
    assert modes == {"extend", "decode", "target_verify"}
    assert any(len(it) > 1 for t in CATALOG.values() for m, it in tl.parse_steps(t.steps) if m == "target_verify")


def test_strategy_draws_tree_timelines_within_the_tree():
    drawn = base.draw(tl.timelines(family=FAMILY), 30, rng_seed=0)  # each validated when drawn
    assert all(FAM.depth <= t.L <= FAM.max_nodes() for t in drawn)
    accepts = {a for t in drawn for m, it in tl.parse_steps(t.steps) if m == "target_verify" for _, a in it}
    assert accepts == set(range(FAM.depth + 1)) and any(t.L > FAM.depth + 2 for t in drawn)


def test_keep_path_keeps_the_path_in_order_and_frees_the_rest():
    m = kv_model.KVModel(kv_model.KVLayout("paged", 1, 4, 5, (2,), torch.bfloat16), 1, 9)
    m.alloc(0, [0, 1])
    chunk = m.alloc(0, [2, 3, 4, 5, 6]).tolist()
    free_before = len(m.free)
    m.keep_path(0, 2, [3, 1])
    assert m.table[0][2:] == [chunk[3], chunk[1]] and m.visible_len[0] == 4
    assert len(m.free) == free_before + 3 and {chunk[0], chunk[2], chunk[4]} <= set(m.free)
    assert m.alloc(0, [4]).tolist() == [min(chunk[0], chunk[2], chunk[4])], "freed slots come back (lowest first)"
    with pytest.raises(ValueError, match="paged"):
        kv_model.KVModel(kv_model.KVLayout("ring", 1, 4, 3, (2,), torch.bfloat16), 1, 8).keep_path(0, 0, [])


def test_clean_reference_path_passes_a_short_tree_timeline(registry, device):
    recs = _run(path_mod.clean_path(registry, FAMILY, prepare="reference", attn="reference", accept="reference"),
                SHORT, device)
    assert not path_mod.failures(recs), _explain(path_mod.failures(recs))
    checks = {s.record.check.split(":r")[0] for s in recs}
    assert {"accept:n", "accept:path", "input:tree-mask", "attn:o", "visible_kv", "state", "state:table"} <= checks


# each tree mutant: the checks that must flag it on SHORT, and the checks that flag it on a chain-shaped
# tree (SPINE), where most of these bugs cannot change what is computed
KILLS = {
    "path-tree-chain-commit": ({"state", "visible_kv"}, set()),  # the spine's path is its first a nodes
    "path-tree-path-reversed": ({"state", "visible_kv"}, {"state", "visible_kv"}),
    "path-tree-rejected-sibling-kept": ({"state:table", "visible_kv"}, {"state:table", "visible_kv"}),
    # causal over a chain is its tree mask: the output is right, only the mask handed over is not
    "path-tree-mask-dropped": ({"input:tree-mask", "attn:o"}, {"input:tree-mask"}),
    "path-tree-positions-by-index": ({"input:positions"}, set()),  # a spine node's index is its depth − 1
}


def test_every_tree_mutant_has_a_kill_here():
    assert set(KILLS) == set(TREE_MUTANTS)


@pytest.mark.parametrize("name", sorted(KILLS))
def test_tree_mutant_is_caught_by_its_check_and_only_where_its_bug_shows(registry, device, name):
    m = TREE_MUTANTS[name]
    want, on_spine = KILLS[name]
    bad = path_mod.failures(_run(m.path(registry, FAMILY), SHORT, device))
    flagged = {s.record.check.split(":r")[0] for s in bad}
    assert want <= flagged, f"{name}: flagged {sorted(flagged)}\n{_explain(bad)}"
    assert all(s.mode != "extend" for s in bad), "prefill is right: the bug is in the tree's verify or after it"
    spine_bad = path_mod.failures(_run(m.path(registry, FAMILY), SPINE, device))
    got = {s.record.check.split(":r")[0] for s in spine_bad}
    assert on_spine <= got if on_spine else not got, f"{name} on a chain-shaped tree:\n{_explain(spine_bad)}"
    if name == "path-tree-mask-dropped":
        assert "attn:o" not in got, "causal attention over a chain-shaped tree is its tree attention"


def test_the_backend_commits_the_path_the_tree_acceptance_op_accepted(registry, device):
    """A tree acceptance op that walks first children only (a registered mutant) accepts a shorter path
    where the script's goes through a later sibling: ``accept:n`` / ``accept:path`` flag it, and the
    backend, committing the op's path, holds other rows than the truth (``state``)."""
    t = CATALOG[f"{FAMILY}/accept-0-to-L"]
    clean = path_mod.clean_path(registry, FAMILY)
    assert clean.accept.key == "verify_tree_accept/fused"  # the tree family's accept role
    path = dataclasses.replace(clean, accept=registry.impls["verify_tree_accept/mutant-first-child-only"])
    bad = path_mod.failures(_run(path, t, device))
    flagged = {s.record.check.split(":r")[0] for s in bad}
    assert {"accept:n", "accept:path", "state:table"} <= flagged, _explain(bad)
