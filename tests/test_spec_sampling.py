"""spec_sampling: exact parity of the fused kernel with the reference chain where the uniforms are
inputs, the chain against the fp64 oracle, the consumption rule of the uniforms on hand-checked
rows, the distributional check (its statistics, its counts, clean implementations passing it and
every mutant failing it), typed errors, the strategies."""
from __future__ import annotations

import dataclasses
import importlib.util
import math

import numpy as np
import pytest
import torch
from hypothesis import Phase, find, given, settings
from scipy import stats

from cases import base
from cases.spec_sampling import catalog as cases
from cases.spec_sampling import distribution as dist
from fused.spec_sampling import wrapper as fused
from harness.parity import distribution as hd
from harness.parity import runners
from reference import checks
from reference.spec_sampling import chain as ref
from reference.spec_sampling import oracle
from tests.helpers import assert_passes, bad_inputs, failed_checks

OP = "spec_sampling"
CATALOG = {c.name: c for c in cases.catalog()}
EXACT = sorted(n for n, c in CATALOG.items() if c.mode == "exact")
DIST = sorted(n for n, c in CATALOG.items() if c.mode == "distribution")


# ----------------------------------------------------------------------------- parity

@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_catalog_parity(spec, registry, device, impl, name):
    """Exact outputs with the case's uniforms, inputs untouched, determinism, poisoned allocations."""
    assert_passes(spec, registry.impls[f"{OP}/{impl}"], CATALOG[name], device)


@pytest.mark.parametrize("name", DIST)
def test_distributional_cases_pass_the_reference(spec, registry, device, name):
    res = runners.run_case(spec, registry.impls[f"{OP}/reference"], CATALOG[name], device)
    got = {r.check: r.passed for r in res.records}
    assert got["distribution:output_ids"] and got["distribution:accept_length"] and all(got.values()), got


def test_distributional_case_passes_the_fused_kernel(spec, registry, device):
    """The kernel's own Philox uniforms (one distributional case: each costs ~10 s under the interpreter)."""
    assert_passes(spec, registry.impls[f"{OP}/fused"], CATALOG["dist-far-v8"], device)


@given(case=cases.cases(max_batch=4, max_drafts=4, vocabs=(1, 2, 17, 100, 1000, 4097)))
def test_generated_parity_fused(spec, registry, device, case):
    res = runners.run_case(spec, registry.impls[f"{OP}/fused"], case, device, determinism=False, poisoned=False)
    bad = [r for r in res.records if not r.passed]
    assert res.records and not bad, [(r.check, r.detail, r.worst) for r in bad]


def test_reference_matches_the_fp64_oracle(device):
    """The chain's fp32 torch walk against NumPy float64 and a Python loop, on the catalog and drawn cases."""
    drawn = [CATALOG[n] for n in EXACT] + base.draw(cases.cases(), 40, rng_seed=3)
    for c in drawn:
        kw = cases.build_inputs(c, device)
        out, orc = ref.spec_sampling(**kw), oracle.spec_sampling_oracle(**kw)
        for k in ("output_ids", "accept_length"):
            assert torch.equal(out[k].cpu(), orc[k]), (c, k)


def test_catalog_exercises_rejections_full_chains_and_the_fallbacks(device):
    """The exact catalog rejects at every position, accepts whole chains, and samples residuals."""
    seen = set()
    for n in EXACT:
        c = CATALOG[n]
        seen |= {(int(k) == c.L, int(k) == 0) for k in ref.spec_sampling(**cases.build_inputs(c, device))["accept_length"]}
    assert {(True, False), (False, True), (False, False)} <= seen


# ----------------------------------------------------------------------------- how the uniforms are consumed

def _hand(device, p_rows, q_rows, drafts, u, temperature=1.0):
    """One request; logits = log p (softmax gives p back up to rounding)."""
    dev = device.torch_device
    logits = torch.log(torch.tensor(p_rows, dtype=torch.float64)).float()[None]
    return dict(target_logits=logits.to(dev), temperature=torch.tensor([temperature], device=dev),
                draft_probs=torch.tensor(q_rows, dtype=torch.float32)[None].to(dev),
                draft_tokens=torch.tensor([drafts], device=dev), uniforms=torch.tensor([u], device=dev), seed=None)


