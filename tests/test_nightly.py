"""python -m harness nightly: steps run concurrently, time limits stop a step (rows kept by the
step's own SIGTERM handling), FAIL lines and their repro are collected, the exit code follows."""
from __future__ import annotations

import os
import sys

import pytest

from harness.nightly import plan as nightly_plan
from harness.nightly import steps as nightly_steps


def _step(name, code, budget_s=60.0, phase=0):
    return nightly_plan.Step(name, [sys.executable, "-c", code], budget_s, phase=phase)


def test_steps_run_concurrently_limits_stop_a_step_and_failures_are_collected(tmp_path):
    ok = _step("ok", "import time; time.sleep(0.5); print('fine')")
    bad = _step("bad", "print('FAIL op/impl case [check] detail'); print('  repro: python -m harness repro X'); "
                       "raise SystemExit(1)")
    slow = _step("slow", "import time; time.sleep(60)", budget_s=1.0)
    later = _step("later", "print('after')", phase=1)
    nightly_steps.run_steps([ok, bad, slow, later], tmp_path, poll_s=0.1, progress=lambda m: None)
    assert ok.rc == 0 and not ok.fails and 0.4 < ok.wall_s < 10  # its own wall time, not the slowest step's
    assert bad.rc == 1 and bad.fails == ["[bad] FAIL op/impl case [check] detail\n    repro: python -m harness repro X"]
    assert slow.timed_out and slow.rc != 0 and slow.wall_s < 30
    assert later.rc == 0 and later.t0 >= max(ok.t0, bad.t0, slow.t0) + 1.0  # phase 1 starts after phase 0 ended
    table = nightly_steps.summary([ok, bad, slow, later])
    assert "TIMEOUT" in table and "FAIL" in table


def test_plan_covers_every_op_family_layout_and_puts_bench_alone(tmp_path):
    steps = nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=600, jobs=2, layouts=None,
                         families=None, bench=True, gate=True)
    names = [s.name for s in steps]
    assert {"parity:qk_norm_rope", "parity:mla_fp8_prepare", "parity:verify_attention", "gpu"} <= set(names)
    from cases import timelines as tl

    # a family with a nightly twin (the q-weighted ones) runs in its twin's step: every family is in one step
    assert {n for n in names if n.startswith("timelines:")} == {f"timelines:{f}" for f, fam in tl.FAMILIES.items()
                                                               if not fam.nightly_with}
    fams = [s.argv[i + 1] for s in steps if s.name.startswith("timelines:") for i, a in enumerate(s.argv)
            if a == "--family"]
    assert sorted(fams) == sorted(tl.FAMILIES)
    assert {n for n in names if n.startswith("gate:")} == {"gate:dsv4-mqa-ring", "gate:k3-mla-fp8", "gate:qwen35-gqa"}
    bench = next(s for s in steps if s.name == "bench")
    warm = next(s for s in steps if s.name == "warmup")
    assert bench.phase == 1 and warm.phase == -1 and all(s.phase == 0 for s in steps if s not in (bench, warm))
    assert "--quick" in bench.argv  # the full set does not fit the nightly's 20 % (measured on the H200)
    assert all("--generated" in s.argv and "500" in s.argv for s in steps if s.name.startswith("timelines:"))
    # correctness ends by a fixed point of the budget, whatever the warmup took; the benchmarks get the rest
    assert {s.until_s for s in steps if s.phase == 0} == {max(s.budget_s for s in steps if s.phase == 0)}
    assert warm.budget_s < steps[1].until_s and steps[1].until_s + bench.budget_s <= 600


def test_a_short_warmup_leaves_its_time_to_the_correctness_steps(tmp_path):
    """A phase-0 step's limit is what is left of its ``until_s`` when it starts. Planted: keeping
    its planned budget_s (the warmup's unused time lost, or a long warmup's overrun added) fails."""
    warm = _step("warmup", "import time; time.sleep(1.0)", budget_s=5.0, phase=-1)
    par = _step("parity:x", "print('ok')", budget_s=4.0)
    par.until_s = 4.0
    t0 = __import__("time").time()
    nightly_steps.run_steps([warm, par], tmp_path, poll_s=0.05, progress=lambda m: None, t0=t0)
    assert warm.rc == 0 and par.rc == 0
    # 4 s from the start, minus what the warmup took (its 1 s sleep and its interpreter's start, slower on a
    # loaded runner: 2.03 s beside 15 other test workers on the H100, 2026-12-07)
    assert par.budget_s == pytest.approx(4.0 - (par.t0 - t0), abs=0.25) and par.budget_s <= 3.0, par.budget_s


