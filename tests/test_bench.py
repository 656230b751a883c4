"""The benchmarks' CPU-testable parts: PerfRow assembly from given timings, launch checks, the
summary, the shape lists and their time budget, argument parsing, the no-GPU exit, and each op's
run loop with the measurement faked (no timing is asserted anywhere)."""
from __future__ import annotations

import dataclasses
import importlib
import math

import pandas as pd
import torch
import pytest

from harness import devices
from harness.gpu import profiling
from harness.bench import perf
from harness.bench import perf_rows as pr
from cases.mla_fp8_prepare import bench as mla_fp8_prepare
from cases.qk_norm_rope import bench as qk_norm_rope
from cases.verify_attention import bench as verify_attention
from harness.bench import __main__ as bench_main
from reports import frames
from reports.rows import PerfRow, Provenance, columns, write_csv

MODULES = tuple(importlib.import_module(m) for m in bench_main.OPS.values())  # every op's benchmark (OpSpec.bench), as `python -m harness bench` runs them
PROV = Provenance(git_sha="abc123", device="cuda:NVIDIA H200", arch="sm90", fp8_format="e4m3fn", torch="2.11",
                  triton="3.6", shim="", profile="bench-quick", seed=0)


def _t(p50: float, launches: int = 1) -> pr.Timing:
    return pr.Timing(0.9 * p50, p50, 1.2 * p50, launches)


# ----------------------------------------------------------------------------- PerfRow assembly

def test_perf_rows_ratios_bandwidth_and_provenance():
    timings = {"fused": _t(10.0), "reference": _t(40.0, 5), "compiled": _t(20.0, 2), "aten5": _t(50.0, 5)}
    rows = pr.perf_rows("mla_fp8_prepare", "B=8,L=4,H=16", timings, bytes_moved=4_800_000, copy_gbps=4000.0,
                        prov=PROV)
    by = {r.impl: r for r in rows}
    assert list(by) == ["fused", "reference", "compiled", "aten5"]
    f = by["fused"]
    assert (f.p20_us, f.p50_us, f.p80_us) == (9.0, 10.0, 12.0)
    assert (f.reference_p50_us, f.compiled_p50_us) == (40.0, 20.0)
    assert f.speedup_vs_reference == pytest.approx(4.0)
    assert f.speedup_vs_compiled == pytest.approx(2.0)
    assert f.gbps == pytest.approx(480.0)  # 4.8 MB in 10 us
    assert f.frac_of_copy == pytest.approx(0.12)
    assert by["reference"].speedup_vs_reference == pytest.approx(1.0)
    assert by["compiled"].speedup_vs_reference == pytest.approx(2.0)
    assert by["aten5"].speedup_vs_reference == pytest.approx(0.8)  # slower than the chain: < 1
    assert by["aten5"].gbps == pytest.approx(96.0)
    assert [r.launches for r in rows] == [1, 5, 2, 5]
    assert all(r.op == "mla_fp8_prepare" and r.case == "B=8,L=4,H=16" for r in rows)
    assert all({k: getattr(r, k) for k in columns(Provenance)} == dataclasses.asdict(PROV) for r in rows)


def test_perf_rows_missing_timings_are_nan_not_zero():
    rows = pr.perf_rows("op", "c", {"fused": _t(10.0), "reference": pr.NOT_MEASURED}, bytes_moved=1000,
                        copy_gbps=100.0, prov=PROV)
    by = {r.impl: r for r in rows}
    assert math.isnan(by["fused"].speedup_vs_reference)  # reference out of memory
    assert math.isnan(by["fused"].speedup_vs_compiled)  # no compiled impl at all
    assert math.isnan(by["fused"].compiled_p50_us)
    assert math.isnan(by["reference"].gbps) and math.isnan(by["reference"].frac_of_copy)
    assert by["reference"].launches == -1
    assert by["fused"].gbps == pytest.approx(0.1)


def test_ratio_edges():
    assert pr.ratio(6.0, 3.0) == 2.0
    assert math.isnan(pr.ratio(1.0, 0.0))
    assert math.isnan(pr.ratio(math.nan, 1.0))
    assert math.isnan(pr.ratio(1.0, math.nan))