HAND = [
    # (p rows L + 1, q rows L, drafts, uniforms, output_ids, accept_length): checked by hand
    # draft 0: p/q = 0.5/0.25 >= 1: accepted whatever u; then the bonus from row 1 = [0.1, 0.2, 0.7]:
    # C = 0.1, 0.3, 1.0 and u_L · S = 0.35 -> token 2
    ([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]], [[0.25, 0.5, 0.25]], [0], [0.99, 0.35], [0, 2], 1),
    # draft 1: p/q = 0.25/0.5 = 0.5 < u = 0.6: rejected; residual max(p - q, 0) = [0.25, 0, 0], normalised: token 0
    ([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]], [[0.25, 0.5, 0.25]], [1], [0.6, 0.99], [0, -1], 0),
    # the same draft with u = 0.4 < 0.5: accepted; bonus u_L · S = 0.05 < C_0 = 0.1 -> token 0
    ([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]], [[0.25, 0.5, 0.25]], [1], [0.4, 0.05], [1, 0], 1),
    # residual [0.3, 0, 0.1] (S = 0.4), u_L = 0.8: u · S = 0.32 > C_0 = 0.3 -> token 2 (not normalised: u = 0.8 > S)
    ([[0.6, 0.1, 0.3], [0.3, 0.3, 0.4]], [[0.3, 0.5, 0.2]], [1], [0.9, 0.8], [2, -1], 0),
]


@pytest.mark.parametrize("row", range(len(HAND)))
@pytest.mark.parametrize("impl", ["reference", "oracle", "fused"])
def test_uniforms_are_consumed_as_documented(device, impl, row):
    p, q, d, u, want_ids, want_n = HAND[row]
    kw = _hand(device, p, q, d, u)
    fn = {"reference": ref.spec_sampling, "oracle": oracle.spec_sampling_oracle, "fused": fused.spec_sampling}[impl]
    out = fn(**kw)
    assert out["output_ids"][0].cpu().tolist() == want_ids and int(out["accept_length"][0]) == want_n


def test_catalog_uniforms_are_clear_of_every_boundary(device):
    """Every acceptance uniform is >= MARGIN (relative) from p/q, every sample uniform >= MARGIN · S
    inside its token's interval, in the fp64 walk: fp32 rounding cannot flip a decision."""
    for n in EXACT:
        c = CATALOG[n]
        kw = cases.build_inputs(c, device)
        p, _ = oracle.sampling_tables(kw["target_logits"], kw["temperature"], kw["draft_probs"])
        q = kw["draft_probs"].cpu().double().numpy()
        d = kw["draft_tokens"].cpu().long().numpy()
        u = kw["uniforms"].cpu().double().numpy()
        orc = oracle.spec_sampling_oracle(**kw)
        for b in range(c.B):
            k = int(orc["accept_length"][b])
            for j in range(min(k + 1, c.L)):
                r = p[b, j, d[b, j]] / q[b, j, d[b, j]]
                assert abs(u[b, j] - r) >= 0.99 * cases.MARGIN * max(1.0, r), (n, b, j)
            w = np.maximum(p[b, k] - (q[b, k] if k < c.L else 0), 0)
            w = w if w.sum() > 0 else p[b, k]
            cs = np.cumsum(w)
            t = int(orc["output_ids"][b, k])
            lo = cs[t - 1] if t else 0.0
            assert min(u[b, c.L] * cs[-1] - lo, cs[t] - u[b, c.L] * cs[-1]) >= 0.99 * cases.MARGIN * cs[-1], (n, b)


# ----------------------------------------------------------------------------- the distributional statistics

