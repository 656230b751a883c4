"""verify_tree_accept: exact parity of the fused kernel (and torch.compile of the chain) with the
reference chain, the chain against the independent SGLang-walk oracle, the walk's rules on
hand-built trees, agreement with verify_accept on chain-shaped trees, typed errors, the strategies
and the catalog's plants, the benchmark's CPU path, and the planted bugs."""
from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, find, given, settings

from cases import base
from cases.verify_tree_accept import catalog as cases
from fused.verify_tree_accept import wrapper as fused
from harness.parity import runners
from reference import checks
from reference.verify_accept import chain as chain_ref
from reference.verify_tree_accept import chain as ref
from tests.helpers import assert_passes, bad_inputs, failed_checks

OP = "verify_tree_accept"
CATALOG = {c.name: c for c in cases.catalog()}
OUTPUTS = ("predicts", "accept_index", "accept_token_num")


def _equal(a, b) -> bool:
    return all(torch.equal(a[k].cpu(), b[k].cpu()) for k in OUTPUTS)


# ----------------------------------------------------------------------------- parity

@pytest.mark.parametrize("name", sorted(CATALOG))
@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_catalog_parity(spec, registry, device, impl, name):
    """Every check of the suite (exact outputs, inputs untouched, determinism, poisoned allocations)."""
    assert_passes(spec, registry.impls[f"{OP}/{impl}"], CATALOG[name], device)


@pytest.mark.parametrize("name", ["padding-requests"])
def test_compiled_chain_parity(spec, registry, device, name):
    assert_passes(spec, registry.impls[f"{OP}/compiled"], CATALOG[name], device)


@given(case=cases.cases(max_batch=4, max_nodes=32, vocabs=(2, 17, 1000, 4097)))
def test_generated_parity_fused(spec, registry, device, case):
    res = runners.run_case(spec, registry.impls[f"{OP}/fused"], case, device, determinism=False, poisoned=False)
    bad = [r for r in res.records if not r.passed]
    assert res.records and not bad, [(r.check, r.detail, r.worst) for r in bad]


def test_reference_matches_the_oracle(device):
    """The chain's set formulation (parents, ranks, first matches, level walk) against the oracle's
    pointer walk with NumPy's argmax."""
    drawn = list(CATALOG.values()) + base.draw(cases.cases(), 60, rng_seed=3)
    for c in drawn:
        kw = cases.build_inputs(c, device)
        assert _equal(ref.verify_tree_accept(**kw), ref.verify_tree_accept_oracle(**kw)), c


def test_chain_shaped_trees_accept_what_verify_accept_accepts(device):
    """A top-k 1 tree is a chain: its accept length and tokens are verify_accept's on the same rows."""
    for c in (CATALOG["chain-k1-d5-all"], CATALOG["chain-k1-d7-mixed"]):
        kw = cases.build_inputs(c, device)
        N = c.N
        out = fused.verify_tree_accept(**kw)
        L = N - 1
        drafts = kw["candidates"][:, 1:].contiguous().flatten()
        qo = torch.arange(0, c.B * N + 1, N, dtype=torch.int32, device=kw["candidates"].device)
        chain = chain_ref.verify_accept(target_logits=kw["target_logits"][:c.B * N], draft_tokens=drafts,
                                        qo_indptr=qo)
        assert torch.equal(out["accept_token_num"].cpu(), chain["accept_length"].cpu())
        p = out["predicts"].cpu().view(c.B, N)
        for b in range(c.B):
            n = int(out["accept_token_num"][b])
            assert p[b, : n + 1].tolist() == chain["output_ids"][b, : n + 1].cpu().tolist()
            assert (p[b, n + 1:] == -1).all() and n <= L


# ----------------------------------------------------------------------------- the walk on hand-built trees

def _tree_inputs(device, parents, tokens, target, S, V=10):
    """One request: ``parents`` (−1 root, −2 spare), node tokens, the target's token at each node's row."""
    N = len(parents)
    nt, ns = cases.layout(parents)
    x = torch.zeros(N, V)
    x[torch.arange(N), torch.tensor(target)] = 1.0
    dev = device.torch_device
    return dict(target_logits=x.bfloat16().to(dev), candidates=torch.tensor([tokens], device=dev),
                retrive_index=torch.arange(N, device=dev)[None], retrive_next_token=torch.tensor([nt], device=dev),
                retrive_next_sibling=torch.tensor([ns], device=dev), num_speculative_tokens=S)