def test_launch_failures_flag_only_expected_impls():
    timings = {"fused": _t(1.0, 2), "reference": _t(2.0, 7)}
    rows = pr.perf_rows("qk_norm_rope", "B=1", timings, bytes_moved=1, copy_gbps=1.0, prov=PROV)
    verify = {"fused-shared-kv": _t(1.0, 2), "fused-split-kv": pr.NOT_MEASURED}
    rows += pr.perf_rows("verify_attention", "gqa", verify, bytes_moved=1, copy_gbps=1.0, prov=PROV)
    bad = pr.launch_failures(rows, {m.OP: m.EXPECTED_LAUNCHES for m in MODULES})
    assert bad == ["qk_norm_rope fused B=1: 2 kernel launches, expected 1",
                   "verify_attention fused-split-kv gqa: -1 kernel launches, expected 2 (not measured)"]
    # timed both ways: still one line per (op, impl, shape); planted: graph rows counted too doubles it
    both = pr.perf_rows("qk_norm_rope", "B=1", timings, bytes_moved=1, copy_gbps=1.0, prov=PROV, graph=True)
    assert len(both) == 4 and pr.launch_failures(both, {"qk_norm_rope": {"fused": 1}}) == bad[:1]
    ok = pr.perf_rows("qk_norm_rope", "B=1", {"fused": _t(1.0, 1)}, bytes_moved=1, copy_gbps=1.0, prov=PROV)
    assert pr.launch_failures(ok, {"qk_norm_rope": {"fused": 1}}) == []


def test_summary_geomean_min_and_launches():
    rows = []
    for case, ref in (("a", 20.0), ("b", 80.0)):  # fused 10 us: x2 and x8 -> geomean x4
        rows += pr.perf_rows("qk_norm_rope", case, {"fused": _t(10.0), "reference": _t(ref, 3), "compiled": _t(5.0)},
                             bytes_moved=1000, copy_gbps=1.0, prov=PROV)
    s = pr.summary(pd.DataFrame([dataclasses.asdict(r) for r in rows])).set_index("impl")
    assert s.loc["fused", "shapes"] == 2
    assert s.loc["fused", "x_reference_geomean"] == pytest.approx(4.0)
    assert s.loc["fused", "x_reference_min"] == pytest.approx(2.0)
    assert s.loc["fused", "x_compiled_geomean"] == pytest.approx(0.5)
    assert s.loc["reference", "launches"] == "3"


def test_perf_csv_reads_back_as_perf_rows(tmp_path):
    rows = pr.perf_rows("qk_norm_rope", "B=1,L=4,H=8,D=512", {"fused": _t(3.0), "reference": pr.NOT_MEASURED},
                        bytes_moved=10_000, copy_gbps=4000.0, prov=PROV)
    frame = frames.read([write_csv(rows, tmp_path / "perf.csv")], PerfRow)
    assert list(frame.columns) == columns(PerfRow)
    assert frame["impl"].tolist() == ["fused", "reference"]
    assert frame.loc[0, "shim"] == "" and frame.loc[1, "launches"] == -1


# ----------------------------------------------------------------------------- shapes and budget

@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.OP)
def test_shape_lists(mod):
    quick, full = mod.shapes(True), mod.shapes(False)
    assert set(quick) < set(full)
    for lst in (quick, full):
        assert len({s.case for s in lst}) == len(lst)  # (op, impl, case) is the perf diff key
    assert set(mod.EXPECTED_LAUNCHES) <= set(mod.IMPLS)
    assert {"reference", "compiled"} <= set(mod.IMPLS)


def test_verify_sized_token_shapes():
    for mod in (qk_norm_rope, mla_fp8_prepare):
        full = mod.shapes(False)
        assert {s.T for s in full} == {4 * s.B for s in full}  # 3 drafts + the bonus token per request
        assert min(s.B for s in full) == 1 and max(s.B for s in full) == 64
        assert {s.H for s in full} == {8, 16, 32, 64}
    assert {s.case for s in qk_norm_rope.shapes(True)} == {"B=1,L=4,H=16,D=512", "B=1,L=4,H=64,D=512",
                                                          "B=64,L=4,H=16,D=512", "B=64,L=4,H=64,D=512"}
    full = verify_attention.shapes(False)
    assert {s.layout for s in full} == {"gqa", "mla"} and max(s.prefix for s in full) == 65536
    assert mla_fp8_prepare.shapes(False, b=[2, 3], h=[4]) == [mla_fp8_prepare.Shape(2, 4), mla_fp8_prepare.Shape(3, 4)]


