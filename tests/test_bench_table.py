"""The benchmarks' graph/eager modes and the summary table of ``python -m harness bench``
(``harness.bench.perf_rows.table``), from given timings and from a whole run with the measurement
faked (no timing is asserted anywhere)."""
from __future__ import annotations

import dataclasses
import math
import types

import pandas as pd
import pytest

from harness import devices
from harness.gpu import profiling
from harness.bench import perf
from harness.bench import perf_rows as pr
from cases.mla_fp8_prepare import bench as mla_fp8_prepare
from cases.qk_norm_rope import bench as qk_norm_rope
from cases.verify_accept import bench as verify_accept
from reports import diff, frames
from reports.rows import PerfRow, Provenance, TimelineRow, columns, write_csv

PROV = Provenance(git_sha="abc123", device="cuda:NVIDIA H200", arch="sm90", fp8_format="e4m3fn", torch="2.11",
                  triton="3.6", shim="", profile="bench-quick", seed=0)


def _t(eager: float, graph: float = math.nan, launches: int = 1) -> pr.Timing:
    return pr.Timing(0.9 * eager, eager, 1.2 * eager, launches, graph)


def _frame(rows: list[PerfRow]) -> pd.DataFrame:
    return pd.DataFrame([dataclasses.asdict(r) for r in rows])


def _two_ops() -> pd.DataFrame:
    """mla_fp8_prepare timed both ways (its reference not captured), with an external impl; qk_norm_rope eager only."""
    mla = {"fused": _t(10.0, 4.0), "reference": _t(40.0), "compiled": _t(20.0, 8.0, 3), "aten5": _t(50.0, 20.0, 5),
           "sglang": _t(30.0, 6.0)}
    rows = pr.perf_rows("mla_fp8_prepare", "B=64,L=4,H=64", mla, bytes_moved=4_000_000, copy_gbps=4000.0,
                        prov=PROV, graph=True)
    rows += pr.perf_rows("qk_norm_rope", "B=1,L=4,H=8,D=512", {"fused": _t(5.0), "reference": _t(15.0),
                                                              "compiled": _t(10.0)},
                         bytes_moved=1_000_000, copy_gbps=4000.0, prov=PROV)
    return _frame(rows)


def test_perf_rows_pair_eager_and_graph_and_keep_a_missing_graph_nan():
    by = {(r.impl, r.mode): r for r in pr.perf_rows("op", "c", {"fused": _t(10.0, 4.0), "reference": _t(40.0),
                                                                "compiled": _t(20.0, 8.0)},
                                                    bytes_moved=4_000_000, copy_gbps=4000.0, prov=PROV, graph=True)}
    assert sorted(by) == sorted((i, m) for i in ("fused", "reference", "compiled") for m in pr.MODES)
    g, e = by["fused", "graph"], by["fused", "eager"]
    assert (g.p50_us, e.p50_us) == (4.0, 10.0) and math.isnan(g.p20_us) and math.isnan(g.p80_us)
    assert g.speedup_vs_compiled == pytest.approx(2.0) and e.speedup_vs_compiled == pytest.approx(2.0)  # same mode
    assert math.isnan(g.speedup_vs_reference) and e.speedup_vs_reference == pytest.approx(4.0)  # reference not captured
    assert math.isnan(by["reference", "graph"].p50_us) and math.isnan(by["reference", "graph"].frac_of_copy)
    assert g.frac_of_copy == pytest.approx(0.25) and e.frac_of_copy == pytest.approx(0.1)  # 4 MB in 4 us / 10 us
    assert g.launches == e.launches == 1
    eager_only = pr.perf_rows("op", "c", {"fused": _t(10.0, 4.0)}, bytes_moved=1, copy_gbps=1.0, prov=PROV)
    assert [r.mode for r in eager_only] == ["eager"]