WALKS = [
    # (parents, tokens, target at each node's row, S, accept_index, accept_token_num, predicts): checked by hand
    # root 0 with children 1, 2, 3; 2 has children 4, 5. Target after root: 5 -> node 2 (second sibling);
    # after node 2: 6 -> node 5 (second child); after node 5: bonus 7
    ([-1, 0, 0, 0, 2, 2], [9, 1, 5, 3, 2, 6], [5, 0, 6, 0, 0, 7], 4, [0, 2, 5, -1], 2, [5, -1, 6, -1, -1, 7]),
    # two siblings carry the target token: the first in list order (node 1) wins, though node 2 goes deeper
    ([-1, 0, 0, 2], [0, 4, 4, 3], [4, 1, 3, 0], 4, [0, 1, -1, -1], 1, [4, 1, -1, -1]),
    # no child matches: only the root; the bonus is the target's token at the root's row
    ([-1, 0, 0], [0, 1, 2], [3, 0, 0], 3, [0, -1, -1], 0, [3, -1, -1]),
    # a cousin (node 3, child of 1) carries the token the target wants after node 2: not followed
    ([-1, 0, 0, 1, 2], [0, 1, 2, 7, 5], [2, 0, 7, 0, 0], 3, [0, 2, -1], 1, [2, -1, 7, -1, -1]),
    # S = 2 truncates a path that matches twice
    ([-1, 0, 1], [0, 1, 2], [1, 2, 3], 2, [0, 1], 1, [1, 2, -1]),
    # a spare slot (no pointer reaches it) carrying the token is never accepted
    ([-1, -2, 0], [0, 4, 5], [4, 0, 1], 3, [0, -1, -1], 0, [4, -1, -1]),
    # one node: the root alone
    ([-1], [3], [6], 1, [0], 0, [6]),
]


@pytest.mark.parametrize("walk", range(len(WALKS)))
@pytest.mark.parametrize("impl", ["reference", "oracle", "fused"])
def test_walk_on_hand_built_trees(device, impl, walk):
    parents, tokens, target, S, acc, n, pred = WALKS[walk]
    fn = {"reference": ref.verify_tree_accept, "oracle": ref.verify_tree_accept_oracle,
          "fused": fused.verify_tree_accept}[impl]
    out = fn(**_tree_inputs(device, parents, tokens, target, S))
    assert out["accept_index"][0].tolist() == acc and int(out["accept_token_num"][0]) == n
    assert out["predicts"].tolist() == pred


def test_padding_request_reads_nothing(device):
    """retrive_index[b, 0] < 0: every other entry of the request may hold anything (pointers 0, a
    node 0 that is its own child; tokens out of range) and its rows may be NaN."""
    kw = cases.build_inputs(CATALOG["padding-requests"], device)
    pad = [b for b, r in enumerate(cases.real_requests(CATALOG["padding-requests"])) if not r]
    N = kw["candidates"].shape[1]
    for b in pad:
        kw["candidates"][b] = 10 ** 6
        kw["retrive_index"][b, 1:] = 7
        kw["target_logits"][b * N:(b + 1) * N] = float("nan")
    for fn in (ref.verify_tree_accept, fused.verify_tree_accept):
        out = fn(**kw)
        for b in pad:
            assert (out["accept_index"][b] == -1).all() and int(out["accept_token_num"][b]) == 0
            assert (out["predicts"][b * N:(b + 1) * N] == -1).all()


# ----------------------------------------------------------------------------- bad input

def _kw(device, **over):
    kw = cases.build_inputs(cases.VerifyTreeAcceptCase(B=3, topk=2, depth=3, N=6, V=50, padding=1, seed=1), device)
    kw.update(over)
    return kw


def _real(kw) -> int:
    return int(torch.nonzero(kw["retrive_index"][:, 0].cpu() >= 0)[0])


def _set(kw, name, b, i, v):
    t = kw[name].clone()
    t[b, i] = v
    return t


def _backward_sibling(kw):
    b = _real(kw)
    ns = kw["retrive_next_sibling"].clone()
    ns[b, 2] = 1  # points back
    return ns