def _kinds(step):
    return [step.argv[i + 1] for i, a in enumerate(step.argv) if a == "--kind"]


def test_plan_runs_compiled_on_the_catalog_only_and_sizes_workers_by_cores(tmp_path):
    """torch.compile recompiles per generated shape (2-3 s each on the H200 host): the parity steps
    leave it out and one step runs it on the catalogs; worker counts follow the cores."""
    steps = {s.name: s for s in nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=600, jobs=None,
                                              layouts=None, families=None, bench=True, gate=True, cores=16)}
    groups = nightly_plan.parity_groups(list(nightly_plan.OPS))
    assert groups["verify_accept"] == ["verify_accept", "verify_tree_accept", "spec_sampling"]  # one step
    assert sorted(o for g in groups.values() for o in g) == sorted(nightly_plan.OPS)  # every op checked once
    for op in groups:
        argv = steps[f"parity:{op}"].argv
        assert _kinds(steps[f"parity:{op}"]) == ["reference", "fused", "external"]
        assert [argv[i + 1] for i, a in enumerate(argv) if a == "--op"] == groups[op]
        # five implementations per case in verify_attention; the acceptance ops' integer outputs are cheap per case,
        # but three of them share one step: half a worker's share each (planted: the heaviest op's weight, 1 job)
        want = {"verify_attention": "4", "verify_accept": "3"}.get(op, "2")
        assert argv[argv.index("--jobs") + 1] == want
    assert not any(f"parity:{op}" in steps for op in ("verify_tree_accept", "spec_sampling"))
    comp = steps["parity:compiled"].argv
    assert _kinds(steps["parity:compiled"]) == ["compiled"] and comp[comp.index("--generated") + 1] == "0"
    assert [comp[i + 1] for i, a in enumerate(comp) if a == "--op"] == list(nightly_plan.OPS)
    jobs = lambda s: int(s.argv[s.argv.index("--jobs") + 1])  # noqa: E731
    from cases import timelines as tl

    assert all(jobs(s) == (1 if tl.FAMILIES[n.split(":", 1)[1]].nightly_weight < 1 else 2)
               for n, s in steps.items() if n.startswith("timelines:"))
    assert jobs(steps["parity:compiled"]) == 3  # a fifth of the cores
    assert all(jobs(s) == 2 for n, s in steps.items() if n.startswith("gate:"))
    procs = sum(jobs(s) for s in steps.values() if "--jobs" in s.argv and s.phase == 0) + 2  # + gpu, compiled
    assert jobs(steps["warmup"]) == 16  # alone, before the concurrent steps: every core
    assert procs <= 2 * 16, procs
    small = nightly_plan.plan(tmp_path, profile="dev", device="cpu", budget_s=600, jobs=None, layouts=None,
                         families=None, bench=False, gate=True, cores=2)
    assert "parity:compiled" not in {s.name for s in small}  # no torch.compile backend on the CPU
    assert all(jobs(s) == 1 for s in small if "--jobs" in s.argv)
    assert nightly_plan.worker_counts(2, 5) == {"parity": 1, "timelines": 1, "gate": 1}
    assert nightly_plan.worker_counts(64, 5)["gate"] == 5  # never more workers than the gate has runs