def test_p_values_are_the_exact_binomial_tails():
    """Against sums of the binomial pmf written out (math.comb, fractions of floats)."""
    for x, m, pi in [(0, 10, 0.3), (3, 10, 0.3), (10, 10, 0.3), (7, 40, 0.01), (500, 1000, 0.5), (0, 5, 0.0)]:
        pmf = [math.comb(m, k) * max(pi, hd.PI_FLOOR) ** k * (1 - max(pi, hd.PI_FLOOR)) ** (m - k) for k in range(m + 1)]
        want = min(1.0, 2 * min(sum(pmf[: x + 1]), sum(pmf[x:])))
        got = hd.p_values([hd.Test("t", x, m, pi)])[0]
        assert got == pytest.approx(want, rel=1e-9, abs=1e-300), (x, m, pi)


def test_bonferroni_threshold_and_the_record():
    """A family of K tests fails iff some p-value <= alpha / K; err = -log10(K · p_min) against 6."""
    K = 50
    m, pi = 10000, 0.3
    mean = int(m * pi)
    clean = [hd.Test(f"t{i}", mean, m, pi) for i in range(K)]
    assert hd.binomial_tests("d", clean, 1e-6).passed
    sd = math.sqrt(m * pi * (1 - pi))
    z = stats.norm.isf(1e-6 / K / 2)
    far = int(mean + (z + 1) * sd)  # past the threshold (the normal tail is close here)
    near = int(mean + (z - 1) * sd)
    assert not hd.binomial_tests("d", clean[1:] + [hd.Test("far", far, m, pi)], 1e-6).passed
    rec = hd.binomial_tests("d", clean[1:] + [hd.Test("near", near, m, pi)], 1e-6)
    assert rec.passed and rec.err < rec.allowed == pytest.approx(6.0)


def test_verdict_counts_match_a_loop(device, monkeypatch):
    """The verdict's vectorised counts against a Python loop over trials, on a small case."""
    c = dataclasses.replace(CATALOG["dist-far-v8"], trials=300)
    fn = ref.spec_sampling
    pairs = [({k: v.cpu() if hasattr(v, "cpu") else v for k, v in i.items()}, {k: v.cpu() for k, v in fn(**i).items()})
             for i in dist.batches(c, device)]
    seen = []
    orig = hd.binomial_tests
    monkeypatch.setattr(hd, "binomial_tests", lambda check, tests, alpha, detail="": seen.append(tests)
                        or orig(check, tests, alpha, detail=detail))
    dist.verdict(c, pairs, 1e-6)
    tok = {t.label: (t.count, t.trials) for t in seen[0]}
    ids = torch.cat([o["output_ids"] for _, o in pairs])
    n = torch.cat([o["accept_length"] for _, o in pairs])
    for b in range(c.B):
        for j in range(c.L + 1):
            rows = [i for i in range(ids.shape[0]) if i % c.B == b and n[i] >= j]
            for label, (cnt, m) in tok.items():
                if label.startswith(f"request {b} position {j} token "):
                    v = int(label.rsplit(" ", 1)[1])
                    assert m == len(rows) and cnt == sum(int(ids[i, j]) == v for i in rows), label


def test_structure_violations_are_found():
    d = torch.tensor([[3, 4], [3, 4], [3, 4], [3, 4]])
    ids = torch.tensor([[3, 7, -1], [3, 4, 5], [5, -1, -1], [3, 9, 1]])
    n = torch.tensor([1, 2, 0, 1])
    k, first = dist.structure_violations(ids, n, d, V=10)
    assert k == 1 and first.startswith("trial 3")
    k, _ = dist.structure_violations(torch.tensor([[3, 10, -1]]), torch.tensor([1]), d[:1], V=10)
    assert k == 1  # a token past the vocabulary


# ----------------------------------------------------------------------------- bad input

def _kw(device, **over):
    kw = cases.build_inputs(cases.SpecSamplingCase(B=3, L=2, V=50, seed=1), device)
    kw.update(over)
    return kw