def test_table_has_graph_and_eager_columns_from_the_right_mode():
    """Planted: the table taking the eager p50 for its graph column (or the graph ratios from the eager
    rows) fails here: the two modes differ in every number."""
    t = pr.table(_two_ops(), {"mla_fp8_prepare": ("fused",), "qk_norm_rope": ("fused",)})
    assert list(t.columns[:5]) == ["op", "case", "impl", "graph_us", "eager_us"]
    assert list(t.columns[-2:]) == ["pct_copy_graph", "pct_copy_eager"]
    assert [c for c in t.columns if c.startswith("x_")] == [
        "x_reference", "x_compiled", "x_aten5", "x_sglang",
        "x_reference_eager", "x_compiled_eager", "x_aten5_eager", "x_sglang_eager"]
    mla, qk = (t[t["op"] == op].iloc[0] for op in ("mla_fp8_prepare", "qk_norm_rope"))
    assert len(t) == 2 and mla["impl"] == qk["impl"] == "fused"
    assert (mla["graph_us"], mla["eager_us"]) == (4.0, 10.0)
    assert mla["x_compiled"] == pytest.approx(2.0) and mla["x_compiled_eager"] == pytest.approx(2.0)
    assert mla["x_aten5"] == pytest.approx(5.0) and mla["x_aten5_eager"] == pytest.approx(5.0)
    assert mla["x_sglang"] == pytest.approx(1.5) and mla["x_sglang_eager"] == pytest.approx(3.0)  # external impl
    assert math.isnan(mla["x_reference"]) and mla["x_reference_eager"] == pytest.approx(4.0)  # not captured
    assert mla["pct_copy_graph"] == pytest.approx(25.0) and mla["pct_copy_eager"] == pytest.approx(10.0)
    # an op timed eager only: its graph columns are missing, never 0 and never the eager number
    assert math.isnan(qk["graph_us"]) and math.isnan(qk["x_reference"]) and math.isnan(qk["pct_copy_graph"])
    assert qk["eager_us"] == 5.0 and qk["x_reference_eager"] == pytest.approx(3.0)
    assert math.isnan(qk["x_sglang_eager"])  # qk_norm_rope has no such impl
    header, _, qk_line = (line.split() for line in pr.print_table(t).splitlines())
    assert header[3] == "graph_us" and qk_line[:5] == ["qk_norm_rope", "B=1,L=4,H=8,D=512", "fused", "missing", "5"]


def test_table_rows_are_ours_only():
    t = pr.table(_two_ops(), {"mla_fp8_prepare": ("fused", "sglang")})
    assert t["impl"].tolist() == ["fused", "sglang"]  # qk_norm_rope names none of its impls ours here
    assert "x_sglang" not in t.columns and t.loc[1, "graph_us"] == 6.0
    assert perf.ours(mla_fp8_prepare) == ("fused",) and perf.ours(qk_norm_rope) == ("fused",)
    assert pr.table(_two_ops(), {}).empty


def test_perf_csv_modes_read_back_and_old_csvs_read_as_eager(tmp_path):
    frame = _two_ops()
    rows = [PerfRow(**r) for r in frame.to_dict("records")]
    back = frames.read([write_csv(rows, tmp_path / "perf.csv", PerfRow)], PerfRow)
    assert back["mode"].value_counts().to_dict() == {"eager": 8, "graph": 5}
    old = frame[frame["mode"] == "eager"].drop(columns="mode")  # a CSV written before graph rows existed
    old.to_csv(tmp_path / "old.csv", index=False)
    back = frames.read([tmp_path / "old.csv"], PerfRow)
    assert list(back.columns) == columns(PerfRow) and set(back["mode"]) == {"eager"}
    bad = frame.assign(mode=["GRAPH"] * len(frame))
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(frames.CSVError, match="mode 'GRAPH'"):
        frames.read([tmp_path / "bad.csv"], PerfRow)
    # TimelineRow has a mode of its own: a timeline CSV without it is still refused, never filled in as "eager"
    pd.DataFrame([{c: 1 for c in columns(TimelineRow) if c != "mode"}]).to_csv(tmp_path / "tl.csv", index=False)
    with pytest.raises(frames.CSVError, match="missing columns \\['mode'\\]"):
        frames.read([tmp_path / "tl.csv"], TimelineRow)


def test_perf_diff_is_per_mode_and_sees_a_slower_graph_median():
    old = _two_ops()
    new = old.copy()
    slower = (new["op"] == "mla_fp8_prepare") & (new["impl"] == "fused") & (new["mode"] == "graph")
    new.loc[slower, "p50_us"] = 8.0  # 4 -> 8 us replayed; its eager row unchanged
    d = diff.perf_diff(old, new)
    assert d[["impl", "check", "old", "new"]].values.tolist() == [["fused", "graph p50_us", 4.0, 8.0]]


@pytest.fixture
def fake_gpu_run(device, monkeypatch):
    """``run_ops`` as on a GPU, on this machine's device: eager p50 2 us, graph 4 us, 1 launch; the
    reference chain cannot be captured (its graph timing raises)."""
    from harness.parity.suite import provenance

    def graph_us(fn, rep=40):
        if fn.__name__ == "reference":
            raise RuntimeError("operation not permitted when stream is capturing")
        fn()
        return 4.0

    monkeypatch.setattr(profiling, "time_quantiles_us", lambda fn, warmup=25, rep=100: (1.0, 2.0, 3.0))
    monkeypatch.setattr(profiling, "graph_time_us", graph_us)
    monkeypatch.setattr(profiling, "count_launches", lambda fn, warmup=1: 1)
    monkeypatch.setattr(perf, "compile_static", lambda fn: fn)
    monkeypatch.setattr(devices, "gpu_present", lambda: True)
    monkeypatch.setattr(perf, "context", lambda profile, seed=0: perf.Context(
        dev=device, prov=provenance(device, profile, seed), copy_gbps=100.0, sms=4))