def test_report_step_takes_every_csv_the_steps_wrote(tmp_path):
    """The steps write parity and timeline rows as Parquet (a nightly's were 704 MB as CSV), the gate CSV."""
    for name in ("parity-qk_norm_rope.parquet", "parity-compiled.parquet", "timelines-k3-mla-fp8.parquet",
                 "timelines-qwen35-gqa.parquet", "gate-k3-mla-fp8.csv"):
        (tmp_path / name).write_text("")
    argv = nightly_steps.report_step(tmp_path, None).argv
    pairs = {(argv[i], argv[i + 1].rsplit("/", 1)[-1]) for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert {("--csv", "parity-qk_norm_rope.parquet"), ("--csv", "parity-compiled.parquet"),
            ("--timelines", "timelines-k3-mla-fp8.parquet"), ("--timelines", "timelines-qwen35-gqa.parquet"),
            ("--gate", "gate-k3-mla-fp8.csv")} <= pairs
    steps = nightly_plan.plan(tmp_path, profile="dev", device="cpu", budget_s=600, jobs=None, layouts=None,
                              families=None, bench=False, gate=False, cores=2)
    wrote = {s.argv[s.argv.index("--csv") + 1].rsplit("/", 1)[-1] for s in steps if "--csv" in s.argv}
    assert {"parity-qk_norm_rope.parquet", "timelines-k3-mla-fp8.parquet"} <= wrote, wrote


def test_report_step_leaves_out_a_header_only_csv(tmp_path):
    """A step stopped before its first row writes a results file without rows, which ``report`` refuses; the
    nightly report must still be built from the others. Planted: passing every file fails."""
    import pandas as pd

    from reports.rows import write_frame

    write_frame(pd.DataFrame({"op": ["qk_norm_rope"], "status": ["pass"]}), tmp_path / "parity-qk_norm_rope.parquet")
    write_frame(pd.DataFrame(columns=["op", "status"]), tmp_path / "parity-verify_attention.parquet")
    pd.DataFrame(columns=["step", "status"]).to_csv(tmp_path / "gate-qwen35-gqa.csv", index=False)
    argv = nightly_steps.report_step(tmp_path, None).argv
    names = [a.rsplit("/", 1)[-1] for a in argv]
    assert "parity-qk_norm_rope.parquet" in names and "parity-verify_attention.parquet" not in names
    assert "gate-qwen35-gqa.csv" not in names


def test_plan_keeps_parity_and_timeline_counts_apart(tmp_path):
    """--generated sizes the parity cases only; --timelines the timelines; --gate-jobs the gate."""
    steps = {s.name: s for s in nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=600, jobs=3,
                                              layouts=None, families=None, bench=False, gate=True, generated=1700,
                                              timelines=450, gate_jobs=4, cores=16)}
    arg = lambda s, flag: s.argv[s.argv.index(flag) + 1]  # noqa: E731
    assert all(arg(s, "--generated") == "1700" for n, s in steps.items() if n.startswith("parity:") and "compiled" not in n)
    assert arg(steps["parity:compiled"], "--jobs") == str(min(len(nightly_plan.OPS), 16 // 5))  # a process per op, capped
    from cases import timelines as tl

    assert all(arg(s, "--generated") == "450"
               and arg(s, "--jobs") == ("1" if tl.FAMILIES[n.split(":", 1)[1]].nightly_weight < 1 else "3")
               for n, s in steps.items() if n.startswith("timelines:"))
    assert all(arg(s, "--jobs") == "4" for n, s in steps.items() if n.startswith("gate:"))


def test_gate_and_gpu_checks_keep_priority_and_compiled_rotates_its_shard(tmp_path):
    """Everything but the gate, the compiled step and the GPU checks runs niced (the gate's runs and
    the compiled step's recompiles are the longest work that cannot be split); --compiled-shards n
    runs slice day % n + 1 of n, so n nights cover all. Planted: parity steps at nice 0 fail."""
    steps = nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=600, jobs=None, layouts=None,
                         families=None, bench=True, gate=True, cores=16, compiled_shards=3, day=7)
    by = {s.name: s for s in steps}
    for s in steps:
        crit = s.name.startswith("gate:") or s.name in ("gpu", "parity:compiled") or s.phase != 0
        assert s.nice == (0 if crit else nightly_plan.BACKGROUND_NICE), s.name
    comp = by["parity:compiled"]
    assert comp.argv[comp.argv.index("--shard") + 1] == "2/3"
    assert [nightly_plan.compiled_shard(3, d) for d in range(6)] == ["1/3", "2/3", "3/3", "1/3", "2/3", "3/3"]
    assert nightly_plan.compiled_shard(1, 5) is None
    whole = {s.name: s for s in nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=600, jobs=None,
                                              layouts=None, families=None, bench=False, gate=False, cores=16)}
    assert "--shard" not in whole["parity:compiled"].argv
    with pytest.raises(ValueError, match="compiled-shards"):
        nightly_plan.compiled_shard(0)