BAD = [
    ("target_logits", lambda kw: kw["target_logits"][0], checks.RankError),
    ("target_logits", lambda kw: kw["target_logits"].half(), checks.DTypeError),
    ("target_logits", lambda kw: kw["target_logits"].transpose(1, 2).contiguous().transpose(1, 2), checks.LayoutError),
    ("target_logits", lambda kw: kw["target_logits"][:, :1], checks.ShapeError),  # L + 1 = 1
    ("target_logits", lambda kw: torch.full_like(kw["target_logits"], float("-inf")), checks.RangeError),
    ("target_logits", lambda kw: kw["target_logits"].clone().fill_(float("nan")), checks.RangeError),
    ("draft_probs", lambda kw: kw["draft_probs"][:, :1], checks.ShapeError),
    ("draft_probs", lambda kw: kw["draft_probs"].double(), checks.DTypeError),
    ("draft_probs", lambda kw: -kw["draft_probs"], checks.RangeError),
    ("draft_tokens", lambda kw: kw["draft_tokens"].float(), checks.DTypeError),
    ("draft_tokens", lambda kw: torch.full_like(kw["draft_tokens"], 50), checks.RangeError),
    ("draft_tokens", lambda kw: torch.full_like(kw["draft_tokens"], -1), checks.RangeError),
    ("draft_tokens", lambda kw: kw["draft_tokens"].t().contiguous().t(), checks.LayoutError),
    ("temperature", lambda kw: torch.zeros_like(kw["temperature"]), checks.RangeError),
    ("temperature", lambda kw: kw["temperature"][:2], checks.ShapeError),
    ("temperature", lambda kw: kw["temperature"].double(), checks.DTypeError),
    ("uniforms", lambda kw: torch.ones_like(kw["uniforms"]), checks.RangeError),
    ("uniforms", lambda kw: kw["uniforms"][:, :2], checks.ShapeError),
    ("seed", lambda kw: 7, checks.UnsupportedError),  # uniforms and a seed
]


@pytest.mark.parametrize("impl", ["reference", "fused"])
@bad_inputs(BAD)
def test_bad_input_is_a_typed_error_naming_the_argument(device, impl, arg, make, err):
    fn = ref.spec_sampling if impl == "reference" else fused.spec_sampling
    kw = _kw(device)
    new = make(kw)
    kw[arg] = new.to(device.torch_device) if isinstance(new, torch.Tensor) else new
    with pytest.raises(err) as info:
        fn(**kw)
    assert info.value.arg == arg


@pytest.mark.parametrize("seed,err", [(-1, checks.RangeError), (2 ** 31, checks.RangeError), (1.5, checks.DTypeError),
                                      (True, checks.DTypeError)])
def test_bad_seed(device, seed, err):
    kw = _kw(device, uniforms=None, seed=seed)
    for fn in (ref.spec_sampling, fused.spec_sampling):
        with pytest.raises(err) as info:
            fn(**kw)
        assert info.value.arg == "seed"


# ----------------------------------------------------------------------------- strategies

@pytest.mark.parametrize("what", sorted(cases.REACH))
def test_strategy_reaches(what):
    found = find(cases.cases(), lambda c: cases.REACH[what](c, {}),
                 settings=settings(max_examples=2000, database=None, phases=[Phase.generate]))
    assert cases.REACH[what](found, {})


# ----------------------------------------------------------------------------- the harness bites

MUTANT_PROOF = {
    # mutant: (an exact case it fails on, a distributional case it fails on)
    "mutant-residual-from-q": ("far-drafts", "dist-near-v16"),
    "mutant-unnormalised-residual": ("far-drafts", "dist-far-v8"),
    "mutant-p-q-swapped": ("far-drafts", "dist-far-v8"),
    "mutant-bonus-after-rejection": ("far-drafts", "dist-far-v8"),
    "mutant-temperature-twice": ("far-drafts", "dist-near-v16"),
    "mutant-bonus-wrong-row": ("equal-drafts-all-accepted", "dist-near-v16"),
}


def test_every_mutant_has_a_proof(registry):
    assert {i.name for i in registry.for_op(OP, ("mutant",))} == set(MUTANT_PROOF)