def test_run_ops_prints_and_writes_the_table(fake_gpu_run, tmp_path, capsys):
    """One run of two ops (mla_fp8_prepare graph + eager, verify_accept eager): perf.csv has both
    modes, table.csv and the printed table carry graph and eager, a graph timing that failed is
    'missing' (the reference chain's), never 0."""
    # verify_accept's module stands in for an op timed eager only (no GRAPH_REP_MS), of one launch (the fake's)
    eager_only = types.SimpleNamespace(**{k: v for k, v in vars(verify_accept).items() if k != "GRAPH_REP_MS"})
    eager_only.EXPECTED_LAUNCHES = {"fused": 1}
    shapes = {"mla_fp8_prepare": [mla_fp8_prepare.Shape(1, 8)], "verify_accept": [verify_accept.Shape(1, 64)]}
    assert perf.run_ops([mla_fp8_prepare, eager_only], out=tmp_path, quick=True, nested=True, shapes=shapes) == 0
    text = capsys.readouterr().out
    assert "reference: no graph timing (RuntimeError: operation not permitted" in text
    rows = frames.read([tmp_path / "perf.csv"], PerfRow)
    mla = rows[rows["op"] == "mla_fp8_prepare"]
    assert (mla.groupby("mode").size() == len(mla_fp8_prepare.IMPLS)).all()
    assert mla[(mla["mode"] == "graph") & (mla["impl"] == "reference")]["p50_us"].isna().all()
    assert set(rows[rows["op"] == "verify_accept"]["mode"]) == {"eager"}
    t = pd.read_csv(tmp_path / "table.csv")
    assert t[["op", "impl"]].values.tolist() == [["mla_fp8_prepare", "fused"], ["verify_accept", "fused"]]
    m, q = t.iloc[0], t.iloc[1]
    assert (m["graph_us"], m["eager_us"], m["x_compiled"], m["x_aten5_eager"]) == (4.0, 2.0, 1.0, 1.0)
    assert math.isnan(m["x_reference"]) and m["x_reference_eager"] == 1.0  # the chain was not captured
    assert math.isnan(q["graph_us"]) and q["eager_us"] == 2.0
    table_text = text[text.index("ours per shape"):]
    lines = [line.split() for line in table_text.splitlines()[1:4]]
    assert lines[0][:5] == ["op", "case", "impl", "graph_us", "eager_us"]
    assert lines[1][:6] == ["mla_fp8_prepare", "B=1,L=4,H=8", "fused", "4", "2", "missing"]  # x_reference (graph)
    assert lines[2][:5] == ["verify_accept", verify_accept.Shape(1, 64).case, "fused", "missing", "2"]
    wide = pd.read_csv(tmp_path / "mla_fp8_prepare" / "bench.csv")
    assert wide["reference_graph_us"].isna().all() and math.isnan(wide["reference_over_fused_graph"][0])


def test_mla_bench_chain_writes_what_the_reference_writes():
    """The benchmark's reference chain (capturable: no ``loc >= 0`` mask) returns and writes the bytes of
    ``reference.mla_fp8_prepare.chain`` on the benchmark's inputs. Planted: the k casts without the descale
    fail (the KV rows differ)."""
    import torch

    from reference.mla_fp8_prepare import chain as r

    kw = mla_fp8_prepare._inputs(8, 4, torch.device("cpu"))
    ours_buf = kw.pop("kv_buffer")
    ref_buf = ours_buf.clone()
    inv = torch.tensor(r.inv_descale(mla_fp8_prepare.KV_DESCALE), dtype=torch.float32)
    q8 = mla_fp8_prepare._chain(kw["q_nope"], kw["q_rope"], kw["k_nope"], kw["k_rope"], ours_buf, kw["loc"], inv)
    q8_ref = r.mla_fp8_prepare(**kw, kv_buffer=ref_buf, kv_descale=mla_fp8_prepare.KV_DESCALE)
    assert torch.equal(q8.view(torch.uint8), q8_ref.view(torch.uint8))
    assert torch.equal(ours_buf.view(torch.uint8), ref_buf.view(torch.uint8))
    assert ours_buf.view(torch.uint8)[kw["loc"]].any()  # the rows were written