def test_a_step_runs_at_its_nice(tmp_path):
    """Planted: Popen without the preexec nice (both children at the parent's nice) fails."""
    code = "import os; print(os.nice(0))"
    base = os.nice(0)
    steps = [nightly_plan.Step("a", [sys.executable, "-c", code], 30, nice=3),
             nightly_plan.Step("b", [sys.executable, "-c", code], 30)]
    nightly_steps.run_steps(steps, tmp_path, poll_s=0.05, progress=lambda m: None)
    assert steps[0].log.read_text().split() == [str(min(19, base + 3))]
    assert steps[1].log.read_text().split() == [str(base)]


def _threads(_task) -> int:
    import torch

    return torch.get_num_threads()


@pytest.mark.long
def test_spawned_workers_and_nightly_steps_run_one_intra_op_thread(tmp_path, monkeypatch):
    """The nightly's parity steps crawled on the H200 host (4 workers x 16 torch threads on 16 cores:
    10.2 s a case, 0.62 s with one thread). Planted: dropping ``torch.set_num_threads(1)`` from
    ``suite.worker_init`` (a worker then has one thread per core: 2 on the CI machine), or the
    nightly step's ``OMP_NUM_THREADS`` default, fails."""
    import torch

    from harness import devices
    from harness.parity import suite

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if torch.get_num_threads() == 1:
        torch.set_num_threads(2)  # a one-core machine: the parent's count must still not leak
    # a CPU device for the workers (they select it themselves); no select("cpu") here: on a GPU runner it would set
    # TRITON_INTERPRET=1 in this process, and every later CLI subprocess of the worker would inherit it
    cpu = devices.Device("cpu", "cpu", "interpreter", "e4m3fn", "")
    assert sorted(suite.spawn_map(_threads, [0, 1], 2, cpu)) == [(0, 1), (1, 1)]  # (index, result)
    code = "import torch; print(torch.get_num_threads())"
    step = nightly_plan.Step("t", [sys.executable, "-c", code], 60)
    nightly_steps.run_steps([step], tmp_path, poll_s=0.05, progress=lambda m: None)
    assert step.log.read_text().split() == ["1"]


def test_warmup_compiles_the_parity_plan_first_and_every_case_has_a_limit(tmp_path):
    """On a GPU the warmup runs alone first, on the parity steps' plan (profile, ops, the kinds that
    launch Triton) with at most ``WARMUP_GENERATED`` generated cases per op; parity and timeline steps run under a per-case limit and print their
    stage times. On the CPU there is no warmup (the interpreter compiles nothing) and the limit is
    the interpreter's."""
    from harness.parity import suite

    steps = nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=520, jobs=2, layouts=None,
                         families=None, bench=True, gate=True, generated=1700, cores=16)
    warm = steps[0]
    arg = lambda s, flag: [s.argv[i + 1] for i, a in enumerate(s.argv) if a == flag]  # noqa: E731
    assert warm.name == "warmup" and warm.phase == -1 and warm.argv[2:4] == ["harness", "warmup"]
    assert arg(warm, "--profile") == ["nightly"] and arg(warm, "--generated") == [str(nightly_plan.WARMUP_GENERATED)]
    small = nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=520, jobs=2, layouts=None,
                         families=None, bench=False, gate=False, generated=40, cores=16)[0]
    assert small.name == "warmup" and arg(small, "--generated") == ["40"]  # never more than the steps run
    dflt = nightly_plan.plan(tmp_path, profile="dev", device="cuda", budget_s=520, jobs=2, layouts=None,
                        families=None, bench=False, gate=False, cores=16)[0]
    assert arg(dflt, "--generated") == [str(min(30, nightly_plan.WARMUP_GENERATED))]  # the dev profile's 30
    assert arg(warm, "--op") == list(nightly_plan.OPS) and arg(warm, "--kind") == ["fused", "external"]
    for s in steps:
        if s.name.startswith(("parity:", "timelines:")):
            want = f"{max(suite.CASE_TIMEOUT_S, 300):g}" if s.name == "parity:compiled" else f"{suite.CASE_TIMEOUT_S:g}"
            assert arg(s, "--case-timeout-s") == [want], s.argv
        if s.name.startswith("parity:"):
            assert "--stage-times" in s.argv
    cpu = nightly_plan.plan(tmp_path, profile="dev", device="cpu", budget_s=600, jobs=None, layouts=None, families=None,
                       bench=False, gate=False, cores=2, case_timeout_s=None)
    assert "warmup" not in {s.name for s in cpu}
    assert all(arg(s, "--case-timeout-s") == [f"{suite.CASE_TIMEOUT_INTERPRETED_S:g}"]
               for s in cpu if s.name.startswith("parity:"))
    none = nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=520, jobs=2, layouts=None,
                        families=None, bench=False, gate=False, warmup=False, case_timeout_s=60)
    assert "warmup" not in {s.name for s in none}
    assert all(arg(s, "--case-timeout-s") == ["60"] for s in none if s.name.startswith("timelines:"))