def test_time_budget_of_the_plans():
    """shapes x impls x (do_bench warmup + rep, a profiler session, one compile per shape)."""
    for quick, budget in ((True, perf.QUICK_BUDGET_S), (False, perf.FULL_BUDGET_S)):
        total = sum(perf.estimate_s(m, m.shapes(quick)) for m in MODULES)
        assert total <= budget, f"{'quick' if quick else 'full'} plan ~{total:.0f} s > {budget:.0f} s"
    one = perf.estimate_s(qk_norm_rope, qk_norm_rope.shapes(True)[:1])
    assert perf.estimate_s(qk_norm_rope, qk_norm_rope.shapes(True)) == pytest.approx(4 * one)


# ----------------------------------------------------------------------------- CLI

def test_main_parses_ops_and_flags(monkeypatch, tmp_path):
    seen = {}

    def fake_run_ops(mods, **kw):
        seen.update(ops=[m.OP for m in mods], **kw)
        return 7

    monkeypatch.setattr(perf, "run_ops", fake_run_ops)
    assert bench_main.main(["--out", str(tmp_path)]) == 7
    assert seen["ops"] == [m.OP for m in MODULES]
    assert seen["quick"] is False and seen["nested"] is True and seen["out"] == tmp_path
    bench_main.main(["--out", str(tmp_path), "--quick", "--op", "verify_attention", "--op", "qk_norm_rope",
                     "--op", "verify_attention"])
    assert seen["ops"] == ["verify_attention", "qk_norm_rope"] and seen["quick"] is True
    with pytest.raises(SystemExit):
        bench_main.main(["--out", str(tmp_path), "--op", "no_such_op"])
    with pytest.raises(SystemExit):
        bench_main.main(["--quick"])  # --out is required
    mla_fp8_prepare.main(["--out", str(tmp_path), "--b", "2", "--h", "8", "--h", "16"])
    assert seen["ops"] == ["mla_fp8_prepare"] and seen["nested"] is False
    assert [s.case for s in seen["shapes"]["mla_fp8_prepare"]] == ["B=2,L=4,H=8", "B=2,L=4,H=16"]


@pytest.mark.parametrize("main", [bench_main.main, qk_norm_rope.main, mla_fp8_prepare.main, verify_attention.main],
                         ids=["all", "qk_norm_rope", "mla_fp8_prepare", "verify_attention"])