@pytest.mark.parametrize("mutant", sorted(MUTANT_PROOF))
def test_mutant_is_flagged_exactly_and_in_distribution(spec, registry, device, mutant):
    impl = registry.impls[f"{OP}/{mutant}"]
    exact_case, dist_case = MUTANT_PROOF[mutant]
    bad = set(failed_checks(spec, impl, CATALOG[exact_case], device))
    bad |= set(failed_checks(spec, impl, CATALOG[dist_case], device))
    assert set(impl.catches) <= bad, f"{mutant}: failing {sorted(bad)}"
    assert {"exact:output_ids", "distribution:output_ids"} <= bad


@pytest.mark.long
def test_kill_matrix_kills_every_mutant_on_the_targeted_cases(registry, device):
    from harness.mutants import killmatrix

    rows = killmatrix.build(registry, device, only=f"{OP}/", progress=None)
    survivors, broken = killmatrix.verdict(rows)
    assert not survivors and not broken
    assert {r.subject for r in rows if r.kind == "mutant"} == {f"{OP}/{m}" for m in MUTANT_PROOF}


# ----------------------------------------------------------------------------- the benchmark on the CPU

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None  # the bench compares SGLang's sampler where installed


def test_bench_bytes_are_the_rows_up_to_each_stop():
    """Hand count: request 0 stops at n = 0 (row 0 and its q row), request 1 accepts all L = 4 drafts
    (rows 0..4, no q row), request 2 stops at n = 2 (rows 0..2, q row 2, two accepted q(x))."""
    from cases.spec_sampling import bench as sb

    s = sb.Shape(B=3, V=1000)
    rows, q_rows, accepted_qx = 1 + 5 + 3, 2, 0 + 4 + 2
    small = 3 * 4 * 8 + 3 * 4 + 15 * 4 + 15 * 4 + 3 * 4  # drafts, temperature, uniforms, output_ids, accept_length
    assert sb.bytes_moved(s, [0, 4, 2]) == rows * 1000 * 2 + q_rows * 1000 * 4 + accepted_qx * 4 + small


def _fake_timings(monkeypatch):
    from harness.bench import perf
    from harness.gpu import profiling

    monkeypatch.setattr(profiling, "time_quantiles_us", lambda fn, warmup=25, rep=100: (1.0, 2.0, 3.0))
    monkeypatch.setattr(profiling, "count_launches", lambda fn, warmup=1: 1)
    monkeypatch.setattr(perf, "compile_static", lambda fn: fn)


def _bench_ctx(device):
    from harness.bench import perf
    from harness.parity.suite import provenance

    return perf.Context(dev=device, prov=provenance(device, perf.QUICK, 0), copy_gbps=100.0, sms=4)


