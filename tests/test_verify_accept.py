"""verify_accept: exact parity of the fused kernel (and torch.compile of the chain) with the
reference chain, the chain against an independent NumPy oracle, the argmax rule on hand-checked
rows, typed errors, the strategies, the benchmark's CPU path, and the planted bugs."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from cases import base
from cases.verify_accept import catalog as cases
from fused.verify_accept import wrapper as fused
from harness.parity import runners
from reference import checks
from reference.verify_accept import chain as ref
from tests.helpers import assert_passes, bad_inputs, failed_checks

OP = "verify_accept"
CATALOG = {c.name: c for c in cases.catalog()}
NAN, INF = float("nan"), float("inf")


# ----------------------------------------------------------------------------- parity

@pytest.mark.parametrize("name", sorted(CATALOG))
@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_catalog_parity(spec, registry, device, impl, name):
    """Every check of the suite (exact outputs, inputs untouched, determinism, poisoned allocations)."""
    assert_passes(spec, registry.impls[f"{OP}/{impl}"], CATALOG[name], device)


@pytest.mark.parametrize("name", ["strided-rows-padding-nan"])
def test_compiled_chain_parity(spec, registry, device, name):
    assert_passes(spec, registry.impls[f"{OP}/compiled"], CATALOG[name], device)


@given(case=cases.cases(max_batch=6, max_drafts=5, vocabs=(1, 2, 17, 100, 1000, 4097)))
def test_generated_parity_fused(spec, registry, device, case):
    res = runners.run_case(spec, registry.impls[f"{OP}/fused"], case, device, determinism=False, poisoned=False)
    bad = [r for r in res.records if not r.passed]
    assert res.records and not bad, [(r.check, r.detail, r.worst) for r in bad]


def test_reference_matches_the_numpy_oracle(device):
    """The chain's torch argmax and cumprod walk against NumPy's argmax and a Python loop."""
    drawn = list(CATALOG.values()) + base.draw(cases.cases(), 60, rng_seed=3)
    for c in drawn:
        kw = cases.build_inputs(c, device)
        out, orc = ref.verify_accept(**kw), ref.verify_accept_oracle(**kw)
        for k in ("output_ids", "accept_length"):
            assert torch.equal(out[k].cpu(), orc[k]), (c, k)


def test_outputs_follow_the_walk(device):
    """Per request: ids = accepted drafts, then the target's token at the accept row, then -1;
    padding requests all -1 with length 0 (the contract spelled out on the catalog)."""
    for c in CATALOG.values():
        kw = cases.build_inputs(c, device)
        out = ref.verify_accept(**kw)  # the fused kernel's are the same bytes (test_catalog_parity)
        qo = kw["qo_indptr"].cpu().tolist()
        drafts = kw["draft_tokens"].cpu().view(c.B, c.L)
        t = torch.argmax(kw["target_logits"].cpu(), dim=-1)
        for b in range(c.B):
            ids, n = out["output_ids"][b].cpu(), int(out["accept_length"][b])
            if qo[b + 1] == qo[b]:
                assert n == 0 and (ids == -1).all(), (c.name, b)
                continue
            assert torch.equal(ids[:n], drafts[b, :n].int()) and int(ids[n]) == int(t[qo[b] + n])
            assert (ids[n + 1:] == -1).all()
            assert n == c.L or int(drafts[b, n]) != int(t[qo[b] + n])


# ----------------------------------------------------------------------------- the argmax rule

ARGMAX_FACTS = [
    # (row, index): torch.argmax's rule, checked by hand
    ([1.0, 3.0, 3.0, 2.0], 1),  # equal maxima: the lowest index
    ([0.0, -0.0, 0.0], 0),  # -0 == +0
    ([-0.0, 0.0], 0),
    ([-INF, -INF, -INF], 0),  # all -inf: the first
    ([1.0, NAN, 3.0, NAN], 1),  # NaN is the maximum, the first NaN
    ([INF, NAN, INF], 1),  # above +inf too
    ([NAN, 5.0], 0),
    ([-1.0, -INF, -0.5], 2),
    ([2.0, INF, INF, 1.0], 1),
]


def _fact_inputs(device, rows: list[list[float]], neg_nan: bool = False):
    """One request per row, L = 1: output_ids[b, 0] is the argmax of row b."""
    V = max(len(r) for r in rows)
    x = torch.full((len(rows) * 2, V), -INF)
    for i, r in enumerate(rows):
        x[2 * i, : len(r)] = torch.tensor(r)
    x = x.bfloat16()
    if neg_nan:  # a NaN of the other sign, kept as bits (no fp32 round trip)
        x = torch.where(torch.isnan(x), torch.tensor(0xFFC0, dtype=torch.int32).to(torch.int16).view(torch.bfloat16), x)
    dev = device.torch_device
    return dict(target_logits=x.to(dev), draft_tokens=torch.zeros(len(rows), dtype=torch.long, device=dev),
                qo_indptr=torch.arange(0, 2 * len(rows) + 1, 2, dtype=torch.int32, device=dev))


@pytest.mark.parametrize("neg_nan", [False, True])
def test_argmax_rule_on_hand_checked_rows(device, neg_nan):
    rows = [r + [-INF] * (max(len(q) for q, _ in ARGMAX_FACTS) - len(r)) for r, _ in ARGMAX_FACTS]
    want = [i for _, i in ARGMAX_FACTS]
    kw = _fact_inputs(device, rows, neg_nan)
    assert ref.row_argmax(kw["target_logits"].cpu())[::2].tolist() == want  # torch.argmax on the CPU
    assert [int(v) for v in ref.verify_accept_oracle(**kw)["output_ids"][:, 0]] == want  # NumPy
    assert fused.verify_accept(**kw)["output_ids"][:, 0].cpu().tolist() == want


# ----------------------------------------------------------------------------- the split argmax's combine

# a tiling of launch 1 small enough to cut a 200-column row into 7 chunks (6 of 32 columns, the last
# of 8): chunk boundaries at 32, 64, ..., 192, tiles of 16 inside each chunk
SMALL = fused.SplitConfig(block_v=16, chunk_len=32, n_chunks=7, num_warps=1, num_stages=1)
SMALL_V = 200


def _split_argmax(device, rows: list[list[float]], cfg: fused.SplitConfig | None = None) -> list[int]:
    """Each row's token from the two launches, at ``cfg``'s tiling (None: the default's)."""
    kw = _fact_inputs(device, rows)
    B = len(rows)
    out = torch.full((B, 2), -7, dtype=torch.int32, device=device.torch_device)
    n = torch.full((B,), -7, dtype=torch.int32, device=device.torch_device)
    if cfg is not None:
        assert cfg.n_chunks == -(-kw["target_logits"].shape[1] // cfg.chunk_len)
    fused.launch(output_ids=out, accept_length=n, **kw, config=cfg)
    return out[:, 0].cpu().tolist()


def _row(V: int, planted: dict[int, float], fill: float = 0.0) -> list[float]:
    r = [fill] * V
    for col, x in planted.items():
        r[col] = x
    return r


# (what the combine must get right, planted columns -> values, fill): each row's answer is torch.argmax's
COMBINE_ROWS = [
    ("tie across one boundary", {31: 7.0, 32: 7.0}, 0.0),  # last column of chunk 0, first of chunk 1
    ("tie in chunks 1 and 5", {40: 7.0, 170: 7.0}, 0.0),
    ("tie in every chunk", {3: 7.0, 33: 7.0, 65: 7.0, 127: 7.0, 130: 7.0, 160: 7.0, 199: 7.0}, 0.0),
    ("tie, the later one in the short last chunk", {100: 7.0, 195: 7.0}, 0.0),
    ("the maximum alone in the short last chunk", {199: 7.0, 0: 6.0}, 0.0),
    ("a larger value in a later chunk", {5: 7.0, 150: 8.0}, 0.0),
    ("NaN in a later chunk beats +inf in an earlier", {10: float("inf"), 100: NAN}, 0.0),
    ("NaN in two chunks: the first", {120: NAN, 70: NAN, 10: float("inf")}, 0.0),
    ("NaN and a tie of +inf, NaN last", {0: float("inf"), 64: float("inf"), 199: NAN}, 0.0),
    ("all -inf", {}, -INF),
    ("all -inf but one finite value in the last chunk", {197: -3.0}, -INF),
    ("-inf, then -0 and +0 tied across a boundary", {63: -0.0, 64: 0.0}, -INF),
    ("every chunk's best -1 but one -inf chunk", {i: -INF for i in range(32, 64)}, -1.0),
]


@pytest.mark.parametrize("what, planted, fill", COMBINE_ROWS, ids=[c[0] for c in COMBINE_ROWS])
def test_combine_keeps_the_argmax_rule_across_chunks(device, what, planted, fill):
    """Rows whose maximum is decided between chunks, at a 7-chunk tiling (``SMALL``): the token is
    torch.argmax's. Planted in the combine (launch 2): the highest index among tied partials; NaN
    partials compared as numbers (the maximum non-NaN chunk wins); a partial of -inf taken for an empty
    chunk; each fails here."""
    row = _row(SMALL_V, planted, fill)
    want = int(torch.argmax(torch.tensor([row]).bfloat16(), dim=-1))
    assert _split_argmax(device, [row], SMALL) == [want], what


@settings(max_examples=30, deadline=None, derandomize=True)
@given(data=st.data())
def test_combine_matches_torch_argmax_on_drawn_tilings(device, data):
    """Rows drawn from few values (ties, NaN, +-inf, -0 everywhere) at drawn tilings (1..13 chunks,
    a short last chunk or not): every token is torch.argmax's."""
    block_v = data.draw(st.sampled_from((16, 32)))
    chunk_len = block_v * data.draw(st.integers(1, 3))
    V = data.draw(st.integers(1, 13 * chunk_len))
    cfg = fused.SplitConfig(block_v, chunk_len, -(-V // chunk_len), 1, 1)
    values = st.sampled_from((-INF, -1.0, -0.0, 0.0, 2.0, 2.0, 2.0, INF, NAN))
    rows = [data.draw(st.lists(values, min_size=V, max_size=V)) for _ in range(data.draw(st.integers(1, 3)))]
    want = torch.argmax(torch.tensor(rows).bfloat16(), dim=-1).tolist()
    assert _split_argmax(device, rows, cfg) == want


def test_default_tiling_splits_the_rows_it_is_given(device):
    """The default call's tiling cuts catalog-sized rows into several chunks (else its combine would go
    untested by the parity runs), with a tie across its chunk boundary decided as torch does."""
    V = 4 * 1024 + 5
    cfg = fused.split_config(2, V, device.interpreted)
    assert cfg.n_chunks >= 3 and cfg.chunk_len % cfg.block_v == 0
    a, b = cfg.chunk_len - 1, cfg.chunk_len  # the last column of chunk 0, the first of chunk 1
    assert _split_argmax(device, [_row(V, {a: 7.0, b: 7.0}), _row(V, {b: 7.0, V - 1: 7.0})]) == [a, b]


@pytest.mark.parametrize("interpreted", [False, True])
def test_split_config_covers_every_row_once(interpreted):
    """Chunks are whole tiles, cover 0..V exactly (the last one not empty), and the compiled tiling puts
    hundreds of programs on B 1 x L 4 x V 160K and about the target on B 64 (the issue's two shapes)."""
    for rows in (1, 2, 5, 40, 320, 1280, 10 ** 5):
        for V in (1, 2, 17, 1023, 1024, 1025, 4097, 32000, 151936, 160000, 256000):
            c = fused.split_config(rows, V, interpreted)
            assert c.chunk_len % c.block_v == 0 and (c.n_chunks - 1) * c.chunk_len < V <= c.n_chunks * c.chunk_len
            assert c.n_chunks <= 65535, (rows, V)  # a grid's second axis
    if not interpreted:
        assert 5 * fused.split_config(5, 160000, False).n_chunks >= 300
        assert 2000 <= 320 * fused.split_config(320, 160000, False).n_chunks <= 4 * fused.TARGET_PROGRAMS


# ----------------------------------------------------------------------------- bad input

def _kw(device, **over):
    kw = cases.build_inputs(cases.VerifyAcceptCase(B=3, L=2, V=50, padding=1, seed=1), device)
    kw.update(over)
    return kw


BAD = [
    ("target_logits", lambda kw: kw["target_logits"][0], checks.RankError),
    ("target_logits", lambda kw: kw["target_logits"].float(), checks.DTypeError),
    ("target_logits", lambda kw: kw["target_logits"].t().contiguous().t(), checks.LayoutError),
    ("target_logits", lambda kw: kw["target_logits"][:, :0], checks.ShapeError),
    ("target_logits", lambda kw: torch.empty(2, 50, dtype=torch.bfloat16, device="meta"), checks.DeviceError),
    ("draft_tokens", lambda kw: kw["draft_tokens"][:5], checks.ShapeError),
    ("draft_tokens", lambda kw: kw["draft_tokens"].float(), checks.DTypeError),
    ("draft_tokens", lambda kw: kw["draft_tokens"].view(3, 2), checks.RankError),
    ("draft_tokens", lambda kw: torch.full_like(kw["draft_tokens"], 50), checks.RangeError),
    ("draft_tokens", lambda kw: torch.full_like(kw["draft_tokens"], -1), checks.RangeError),
    ("draft_tokens", lambda kw: torch.stack((kw["draft_tokens"], kw["draft_tokens"]), 1)[:, 0], checks.LayoutError),
    ("qo_indptr", lambda kw: kw["qo_indptr"][:1], checks.ShapeError),
    ("qo_indptr", lambda kw: kw["qo_indptr"].float(), checks.DTypeError),
    ("qo_indptr", lambda kw: kw["qo_indptr"] + 1, checks.RangeError),  # does not start at 0
    ("qo_indptr", lambda kw: torch.tensor([0, 6, 3, 6], dtype=torch.int32), checks.RangeError),  # not monotone
    ("qo_indptr", lambda kw: torch.tensor([0, 2, 4, 6], dtype=torch.int32), checks.RangeError),  # 2 rows, L + 1 = 3
    ("qo_indptr", lambda kw: torch.tensor([0, 3, 6, 12], dtype=torch.int32), checks.RangeError),  # 6 rows
    ("qo_indptr", lambda kw: {"qo_indptr": torch.tensor([0, 3, 6, 9], dtype=torch.int32),
                              "target_logits": kw["target_logits"][:8]}, checks.RangeError),  # past the logits' rows
]


@pytest.mark.parametrize("impl", ["reference", "fused"])
@bad_inputs(BAD)
def test_bad_input_is_a_typed_error_naming_the_argument(device, impl, arg, make, err):
    fn = ref.verify_accept if impl == "reference" else fused.verify_accept
    kw = _kw(device)
    new = make(kw)
    for name, t in (new if isinstance(new, dict) else {arg: new}).items():
        kw[name] = t.to(device.torch_device) if not t.is_meta else t
    with pytest.raises(err) as info:
        fn(**kw)
    assert info.value.arg == arg


def test_padding_drafts_are_not_checked(device):
    """A padding request's drafts are never read: any value (here -1 and V) is legal."""
    kw = _kw(device)
    qo = kw["qo_indptr"].cpu().tolist()
    pad = next(b for b in range(3) if qo[b + 1] == qo[b])
    d = kw["draft_tokens"].clone()
    d[2 * pad], d[2 * pad + 1] = -1, 50
    for fn in (ref.verify_accept, fused.verify_accept):
        out = fn(**{**kw, "draft_tokens": d})
        assert (out["output_ids"][pad] == -1).all() and int(out["accept_length"][pad]) == 0


# ----------------------------------------------------------------------------- strategies

REACH = {
    "padding": lambda c: 0 < c.padding < c.B,
    "all-padding": lambda c: c.padding == c.B > 1,
    "strided": lambda c: c.row_pad > 0,
    "l1": lambda c: c.L == 1,
    "all-accepted": lambda c: c.accept == "all",
    "none-accepted": lambda c: c.accept == "none",
    "coarse": lambda c: c.values == "coarse",
    "constant": lambda c: c.values == "constant",
    "neginf": lambda c: c.values == "neginf",
    "ties": lambda c: c.ties == 1.0,
    "nans": lambda c: c.nans > 0,
    "v-block-plus-one": lambda c: c.V == 4097,
    "v-one": lambda c: c.V == 1,
    "int32-drafts": lambda c: c.draft_dtype == "int32",
    "int64-indptr": lambda c: c.indptr_dtype == "int64",
}


@pytest.mark.parametrize("what", sorted(REACH))
def test_strategy_reaches(what):
    found = find(cases.cases(), REACH[what], settings=settings(max_examples=2000, database=None,
                                                               phases=[Phase.generate]))
    assert REACH[what](found)


def test_cases_plant_what_they_say(device):
    """Ties at the top, NaN rows, +inf pad columns and tail rows, tied mismatching drafts."""
    c = CATALOG["strided-rows-padding-nan"]
    kw = cases.build_inputs(c, device)
    x = kw["target_logits"]
    assert x.stride(0) == c.V + c.row_pad and x.stride(1) == 1
    full = torch.as_strided(x, (x.shape[0], c.V + c.row_pad), x.stride()).cpu()
    assert torch.isposinf(full[:, c.V:].float()).all()
    qo = kw["qo_indptr"].cpu()
    assert torch.isposinf(x[int(qo[-1]):].cpu().float()).all() and int(qo[-1]) < x.shape[0]
    assert torch.isnan(x.cpu().float()).any(dim=1).any()
    t = cases.build_inputs(CATALOG["ties-planted"], device)["target_logits"].cpu().float()
    assert ((t == t.max(dim=1, keepdim=True).values).sum(dim=1) > 1).all(), "every row has a tied maximum"
    # a mismatching draft is a tied maximum above the argmax: what the ties mutant would accept
    c = CATALOG["none-accepted"]
    kw = cases.build_inputs(c, device)
    x, d = kw["target_logits"].cpu().float(), kw["draft_tokens"].cpu().view(c.B, c.L)
    rows = kw["qo_indptr"].cpu()[:-1].long()
    am = torch.argmax(x[rows], dim=-1)
    tied = [int(d[b, 0]) > int(am[b]) and x[rows[b], d[b, 0]] == x[rows[b], am[b]] for b in range(c.B)]
    assert any(tied) and all(int(d[b, 0]) != int(am[b]) for b in range(c.B))


# ----------------------------------------------------------------------------- the benchmark on the CPU

def test_bench_run_loop_on_tiny_shapes(device, monkeypatch, tmp_path):
    """The benchmark's run loop with the measurement faked (every callable still runs once,
    the fused kernels under the interpreter): one PerfRow per impl and mode (eager, graph), with
    ``--before``'s module (here this tree's wrapper file, loaded as another tree's) as impl ``before``,
    the wide CSV, 0 mismatches."""
    import pandas as pd

    from cases.verify_accept import bench as vb
    from harness.bench import before, perf
    from harness.bench import perf_rows as pr
    from harness.gpu import profiling
    from harness.parity.suite import provenance

    monkeypatch.setattr(profiling, "time_quantiles_us", lambda fn, warmup=25, rep=100: (1.0, 2.0, 3.0))
    monkeypatch.setattr(profiling, "graph_time_us", lambda fn, rep=40: 1.5)
    monkeypatch.setattr(profiling, "count_launches", lambda fn, warmup=1: 2)
    monkeypatch.setattr(perf, "compile_static", lambda fn: fn)
    monkeypatch.setattr(vb, "before_modules", [before.load_module(fused.__file__)])
    ctx = perf.Context(dev=device, prov=provenance(device, perf.QUICK, 0), copy_gbps=100.0, sms=4)
    shape_list = [vb.Shape(B=2, V=300), vb.Shape(B=3, V=4097)]
    rows = perf.run_shapes(vb, shape_list, ctx, tmp_path)
    impls = [*vb.IMPLS, "before"]
    assert [(r.impl, r.mode) for r in rows] == [(i, m) for m in pr.MODES for i in impls] * 2
    assert {r.op for r in rows} == {OP}
    assert all(r.gbps == pytest.approx(vb.bytes_moved(s) / (2e-6 if r.mode == "eager" else 1.5e-6) / 1e9)
               for s in shape_list for r in rows if r.case == s.case)
    wide = pd.read_csv(tmp_path / "verify_accept_bench.csv")
    assert wide["mismatches"].tolist() == [0, 0] and wide["V"].tolist() == [300, 4097]
    assert wide["before_graph_us"].tolist() == [1.5, 1.5]
    assert not pr.launch_failures(rows, {OP: vb.EXPECTED_LAUNCHES})


def test_bench_shapes_and_no_gpu(monkeypatch, tmp_path, capsys):
    from cases.verify_accept import bench as vb
    from harness import devices

    full = vb.shapes(False)
    assert {s.B for s in full} == {1, 64, 256} and {s.V for s in full} == {32000, 160000, 256000}
    assert {s.L for s in full} == {4} and [s.case for s in vb.shapes(True)] == [
        "B=1,L=4,V=160000", "B=64,L=4,V=32000", "B=64,L=4,V=160000"]
    assert set(vb.shapes(True)) < set(full)
    assert [s.case for s in vb.shapes(False, b=[2], v=[7])] == ["B=2,L=4,V=7"]
    monkeypatch.setattr(devices, "gpu_present", lambda: False)
    assert vb.main(["--out", str(tmp_path / "runs"), "--quick"]) == 0
    assert "nothing was measured" in capsys.readouterr().out and not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- the harness bites

MUTANT_PROOF = {
    # mutant: (a catalog case it must fail on, the checks that must flag it there, a case where it hides)
    "mutant-accepts-first-mismatch": ("none-accepted", {"exact:accept_length", "exact:output_ids"},
                                      "all-accepted"),  # no mismatch to accept
    "mutant-bonus-wrong-row": ("llama2-b4-l4-v32000", {"exact:output_ids"},
                               "all-accepted"),  # the bonus row is the last: the clamp lands on it
    "mutant-ties-to-highest-index": ("ties-planted", {"exact:accept_length", "exact:output_ids"},
                                     "llama2-b4-l4-v32000"),  # no equal maxima in its rows
    "mutant-row-stride-ignored": ("strided-rows", {"exact:accept_length", "exact:output_ids"},
                                  "ties-planted"),  # contiguous rows: stride == V
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
    """Why the catalog carries rejections, non-final bonus rows, planted ties and strided rows:
    without them these bugs pass."""
    assert_passes(spec, registry.impls[f"{OP}/{mutant}"], CATALOG[MUTANT_PROOF[mutant][2]], device)


def test_tied_mismatching_drafts_bite_the_accept_length(spec, registry, device):
    """On tied rows that reject at draft 0, the ties mutant's bonus differs either way; only a
    mismatching draft that is another tied maximum makes it *accept* (accept_length wrong too)."""
    impl = registry.impls[f"{OP}/mutant-ties-to-highest-index"]
    c = CATALOG["none-accepted"]
    random_rejects = set(failed_checks(spec, impl, dataclasses.replace(c, ties=1.0, tie_drafts=False), device))
    tied_rejects = set(failed_checks(spec, impl, dataclasses.replace(c, ties=1.0, tie_drafts=True), device))
    assert "exact:output_ids" in random_rejects and "exact:accept_length" not in random_rejects
    assert {"exact:output_ids", "exact:accept_length"} <= tied_rejects


def test_kill_plan_cases_are_the_mutants_proofs(spec):
    """The kill matrix's targeted subset is each mutant's proof case, plus one catalog timeline: the
    timelines' accept(n) takes its n from this op, so a wrong n shows in the KV truth too (a rejecting
    width-4 timeline: the accept-first-mismatch mutant is killed there by ``accept:n`` and ``state``)."""
    from cases import timelines as tl

    assert set(spec.kill.cases) == {case for case, _, _ in MUTANT_PROOF.values()}
    assert spec.kill.timelines == ("qwen35-gqa/width-4-reject",) and set(spec.kill.clean) == {"reference", "fused"}
    named = {t.name for t in tl.catalog()}
    assert set(spec.kill.timelines) <= named, set(spec.kill.timelines) - named


def test_kill_matrix_kills_every_mutant_on_the_targeted_cases(registry, device):
    """The op's rows of ``harness.mutants.killmatrix`` (what ``python -m harness mutants`` runs): clean rows pass,
    every mutant is killed by parity. Planted: strided-rows left out of KillPlan.cases -> the
    row-stride mutant survives."""
    from harness.mutants import killmatrix

    rows = killmatrix.build(registry, device, only=f"{OP}/", progress=None)
    survivors, broken = killmatrix.verdict(rows)
    assert not survivors and not broken
    assert {r.subject for r in rows if r.kind == "mutant"} == {f"{OP}/{m}" for m in MUTANT_PROOF}


# ----------------------------------------------------------------------------- the GPU plan, on the CPU

@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_gpu_plan_launches_and_graph_under_the_interpreter(spec, registry, device, impl):
    """``harness.gpu.runners`` on the plan's case with the interpreter stand-ins of
    ``tests/test_gpu_checks.py``: the fused call is two kernels, the chain six stage calls; replayed
    as captured (validate's value checks off) it equals eager; no dispatch gate: the gate row skips.
    The stand-ins count interpreter launches: on a GPU the gpu-marked tests of ``tests/test_gpu_checks.py``
    count the real ones (torch.profiler) and capture real graphs."""
    if not device.interpreted:
        pytest.skip("interpreter stand-ins for the launch counter and graph capture; on a GPU "
                    "tests/test_gpu_checks.py runs the real ones")
    from harness.gpu import runners as gr
    from tests.test_gpu_checks import _baked_capture, _count, _names

    case = {c.name: c for c in cases.catalog(big=True)}[spec.gpu.cases[0]]
    assert spec.gpu.full in {c.name for c in cases.catalog(big=True)}
    fn = registry.impls[f"{OP}/{impl}"]
    launches = gr.check_launches(spec, fn, case, device, count=_count, names=_names)
    if impl == "fused":
        assert launches.passed, launches
    else:  # torch ops are no interpreter launches: the stage calls are what the CPU can count
        assert launches.got == f"6 launches ({', '.join(sorted(spec.gpu.stages))}); 0 device kernels"
    replay, gate = gr.check_graph(spec, fn, case, device, 0, capture=_baked_capture(OP))
    assert replay.passed, replay
    assert gate.passed is None and "no dispatch gate" in gate.detail


def test_capture_safe_switches_off_the_value_checks_only(spec, device):
    """Under ``capture_safe`` an out-of-range draft passes validate (its host copy is off), a wrong
    dtype still fails; afterwards validate checks values again."""
    from harness.gpu import runners as gr

    kw = cases.build_inputs(CATALOG["llama2-b4-l4-v32000"], device)
    bad = dict(kw, draft_tokens=torch.full_like(kw["draft_tokens"], 10 ** 6))
    with gr.capture_safe(spec, kw):
        ref.validate(**bad)
        with pytest.raises(checks.DTypeError):
            ref.validate(**dict(kw, target_logits=kw["target_logits"].float()))
    with pytest.raises(checks.RangeError):
        ref.validate(**bad)


# ----------------------------------------------------------------------------- NaN policies (issue 35)

# (row, index under ``ignore``): NaN taken as -inf; a row with no number above -inf gives 0
IGNORE_FACTS = [
    ([1.0, NAN, 3.0, NAN], 2),
    ([INF, NAN, INF], 0),
    ([NAN, 5.0], 1),
    ([NAN, NAN, NAN], 0),  # all NaN: as all -inf, the lowest index
    ([-INF, NAN, -INF], 0),
    ([NAN, -INF, -3.0], 2),
    ([1.0, 3.0, 3.0, 2.0], 1),  # no NaN: as ``max``
]


@pytest.mark.parametrize("neg_nan", [False, True])
def test_ignore_rule_on_hand_checked_rows(device, neg_nan):
    """The chain and the NumPy oracle under ``nan_policy="ignore"``, on rows checked by hand."""
    width = max(len(r) for r, _ in IGNORE_FACTS)
    rows = [r + [-INF] * (width - len(r)) for r, _ in IGNORE_FACTS]
    want = [i for _, i in IGNORE_FACTS]
    kw = _fact_inputs(device, rows, neg_nan)
    assert ref.row_argmax(kw["target_logits"].cpu(), "ignore")[::2].tolist() == want
    assert ref.verify_accept(**kw, nan_policy="ignore")["output_ids"][:, 0].cpu().tolist() == want
    assert [int(v) for v in ref.verify_accept_oracle(**kw, nan_policy="ignore")["output_ids"][:, 0]] == want
    with pytest.raises(checks.ChoiceError, match="nan_policy"):
        ref.verify_accept(**kw, nan_policy="min")


NAN_CASES = ["nan-rows", "nan-every-row-all-accepted", "nan-and-ties", "strided-rows-padding-nan"]


def _chain_ignoring_nan(**kw):
    return ref.verify_accept(**kw, nan_policy="ignore")


def _impl(name, fn, nan_policy):
    from harness.registry import Impl

    return Impl(OP, name, "external", fn, nan_policy=nan_policy)


@pytest.mark.parametrize("name", NAN_CASES)
def test_each_nan_policy_is_checked_exactly(spec, device, name):
    """An implementation is held to the reference of the NaN policy it declares: the chain computing
    ``ignore`` passes when it declares ``ignore`` and fails (``exact:output_ids``) when it declares
    ``max`` or nothing; the fused kernel (``max``) fails when it declares ``ignore``."""
    case = CATALOG[name]
    assert_passes(spec, _impl("chain-ignore", _chain_ignoring_nan, "ignore"), case, device)
    assert "exact:output_ids" in failed_checks(spec, _impl("chain-ignore-declared-max", _chain_ignoring_nan, "max"),
                                               case, device)
    assert "exact:output_ids" in failed_checks(spec, _impl("chain-ignore-undeclared", _chain_ignoring_nan, ""),
                                               case, device)
    assert "exact:output_ids" in failed_checks(spec, _impl("fused-declared-ignore", fused.verify_accept, "ignore"),
                                               case, device)


def test_nan_policies_agree_without_nan(spec, device):
    """Where no row holds a NaN the two policies are one rule: a declared ``ignore`` changes nothing."""
    assert_passes(spec, _impl("fused-declared-ignore", fused.verify_accept, "ignore"), CATALOG["ties-planted"], device)


def test_an_undeclarable_nan_policy_is_refused_at_registration(registry):
    from harness.registry import Registry

    reg = Registry()
    reg.add_op(registry.ops[OP])
    with pytest.raises(ValueError, match="nan_policy 'min' is not one op 'verify_accept' can check"):
        reg.add(_impl("x", fused.verify_accept, "min"))
    reg.add_op(registry.ops["qk_norm_rope"])
    from harness.registry import Impl

    with pytest.raises(ValueError, match="its OpSpec.nan_policies: none"):
        reg.add(Impl("qk_norm_rope", "x", "external", fused.verify_accept, nan_policy="ignore"))


def test_report_shows_each_implementations_nan_policy(spec, device):
    """The policy an implementation is held to is a column of its rows and of the run's summary."""
    from cases.profiles import current
    from harness.parity import suite
    from reports.rows import to_frame
    from reports.summary import summary

    p = suite.plan_cases(spec, current("ci"), generated=0)
    p = [x for x in p if x.case.name == "nan-rows"]
    impls = [_impl("chain-ignore", _chain_ignoring_nan, "ignore"), _impl("plain", fused.verify_accept, "")]
    prov = suite.provenance(device, current("ci"), 0)
    rows = [r for impl in impls for r in suite.rows_for(p[0], impl, device, runners.run_case(spec, impl, p[0].case, device,
                                                                                             determinism=False,
                                                                                             poisoned=False), prov)]
    s = summary(to_frame(rows)).set_index("impl")
    assert s.loc["chain-ignore", "nan_policy"] == "ignore" and s.loc["plain", "nan_policy"] == "max"
    assert s.loc["chain-ignore", "failed"] == 0 and s.loc["plain", "failed"] == 0


def test_the_spec_declares_the_chains_nan_policies(spec):
    """The spec names the chain's NaN rules without importing it (``list`` imports no torch): the same
    names, the chain's default first."""
    assert tuple(spec.nan_policies) == ref.NAN_POLICIES
    assert all(kw == {"nan_policy": p} for p, kw in spec.nan_policies.items())