def _two_parents(kw):
    """Node 1 is the root's first child; make node 2's first child node... a later node also pointed
    to by a sibling link: two incoming pointers."""
    b = _real(kw)
    N = kw["candidates"].shape[1]
    nt, ns = kw["retrive_next_token"].clone(), kw["retrive_next_sibling"].clone()
    nt[b, 1], ns[b, 2] = N - 1, N - 1
    return {"retrive_next_token": nt, "retrive_next_sibling": ns}


BAD = [
    ("target_logits", lambda kw: kw["target_logits"][0], checks.RankError),
    ("target_logits", lambda kw: kw["target_logits"].float(), checks.DTypeError),
    ("target_logits", lambda kw: kw["target_logits"].t().contiguous().t(), checks.LayoutError),
    ("target_logits", lambda kw: kw["target_logits"][:, :0], checks.ShapeError),
    ("target_logits", lambda kw: kw["target_logits"][:5], checks.ShapeError),  # fewer rows than B·N
    ("candidates", lambda kw: kw["candidates"].flatten(), checks.RankError),
    ("candidates", lambda kw: kw["candidates"].float(), checks.DTypeError),
    ("candidates", lambda kw: kw["candidates"][:0], checks.ShapeError),
    ("candidates", lambda kw: _set(kw, "candidates", _real(kw), 2, 50), checks.RangeError),
    ("candidates", lambda kw: _set(kw, "candidates", _real(kw), 0, -1), checks.RangeError),  # the root too
    ("retrive_index", lambda kw: kw["retrive_index"][:, :5], checks.ShapeError),
    ("retrive_index", lambda kw: kw["retrive_index"].t().contiguous().t(), checks.LayoutError),
    ("retrive_index", lambda kw: _set(kw, "retrive_index", _real(kw), 1, int(kw["retrive_index"][_real(kw), 2])),
     checks.RangeError),  # a repeated row
    ("retrive_index", lambda kw: _set(kw, "retrive_index", _real(kw), 1, 10 ** 6), checks.RangeError),
    ("retrive_next_token", lambda kw: _set(kw, "retrive_next_token", _real(kw), 2, 2), checks.RangeError),  # itself
    ("retrive_next_token", lambda kw: _set(kw, "retrive_next_token", _real(kw), 0, 6), checks.RangeError),  # past N
    ("retrive_next_token", lambda kw: kw["retrive_next_token"].to(torch.int16), checks.DTypeError),
    ("retrive_next_sibling", _backward_sibling, checks.RangeError),
    ("retrive_next_sibling", _two_parents, checks.RangeError),
    ("num_speculative_tokens", lambda kw: 0, checks.RangeError),
    ("num_speculative_tokens", lambda kw: 2.0, checks.DTypeError),
]


@pytest.mark.parametrize("impl", ["reference", "fused"])
@bad_inputs(BAD)
def test_bad_input_is_a_typed_error_naming_the_argument(device, impl, arg, make, err):
    fn = ref.verify_tree_accept if impl == "reference" else fused.verify_tree_accept
    kw = _kw(device)
    new = make(kw)
    for name, t in (new if isinstance(new, dict) else {arg: new}).items():
        kw[name] = t.to(device.torch_device) if isinstance(t, torch.Tensor) else t
    with pytest.raises(err) as info:
        fn(**kw)
    assert info.value.arg == arg


# ----------------------------------------------------------------------------- strategies and plants

REACH = {
    "padding": lambda c: 0 < c.padding < c.B,
    "dfs": lambda c: c.order == "dfs",
    "chain": lambda c: c.topk == 1 and c.N > 2,
    "single-node": lambda c: c.N == 1,
    "truncated": lambda c: 0 < c.steps < c.depth,
    "dup-decoys": lambda c: c.dup_siblings == 1.0 and c.decoys,
    "big-tree": lambda c: c.N == 64 and c.topk >= 8 and c.depth >= 5,
    "shuffled-strided": lambda c: c.shuffled_rows and c.row_pad > 0,
    "int32": lambda c: c.index_dtype == "int32" and c.cand_dtype == "int32",
}


@pytest.mark.parametrize("what", sorted(REACH))
def test_strategy_reaches(what):
    found = find(cases.cases(), REACH[what], settings=settings(max_examples=2000, database=None,
                                                               phases=[Phase.generate]))
    assert REACH[what](found)