def test_bench_run_loop_on_tiny_shapes(device, monkeypatch, tmp_path):
    """The benchmark's run loop with the measurement faked (every callable still runs once, the fused
    kernel under the interpreter): one PerfRow per impl, the wide CSV, 0 mismatches with the cleared
    uniforms, the stops' histogram and the bytes from the chain's lengths; no vLLM column made up.
    Planted: the fused kernel launched without the uniforms (its own draws) is counted as mismatching."""
    import pandas as pd

    from cases.spec_sampling import bench as sb
    from harness.bench import perf
    from harness.bench import perf_rows as pr

    _fake_timings(monkeypatch)
    shape_list = [sb.Shape(B=3, V=300), sb.Shape(B=5, V=4097)]
    rows = perf.run_shapes(sb, shape_list, _bench_ctx(device), tmp_path)
    impls = [r.impl for r in rows[:len(rows) // 2]]  # on a GPU the installed peers follow ours
    assert [r.impl for r in rows] == impls * 2 and {r.op for r in rows} == {OP}
    assert impls[:len(sb.IMPLS)] == list(sb.IMPLS) and set(impls[len(sb.IMPLS):]) <= set(sb.PEERS)
    assert impls == list(sb.IMPLS) or not device.interpreted  # no peer timed under the interpreter
    wide = pd.read_csv(tmp_path / "spec_sampling_bench.csv")
    assert wide["mismatches"].tolist() == [0, 0] and wide["V"].tolist() == [300, 4097]
    hist = [[int(k) for k in h.split("/")] for h in wide["accept_hist"]]
    assert [sum(h) for h in hist] == [3, 5]
    assert wide["rows_read"].tolist() == [sum((n + 1) * k for n, k in enumerate(h)) for h in hist]
    for peer, col in (("vllm-rejection-sampled", "vllm"), ("sglang-chain-sampling", "sglang")):  # none made up
        timed = peer in impls
        assert wide[f"{col}_us"].notna().all() == timed and wide[f"{col}_us"].isna().all() != timed
        assert (wide[f"{col}_launches"] == -1).all() != timed
    assert wide["sglang_mismatches"].tolist() == ([0, 0] if HAVE_SGLANG else [-1, -1])  # compared wherever installed
    assert not pr.launch_failures(rows, {OP: sb.EXPECTED_LAUNCHES})
    plain = fused.launch
    monkeypatch.setattr(fused, "launch", lambda **kw: plain(**{**kw, "uniforms": None, "seed": 7}))
    perf.run_shapes(sb, [sb.Shape(B=64, V=50)], _bench_ctx(device), tmp_path)
    assert pd.read_csv(tmp_path / "spec_sampling_bench.csv")["mismatches"][0] > 0


def test_bench_peer_is_measured_beside_ours(device, monkeypatch, tmp_path):
    """vLLM's sampler (when installed, on a GPU) is timed in the same loop: its own PerfRows, its wide
    columns and its table column against both fused variants."""
    import pandas as pd

    from cases.spec_sampling import bench as sb
    from harness.bench import perf
    from harness.bench import perf_rows as pr

    _fake_timings(monkeypatch)
    monkeypatch.setattr(sb, "_peers", lambda kw, dev: {p: (lambda: None) for p in sb.PEERS})
    rows = perf.run_shapes(sb, [sb.Shape(B=2, V=100)], _bench_ctx(device), tmp_path)
    assert [r.impl for r in rows] == [*sb.IMPLS, *sb.PEERS]
    wide = pd.read_csv(tmp_path / "spec_sampling_bench.csv")
    assert wide["vllm_us"][0] == 2.0 and wide["vllm_over_fused_seeded"][0] == 1.0 and wide["vllm_launches"][0] == 1
    assert wide["sglang_us"][0] == 2.0 and wide["sglang_over_fused"][0] == 1.0 and wide["sglang_launches"][0] == 1
    t = pr.table(pd.DataFrame([dataclasses.asdict(r) for r in rows]), {OP: perf.ours(sb)})
    assert t["impl"].tolist() == ["fused", "fused-seeded"]
    assert t["x_vllm-rejection-sampled_eager"].tolist() == t["x_sglang-chain-sampling_eager"].tolist() == [1.0, 1.0]


def test_bench_without_a_gpu_says_so_and_exits_0(monkeypatch, tmp_path, capsys):
    from cases.spec_sampling import bench as sb
    from harness import devices
    from harness.bench import perf

    monkeypatch.setattr(devices, "gpu_present", lambda: False)  # also on a GPU runner
    out = tmp_path / "runs"
    assert sb.main(["--out", str(out), "--quick"]) == 0
    text = capsys.readouterr().out
    assert "nothing was measured" in text and "would run:" in text and "spec_sampling: 2 shapes x 4 impls" in text
    assert not out.exists()
    seen = {}
    monkeypatch.setattr(perf, "run_ops", lambda mods, **kw: seen.update(kw) or 0)
    sb.main(["--out", str(out), "--b", "8", "--v", "32000", "--v", "151936"])
    assert [s.case for s in seen["shapes"][OP]] == ["B=8,L=4,V=32000", "B=8,L=4,V=151936"]
    assert {s.case for s in sb.shapes(True)} == {"B=1,L=4,V=151936", "B=256,L=4,V=151936"}
    assert {(s.B, s.V) for s in sb.shapes(False)} == {(b, v) for b in (1, 8, 64, 256) for v in (32000, 128256, 151936)}
