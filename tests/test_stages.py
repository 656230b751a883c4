"""Per-stage wall time of a parity run (``harness.parity.stages``): every stage of a run is timed, the
``impl`` stage is exactly the first call's time the rows report, and ``run --stage-times``
prints the table."""
from __future__ import annotations

import re

import pandas as pd

from cases import profiles
from harness.parity import stages
from harness.parity import suite
from tests.helpers import harness_cli, subprocess_env


def test_every_stage_is_timed_and_impl_is_the_first_calls_time(registry, device):
    """Planted: timing the impl stage around the call and its checks (or not at all) fails the
    equality with ``CaseResult.seconds``; a stage left untimed fails the set."""
    table = stages.Table()
    impls = [registry.impls["qk_norm_rope/reference"], registry.impls["qk_norm_rope/fused"]]
    rows = suite.run(registry, dev=device, profile=profiles.current("dev"), ops=["qk_norm_rope"], impls=impls,
                     generated=0, progress=False, case_filter="one-token-one-head", stage_table=table)
    f = table.frame()
    compiled = f["stage"].str.startswith(f"({stages.COMPILE},")  # the Triton compiles of the run: a GPU's only
    assert not (compiled.any() and device.interpreted), f
    f = f[~compiled]
    assert set(f["stage"]) == set(stages.STAGES) - {"allowance"} | {"all"}  # allowance: precision classes only
    assert (f["runs"] == 2).all() and (f["total_s"] > 0).all()
    first_calls = pd.DataFrame([r.__dict__ for r in rows]).groupby("impl")["seconds"].first().sum()
    impl = f.set_index("stage").loc["impl", "total_s"]
    assert abs(impl - first_calls) < 0.01 * max(first_calls, 0.01) + 1e-3, (impl, first_calls)
    assert abs(f[f["stage"] != "all"]["share"].sum() - 1.0) < 1e-9
    if device.interpreted:  # the interpreter compiles nothing
        assert stages.compile_line(table) == f"{stages.COMPILE_LINE}: 0 kernels, 0.0 s"
    else:  # on a GPU: what this process compiled for the run (none when an earlier test compiled the same kernels)
        assert re.fullmatch(rf"{re.escape(stages.COMPILE_LINE)}: \d+ kernels, \d+\.\d s", stages.compile_line(table))


def test_run_stage_times_prints_the_table(tmp_path):
    r = harness_cli(["run", "--device", "cpu", "--op", "qk_norm_rope", "--generated", "0", "--case",
                     "one-token-one-head", "--quiet", "--stage-times", "--csv", tmp_path / "s.csv"],
                    env=subprocess_env(OMP_NUM_THREADS="1"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    table = r.stdout.split("stage times", 1)[1]
    assert all(f"qk_norm_rope {s} " in " ".join(table.split()) for s in ("inputs", "oracle", "impl", "rows"))


def test_median_separates_one_time_costs_from_the_steady_state():
    """A first run that pays a one-time cost moves the mean, not the median; ``all`` is the median
    run's total. Planted: a median over the runs that have the stage (not counting a missing one as
    0) gives 2 ms for ``poisoned``; a sum of the stage medians for ``all`` gives 3 ms, not 5."""
    table = stages.Table()
    table.add("op", {"impl": 1.0, "compare": 0.001})
    table.add("op", {"impl": 0.001, "compare": 0.002, "poisoned": 0.002})
    table.add("op", {"impl": 0.002, "compare": 0.001})
    table.add("op", {"rows": 0.0005}, run=False)
    f = table.frame().set_index("stage")
    assert f.loc["impl", "median_ms"] == 2.0 and abs(f.loc["impl", "mean_ms"] - 1003 / 3) < 1e-9
    assert f.loc["poisoned", "median_ms"] == 0.0
    assert abs(f.loc["all", "median_ms"] - 5.0) < 1e-9  # runs total 1001, 5, 3.5 ms (rows on the last run)
    assert (f["runs"] == 3).all()