def test_trees_are_eagle_shaped():
    """Every catalog tree: N slots, the root at 0, parents before children, at most top-k children a
    node, at most ``depth`` levels, ``spare`` slots outside it; top-k 1 a chain; a large EAGLE
    construction fills its 64 slots."""
    for c in CATALOG.values():
        for t in cases.trees(c):
            if t is None:
                continue
            assert len(t) == c.N and t[0] == -1, c.name
            assert all(p < i for i, p in enumerate(t) if p >= 0), c.name
            assert max((sum(1 for q in t if q == p) for p in range(c.N)), default=0) <= c.topk, c.name
            assert max(cases.depths(t)) <= c.depth, c.name
            assert sum(1 for p in t if p == -2) >= c.spare, c.name
    full = cases.trees(cases.VerifyTreeAcceptCase(B=1, topk=10, depth=8, N=64, seed=3))[0]
    assert -2 not in full


def test_cases_plant_what_they_say(device):
    """Duplicate siblings after the accepted child; cousin decoys; permuted rows; +inf tail and pad columns."""
    c = CATALOG["duplicate-siblings"]
    kw = cases.build_inputs(c, device)
    out = ref.verify_tree_accept(**kw)
    cand = kw["candidates"].cpu()
    parents = cases.trees(c)
    dup = 0
    for b in range(c.B):
        acc = [int(r) - b * c.N for r in out["accept_index"][b] if r >= 0]
        for child in acc[1:]:
            p = parents[b][child]
            sibs = [k for k in range(c.N) if parents[b][k] == p]
            dup += any(int(cand[b, k]) == int(cand[b, child]) for k in sibs if k > child)
    assert dup > 0
    kw = cases.build_inputs(CATALOG["shuffled-rows"], device)
    N = CATALOG["shuffled-rows"].N
    assert (kw["retrive_index"].cpu() != torch.arange(kw["retrive_index"].numel()).view(-1, N)).any()
    kw = cases.build_inputs(CATALOG["padding-requests"], device)
    x = kw["target_logits"]
    assert torch.isposinf(x[kw["candidates"].numel():].cpu().float()).all()
    kw = cases.build_inputs(CATALOG["eagle-k4-d5-n16-v128256-strided"], device)
    assert kw["target_logits"].stride(0) == 128256 + 256


# ----------------------------------------------------------------------------- the benchmark on the CPU

def test_bench_run_loop_on_tiny_shapes(device, monkeypatch, tmp_path):
    """The benchmark's run loop with the measurement faked (every callable still runs once, the fused
    kernel under the interpreter): one PerfRow per impl, the wide CSV, 0 mismatches, path rows > B."""
    import pandas as pd

    from cases.verify_tree_accept import bench as vb
    from harness.bench import perf
    from harness.bench import perf_rows as pr
    from harness.gpu import profiling
    from harness.parity.suite import provenance

    monkeypatch.setattr(profiling, "time_quantiles_us", lambda fn, warmup=25, rep=100: (1.0, 2.0, 3.0))
    monkeypatch.setattr(profiling, "count_launches", lambda fn, warmup=1: 1)
    monkeypatch.setattr(perf, "compile_static", lambda fn: fn)
    ctx = perf.Context(dev=device, prov=provenance(device, perf.QUICK, 0), copy_gbps=100.0, sms=4)
    shape_list = [vb.Shape(B=2, V=300), vb.Shape(B=3, V=4097)]
    rows = perf.run_shapes(vb, shape_list, ctx, tmp_path)
    assert [r.impl for r in rows] == list(vb.IMPLS) * 2 and {r.op for r in rows} == {OP}
    wide = pd.read_csv(tmp_path / "verify_tree_accept_bench.csv")
    assert wide["mismatches"].tolist() == [0, 0] and wide["V"].tolist() == [300, 4097]
    assert (wide["path_rows"] > wide["B"]).all()  # every request accepted something
    assert not pr.launch_failures(rows, {OP: vb.EXPECTED_LAUNCHES})


# ----------------------------------------------------------------------------- the harness bites