def test_step_table_reports_compile_time_apart_and_a_warmup_out_of_time_is_not_fatal(tmp_path):
    from harness.parity import stages
    from harness.gpu import warmup

    warm = _step("warmup", f"print('{warmup.LINE} 12/12 kernel variants in 41.5 s wall (300.0 s summed over "
                           f"processes); collect 9.0 s; cache /x')", phase=-1)
    par = _step("parity:x", f"print('{stages.COMPILE_LINE}: 3 kernels, 2.5 s'); print('{stages.COMPILE_LINE}: "
                            f"1 kernels, 0.5 s')")
    plain = _step("gpu", "print('nothing')")
    late = _step("warmup", "import time; time.sleep(60)", budget_s=0.5, phase=-1)
    nightly_steps.run_steps([warm, par, plain], tmp_path, poll_s=0.1, progress=lambda m: None)
    nightly_steps.run_steps([late], tmp_path / "late", poll_s=0.1, progress=lambda m: None)  # its own log
    assert (warm.compile_s, par.compile_s, plain.compile_s) == (41.5, 3.0, None)
    table = nightly_steps.summary([warm, par, plain]).splitlines()
    assert "compile_s" in table[0] and "41.5" in table[1] and "3.0" in table[2]
    assert late.timed_out and not nightly_steps.fatal(late)  # the steps after it compile what it left
    assert nightly_steps.fatal(_finished("warmup", 1)) and nightly_steps.fatal(_finished("parity:x", 1))
    assert not nightly_steps.fatal(_finished("parity:x", 0))


def _finished(name, rc):
    s = nightly_plan.Step(name, [], 1.0)
    s.rc = rc
    return s


def test_correctness_steps_sleep_while_they_wait_for_the_gpu_and_the_benchmarks_do_not(tmp_path):
    """On CUDA every phase-0 step runs with ``VP_CUDA_SYNC=blocking`` (the steps share one GPU), the
    benchmarks with CUDA's default; the variable reaches the step's process. Planted: the env not
    passed to ``Popen`` fails the last assertion; blocking set on the bench fails the second."""
    steps = nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=600, jobs=2, layouts=None,
                         families=None, bench=True, gate=True)
    assert all(s.env == {"VP_CUDA_SYNC": "blocking", "VP_COMPARE_ON": "device"} for s in steps if s.phase == 0)
    assert all(not s.env for s in steps if s.phase != 0)
    spin = nightly_plan.plan(tmp_path, profile="nightly", device="cuda", budget_s=600, jobs=2, layouts=None,
                        families=None, bench=False, gate=False, cuda_sync="spin", compare_on="auto")
    assert {(s.env["VP_CUDA_SYNC"], s.env["VP_COMPARE_ON"]) for s in spin if s.phase == 0} == {("spin", "auto")}
    assert all("VP_CUDA_SYNC" not in s.env for s in nightly_plan.plan(tmp_path, profile="dev", device="cpu", budget_s=600,
                                                                 jobs=None, layouts=None, families=None, bench=False,
                                                                 gate=False))
    step = _step("parity:x", "import os; print('sync', os.environ.get('VP_CUDA_SYNC'))")
    step.env = {"VP_CUDA_SYNC": "blocking"}
    nightly_steps.run_steps([step], tmp_path, poll_s=0.05, progress=lambda m: None)
    assert "sync blocking" in step.log.read_text()


def test_a_light_op_without_its_partner_gets_a_step_of_its_own():
    """``OpSpec.nightly_group``: the chosen ops of a group share the step of the first of them."""
    assert nightly_plan.parity_groups(["spec_sampling"]) == {"spec_sampling": ["spec_sampling"]}
    assert nightly_plan.parity_groups(["verify_attention", "verify_tree_accept", "verify_accept"]) == {
        "verify_attention": ["verify_attention"], "verify_accept": ["verify_accept", "verify_tree_accept"]}