def test_no_gpu_measures_nothing_and_exits_0(main, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(devices, "gpu_present", lambda: False)  # also on a GPU runner
    out = tmp_path / "runs"
    assert main(["--out", str(out), "--quick"]) == 0
    text = capsys.readouterr().out
    assert "nothing was measured" in text and "Triton interpreter" in text and "would run:" in text
    assert not out.exists()


# ----------------------------------------------------------------------------- run loops, measurement faked

@pytest.fixture
def fake_measurement(monkeypatch):
    """p20/p50/p80 = 1/2/3 us and 1 launch for every call, 4 us replayed from a graph (the callable
    still runs once: a broken stage launch fails); torch.compile replaced by eager."""
    monkeypatch.setattr(profiling, "time_quantiles_us", lambda fn, warmup=25, rep=100: (1.0, 2.0, 3.0))
    monkeypatch.setattr(profiling, "graph_time_us", lambda fn, rep=40: (fn(), 4.0)[1])
    monkeypatch.setattr(profiling, "count_launches", lambda fn, warmup=1: 1)
    monkeypatch.setattr(perf, "compile_static", lambda fn: fn)


@pytest.mark.parametrize("mod, shape, csv", [
    (qk_norm_rope, qk_norm_rope.Shape(B=1, H=8), "qk_norm_rope_bench.csv"),
    (mla_fp8_prepare, mla_fp8_prepare.Shape(B=1, H=8), "bench.csv"),
    (verify_attention, verify_attention.Shape("gqa", B=1, prefix=40, H=4), "verify_attention_bench.csv"),
], ids=lambda x: getattr(x, "OP", None))
def test_run_loop_rows(mod, shape, csv, device, fake_measurement, tmp_path, monkeypatch):
    from harness.parity.suite import provenance

    if hasattr(mod, "_peers"):  # installed peers (a GPU with sglang) have their own tests below
        monkeypatch.setattr(mod, "_peers", lambda kw, dev: {})
    ctx = perf.Context(dev=device, prov=provenance(device, perf.QUICK, 0), copy_gbps=100.0, sms=4)
    rows = perf.run_shapes(mod, [shape], ctx, tmp_path)
    eager, graph = ([r for r in rows if r.mode == mode] for mode in pr.MODES)
    assert [r.impl for r in eager] == list(mod.IMPLS)
    assert [r.impl for r in graph] == (list(mod.IMPLS) if hasattr(mod, "GRAPH_REP_MS") else [])
    assert len(eager) + len(graph) == len(rows)
    assert {r.case for r in rows} == {shape.case} and {r.op for r in rows} == {mod.OP}
    assert all(r.p50_us == 2.0 and r.speedup_vs_reference == 1.0 and r.speedup_vs_compiled == 1.0 for r in eager)
    assert all(r.p50_us == 4.0 and math.isnan(r.p20_us) and math.isnan(r.p80_us) for r in graph)  # the replayed median
    assert all(r.frac_of_copy == pytest.approx(r.gbps / 100.0) and r.gbps > 0 for r in rows)
    assert {r.profile for r in rows} == {"bench-quick"} and {r.device for r in rows} == {f"{device.kind}:{device.name}"}
    wide = pd.read_csv(tmp_path / csv)
    assert len(wide) == 1
    if mod is mla_fp8_prepare:  # eager and graph side by side; planted: the eager p50 in the graph column fails
        assert wide["fused_us"][0] == 2.0 and (wide[[f"{i}_graph_us" for i in mod.IMPLS]] == 4.0).all(axis=None)
        assert wide["reference_over_fused_graph"][0] == 1.0
        assert wide["fused_graph_frac_of_copy"][0] == pytest.approx(wide["fused_frac_of_copy"][0] / 2)
    if mod is verify_attention:  # replayed from a graph; planted: eager stage timings (2 us here) fail
        assert (wide[["shared_prefix_ms", "shared_combine_ms", "shared_graph_ms"]] == 0.004).all(axis=None)
        kv = verify_attention.kv_bytes_read("gqa", 1, 40, 256, 256)
        assert wide["shared_graph_pct_copy"][0] == pytest.approx(100 * kv / 4e-6 / 1e9 / 100.0)
        assert wide["shared_bf16p_ms"][0] == 0.002 and wide["shared_over_bf16p"][0] == 1.0  # its own column
    # the faked single launch is right for the one-launch kernels and wrong for verify's two
    bad = pr.launch_failures(rows, {mod.OP: mod.EXPECTED_LAUNCHES})
    assert len(bad) == (len(verify_attention.EXPECTED_LAUNCHES) if mod is verify_attention else 0)


def test_block_config_sweep_candidates_and_no_gpu_path(tmp_path, capsys, monkeypatch):
    from harness.bench import sweep

    assert len(sweep.candidates()) == 3 * 4 * 2 * 3 and len(sweep.candidates(quick=True)) == 16
    assert all(bh in (4, 8, 16) and bn >= 16 for bh, bn, _, _ in sweep.candidates())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.main(["--out", str(tmp_path / "s")]) == 0
    assert "nothing measured" in capsys.readouterr().out and not (tmp_path / "s").exists()


def test_bench_splits_keep_two_programs_per_sm_at_most():
    """Planted: the old rounding up (5 splits, 320 programs at B 64 prefix 16K) fails."""
    from cases.verify_attention import bench as vb

    assert vb.splits_for(64, 16384, 1, 132) == 4  # 256 programs, not 320 (5 splits: a partial third wave)
    assert vb.splits_for(64, 4096, 2, 132) == 2
    assert vb.splits_for(8, 16384, 1, 132) == 33
    assert vb.splits_for(1, 1024, 1, 132) == 4  # each split >= 256 tokens
    assert vb.splits_for(600, 300, 1, 132) == 1
    for B, n, blocks in ((1, 65536, 1), (8, 4096, 2), (64, 1024, 1), (24, 70000, 4)):
        assert vb.splits_for(B, n, blocks, 132) * B * blocks <= 2 * 132 or vb.splits_for(B, n, blocks, 132) == 1


def test_device_timers_refuse_a_machine_without_a_gpu(monkeypatch):
    """No CPU fallback that would time the interpreter and call it a GPU number. Planted:
    graph_time_us without its GPU check fails (a different error, or a timing)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    calls = []
    for timer in (profiling.graph_time_us, profiling.time_quantiles_us):
        with pytest.raises(RuntimeError, match="needs a GPU"):
            timer(lambda: calls.append(1))
    assert calls == []


def test_verify_attention_peers_are_measured_beside_ours(device, fake_measurement, tmp_path, monkeypatch):
    """SGLang's kernels (when installed, on a GPU) are timed in the same loop: their own PerfRows and wide
    columns, and the ratio against our kernel of the same class. Planted: peers dropped from the timing
    fails the rows and leaves the column NaN."""
    from harness.parity.suite import provenance

    monkeypatch.setattr(verify_attention, "_peers", lambda kw, dev: {"sglang-shared-kv": lambda: None})
    ctx = perf.Context(dev=device, prov=provenance(device, perf.QUICK, 0), copy_gbps=100.0, sms=4)
    rows = perf.run_shapes(verify_attention, [verify_attention.Shape("gqa", B=1, prefix=40, H=4)], ctx, tmp_path)
    assert [r.impl for r in rows] == list(verify_attention.IMPLS) + ["sglang-shared-kv"]
    wide = pd.read_csv(tmp_path / "verify_attention_bench.csv")
    assert wide["sglang_shared_ms"][0] == 0.002 and wide["sglang_shared_over_bf16p"][0] == 1.0
    assert wide["sglang_split_ms"].isna().all()  # not measured: NaN, never a made-up number


def test_no_peers_under_the_interpreter(device):
    if not device.interpreted:
        pytest.skip("the interpreter's rule")
    assert verify_attention._peers({}, device) == {} and qk_norm_rope._peers({}, device) == {}


def test_verify_attention_shape_filter(capsys):
    """--prefix / --batch pick shapes of the full set (the plan says how many); none matching is an error."""
    if devices.gpu_present():
        pytest.skip("prints the plan only without a GPU")
    assert verify_attention.main(["--out", "unused", "--prefix", "16384", "--batch", "64"]) == 0
    assert "verify_attention: 2 shapes" in capsys.readouterr().out  # GQA and MLA
    with pytest.raises(SystemExit):
        verify_attention.main(["--out", "unused", "--prefix", "7"])


def test_wrapper_checks_stubs_the_validators_and_joins_a_baseline(device):
    """``harness.bench.wrapper_checks``: every entry hands its validators legal arguments, the
    unchecked call really runs without the shared validator (a bad eps passes the stub, and the
    real one is back afterwards), one row is measured, and the baseline ratios are this / base."""
    from harness.bench import wrapper_checks as wc
    from reference import checks
    from reference.qk_norm_rope import chain as rq

    es = wc.entries(device, small=True)
    assert {e.wrapper for e in es} == {"fused.qk_norm_rope.wrapper", "fused.mla_fp8_prepare.wrapper", "fused.mla_fp8_prepare_step",
                                       "fused.verify_split_kv", "fused.verify_shared_kv", "fused.verify_attention.wrapper"}
    for e in es:
        kw = e.build()
        for mod, name, args in e.validators:
            getattr(mod, name)(**args(kw))
    e = es[0]
    kw = e.build()
    results = [(m, n, getattr(m, n)(**a(kw))) for m, n, a in e.validators]
    with wc._stubbed(results):
        assert rq.validate(**{**kw, "eps": -1.0}) == results[0][2]
    with pytest.raises(checks.RangeError):
        rq.validate(**{**kw, "eps": -1.0})
    # the MLA step checks its data tensors before covered() as well: every validator it calls is stubbed
    step = next(e for e in es if e.wrapper == "fused.mla_fp8_prepare_step")
    kw = step.build()
    with wc._stubbed([(m, n, getattr(m, n)(**a(kw))) for m, n, a in step.validators]):
        step.call(**{**kw, "kv_descale": -1.0})
    row = wc.measure(e, lambda: devices.synchronize(device), iters=1, repeats=1)
    assert min(row.wrapper_us, row.unchecked_us, row.validate_us) > 0
    assert (row.validate_syncs == -1) == (not torch.cuda.is_available())
    base = [dict(dataclasses.asdict(row), wrapper_us=2 * row.wrapper_us, validate_us=row.validate_us / 2)]
    frame = wc.report([row], base)
    assert frame["wrapper_x_base"][0] == pytest.approx(0.5) and frame["validate_x_base"][0] == pytest.approx(2.0)


def test_qk_norm_rope_peer_is_measured_beside_ours(device, fake_measurement, tmp_path, monkeypatch):
    """SGLang's kernel (when installed, on a GPU) is timed in the same loop as ours, eager and replayed
    from a graph: its own PerfRows, wide columns and table columns. Planted: the peer dropped from the
    timing fails the rows and leaves its columns NaN; its graph timing left out fails the graph rows."""
    from harness.parity.suite import provenance

    monkeypatch.setattr(qk_norm_rope, "_peers", lambda kw, dev: {"sglang-qk-norm-rope": lambda: None})
    ctx = perf.Context(dev=device, prov=provenance(device, perf.QUICK, 0), copy_gbps=100.0, sms=4)
    rows = perf.run_shapes(qk_norm_rope, [qk_norm_rope.Shape(B=1, H=8)], ctx, tmp_path)
    for mode in pr.MODES:
        assert [r.impl for r in rows if r.mode == mode] == list(qk_norm_rope.IMPLS) + ["sglang-qk-norm-rope"]
    wide = pd.read_csv(tmp_path / "qk_norm_rope_bench.csv")
    assert wide["sglang_us"][0] == 2.0 and wide["sglang_graph_us"][0] == 4.0 and wide["fused_graph_us"][0] == 4.0
    assert wide["sglang_over_fused_graph"][0] == 1.0
    t = pr.table(pd.DataFrame([dataclasses.asdict(r) for r in rows]), {"qk_norm_rope": perf.ours(qk_norm_rope)})
    assert t["x_sglang-qk-norm-rope"].tolist() == [1.0] and t["x_sglang-qk-norm-rope_eager"].tolist() == [1.0]


def test_qk_norm_rope_without_peers_leaves_their_columns_nan(device, fake_measurement, tmp_path, monkeypatch):
    """SGLang not installed (or the interpreter): NaN, never a made-up number. Planted: 0 for a peer not
    measured fails."""
    from harness.parity.suite import provenance

    monkeypatch.setattr(qk_norm_rope, "_peers", lambda kw, dev: {})

    ctx = perf.Context(dev=device, prov=provenance(device, perf.QUICK, 0), copy_gbps=100.0, sms=4)
    perf.run_shapes(qk_norm_rope, [qk_norm_rope.Shape(B=1, H=8)], ctx, tmp_path)
    wide = pd.read_csv(tmp_path / "qk_norm_rope_bench.csv")
    assert wide[["sglang_us", "sglang_graph_us", "sglang_over_fused_graph"]].isna().all(axis=None)


# ----------------------------------------------------------------------------- SGLang's JIT CUDA kernel beside mla_fp8_prepare

@pytest.mark.parametrize("machine", ["this", "rocm"])
def test_mla_jit_peer_refused_in_one_line_its_columns_nan_with_the_reason(machine, device, fake_measurement,
                                                                          tmp_path, monkeypatch, capsys):
    """Where SGLang's JIT kernel cannot run (no CUDA device or nvcc here; ROCm), the plan says so in one line
    (``sglang_jit.missing``), never an error; the run measures the rest and leaves its columns NaN with that
    reason. Planted: the refusal removed (the kernel called as if it ran) fails: an error, or another reason."""
    from harness.adapters import sglang_jit
    from harness.parity.suite import provenance

    if machine == "rocm":
        monkeypatch.setattr(sglang_jit, "_is_hip", lambda: True)
    lacks = sglang_jit.missing("fp8")
    if not lacks:
        pytest.skip("this machine runs SGLang's JIT kernels: the refusal is the CPU's and ROCm's")
    assert "\n" not in lacks and (lacks.startswith("ROCm") if machine == "rocm" else True)
    gpu = devices.gpu_present()
    monkeypatch.setattr(devices, "gpu_present", lambda: False)
    assert mla_fp8_prepare.main(["--out", str(tmp_path / "plan"), "--quick"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if mla_fp8_prepare.JIT in line and "refused" in line]
    assert said == [f"  mla_fp8_prepare: {mla_fp8_prepare.JIT} refused on this machine: {lacks}"]
    monkeypatch.setattr(devices, "gpu_present", lambda: gpu)

    ctx = perf.Context(dev=device, prov=provenance(device, perf.QUICK, 0), copy_gbps=100.0, sms=4)
    shapes = [mla_fp8_prepare.Shape(B=1, H=8), mla_fp8_prepare.Shape(B=2, H=8)]
    rows = perf.run_shapes(mla_fp8_prepare, shapes, ctx, tmp_path)
    assert [r.impl for r in rows if r.mode == "eager"] == list(mla_fp8_prepare.IMPLS) * 2  # the rest measured
    assert mla_fp8_prepare.JIT not in capsys.readouterr().out  # said once, by the plan
    wide = pd.read_csv(tmp_path / "bench.csv")
    jit_cols = ["sglang_jit_us", "sglang_jit_graph_us", "fused_over_sglang_jit", "fused_over_sglang_jit_graph"]
    assert wide[jit_cols].isna().all(axis=None) and (wide["fused_graph_us"] == 4.0).all()
    assert wide["sglang_jit_refused"].tolist() == [lacks, lacks]


def test_mla_jit_peer_is_measured_beside_ours(device, fake_measurement, tmp_path, monkeypatch, capsys):
    """Where it runs (here: the adapter over the kernel's torch emulation, nothing missing), the JIT kernel is
    timed in the same loop: its PerfRows, its wide columns (ours / it) and the table's x_ column; a shape its
    gate declines keeps the gate's reason, said once. Planted: the peer left out of the timing fails."""
    from harness.adapters import sglang_jit
    from harness.adapters import sglang_jit_emulation as emu
    from harness.parity.suite import provenance

    monkeypatch.setattr(sglang_jit, "missing", lambda kernel: "")
    monkeypatch.setattr(sglang_jit, "sglang", lambda: emu.KERNELS)
    ctx = perf.Context(dev=device, prov=provenance(device, perf.QUICK, 0), copy_gbps=100.0, sms=4)
    rows = perf.run_shapes(mla_fp8_prepare, [mla_fp8_prepare.Shape(B=1, H=8)], ctx, tmp_path)
    for mode in pr.MODES:
        assert [r.impl for r in rows if r.mode == mode] == list(mla_fp8_prepare.IMPLS) + [mla_fp8_prepare.JIT]
    wide = pd.read_csv(tmp_path / "bench.csv", keep_default_na=False)
    assert wide["sglang_jit_us"][0] == 2.0 and wide["sglang_jit_graph_us"][0] == 4.0
    assert wide["fused_over_sglang_jit"][0] == 1.0 and wide["fused_over_sglang_jit_graph"][0] == 1.0
    assert wide["sglang_jit_refused"][0] == ""
    t = pr.table(pd.DataFrame([dataclasses.asdict(r) for r in rows]), {"mla_fp8_prepare": perf.ours(mla_fp8_prepare)})
    assert t[f"x_{mla_fp8_prepare.JIT}"].tolist() == [1.0]

    # a pool the gate declines (e4m3fnuz: covered_fp8 takes e4m3fn pools only): its reason, once, in every row
    fnuz = devices.Device(device.kind, device.name, device.arch, "e4m3fnuz", device.shim)
    ctx = dataclasses.replace(ctx, dev=fnuz)
    perf.run_shapes(mla_fp8_prepare, [mla_fp8_prepare.Shape(B=1, H=8), mla_fp8_prepare.Shape(B=2, H=8)], ctx, tmp_path)
    said = [line for line in capsys.readouterr().out.splitlines() if "not measured" in line]
    assert len(said) == 1 and "float8_e4m3fn (or uint8)" in said[0], said
    wide = pd.read_csv(tmp_path / "bench.csv")
    assert wide["sglang_jit_us"].isna().all() and wide["sglang_jit_refused"].str.contains("e4m3fn").all()


def test_measure_keeps_going_when_one_callable_fails(monkeypatch, capsys):
    """A baseline that fails at one shape (torch.compile's codegen did, for spec_sampling's chain at
    B 256 x V 151,936 under torch 2.11) is one not-measured column, not the end of the bench."""
    monkeypatch.setattr(profiling, "time_quantiles_us", lambda fn, warmup, rep: (fn(), (1.0, 3.0, 5.0))[1])
    monkeypatch.setattr(profiling, "count_launches", lambda fn, warmup: 1)

    def broken():
        raise TypeError("list indices must be integers or slices, not NoneType")

    t = perf.measure({"fused": lambda: None, "compiled": broken, "peer": lambda: None}, devices.select("cpu"),
                     warmup_ms=1, rep_ms=1)
    assert t["compiled"] is pr.NOT_MEASURED
    assert t["fused"].p50_us == 3.0 and t["peer"].launches == 1
    assert "compiled: failed, not measured (TypeError: list indices" in capsys.readouterr().out