MUTANT_PROOF = {
    # mutant: (a catalog case it must fail on, the checks that must flag it there, a case where it hides)
    "mutant-last-sibling-wins": ("duplicate-siblings", {"exact:accept_index", "exact:predicts"},
                                 "match-last-sibling"),  # no duplicates: one match per level
    "mutant-first-child-only": ("match-last-sibling", {"exact:accept_index", "exact:accept_token_num"},
                                "duplicate-siblings"),  # every accepted child is the first
    "mutant-bonus-at-node-n": ("bfs-path-any-sibling", {"exact:predicts"},
                               "chain-k1-d5-all"),  # a chain's path is 0, 1, ..., n
    "mutant-level-match": ("cousin-decoys", {"exact:accept_index", "exact:accept_token_num"},
                           "match-last-sibling"),  # no cousin carries the token
    "mutant-rows-assumed-identity": ("shuffled-rows", {"exact:accept_index", "exact:predicts"},
                                     "eagle-k8-d5-n64-v32000"),  # rows b·N + i
}


def test_every_mutant_has_a_proof(registry):
    assert {i.name for i in registry.for_op(OP, ("mutant",))} == set(MUTANT_PROOF)


@pytest.mark.parametrize("mutant", sorted(MUTANT_PROOF))
def test_mutant_is_flagged(spec, registry, device, mutant):
    case_name, checks_, _ = MUTANT_PROOF[mutant]
    impl = registry.impls[f"{OP}/{mutant}"]
    bad = set(failed_checks(spec, impl, CATALOG[case_name], device))
    assert checks_ <= bad, f"{mutant} on {case_name}: failing checks {sorted(bad)}"
    assert set(impl.catches) <= bad


@pytest.mark.parametrize("mutant", sorted(MUTANT_PROOF))
def test_mutants_hide_where_the_catalog_would_miss_them(spec, registry, device, mutant):
    """Why the catalog carries duplicates, later-sibling matches, non-consecutive paths, decoys and
    permuted rows: without them these bugs pass."""
    assert_passes(spec, registry.impls[f"{OP}/{mutant}"], CATALOG[MUTANT_PROOF[mutant][2]], device)


def test_kill_plan_cases_are_the_mutants_proofs(spec):
    assert set(spec.kill.cases) == {case for case, _, _ in MUTANT_PROOF.values()}
    assert set(spec.kill.clean) == {"reference", "fused"}
    from cases import timelines as tl

    # its timeline: a draft-tree family's, whose verify steps run this op (role tree-accept)
    assert spec.kill.timelines == ("qwen35-gqa-tree/accept-0-to-L",)
    assert all(tl.FAMILIES[name.split("/")[0]].tree for name in spec.kill.timelines)


def test_kill_matrix_kills_every_mutant_on_the_targeted_cases(registry, device):
    from harness.mutants import killmatrix

    rows = killmatrix.build(registry, device, only=f"{OP}/", progress=None)
    survivors, broken = killmatrix.verdict(rows)
    assert not survivors and not broken
    assert {r.subject for r in rows if r.kind == "mutant"} == {f"{OP}/{m}" for m in MUTANT_PROOF}


# ----------------------------------------------------------------------------- the GPU plan, on the CPU

@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_gpu_plan_launches_and_graph_under_the_interpreter(spec, registry, device, impl):
    """``harness.gpu.runners`` on the plan's case with the interpreter stand-ins of
    ``tests/test_gpu_checks.py``: the fused call is one kernel, the chain seven stage calls; replayed
    as captured (validate's value checks off) it equals eager; no dispatch gate: the gate row skips."""
    if not device.interpreted:
        pytest.skip("interpreter stand-ins; on a GPU tests/test_gpu_checks.py runs the real ones")
    from harness.gpu import runners as gr
    from tests.test_gpu_checks import _baked_capture, _count, _names

    case = {c.name: c for c in cases.catalog(big=True)}[spec.gpu.cases[0]]
    assert spec.gpu.full in {c.name for c in cases.catalog(big=True)}
    fn = registry.impls[f"{OP}/{impl}"]
    launches = gr.check_launches(spec, fn, case, device, count=_count, names=_names)
    if impl == "fused":
        assert launches.passed, launches
    else:
        assert launches.got == f"7 launches ({', '.join(sorted(spec.gpu.stages))}); 0 device kernels"
    replay, gate = gr.check_graph(spec, fn, case, device, 0, capture=_baked_capture(OP))
    assert replay.passed, replay
    assert gate.passed is None and "no dispatch gate" in gate.detail
