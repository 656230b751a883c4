"""The whole nightly in one command: on a GPU first the warmup (every Triton kernel variant the
parity steps launch, compiled once, in parallel: ``harness.warmup``), then parity per op,
timelines per family, GPU-only checks, the gate per layout, then benchmarks alone on the device,
then the report.

    python -m harness nightly --out runs/nightly [--profile nightly] [--budget-s 600]

Steps are subprocesses of the ordinary CLI (``python -m harness run|timelines|gpu|gate|bench|
report``), so each one's CSV, JUnit and FAIL/repro lines are exactly what a user gets from that
command. The correctness steps run concurrently (one GPU is shared; the CPU cores drive the
launches), each under a time limit derived from ``--budget-s``: a step that runs out is stopped
with SIGTERM, keeps the rows it has and counts as failed. The benchmarks run afterwards, alone,
so that their timings are not taken beside other work. The report merges every CSV the steps
wrote (parity shards, timelines, gate, perf) into ``OUT/report``.

Every parity and timeline case runs under a per-case limit (``--case-timeout-s``): a stalled case
is a failing ``timeout`` row with its worker's stack, never a slow step.

Ends with a table of steps (status, exit code, wall time, Triton compile time apart from it,
budget) and every FAIL line with its repro from the steps' logs. Exit 1 when any step failed (a
warmup that ran out of time excepted: the steps compile what it left, and their compile_s shows
it). Without a GPU the GPU-only checks and benchmarks say so and measure nothing; use ``--profile
dev`` there for a small run.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import mps
from harness.ops import builtin_specs

# the ops with a parity step (OpSpec.nightly), in harness.ops.BUILTIN order
OPS = tuple(name for name, spec in builtin_specs().items() if spec.nightly)
# parity workers of an op relative to the others (OpSpec.parity_weight: implementations per case)
PARITY_WEIGHT = {name: spec.parity_weight for name, spec in builtin_specs().items() if spec.parity_weight != 1}
# Phase 0 oversubscribes the host (H200 nightly of 2026-11-29: 26 processes on 16 cores). The gate's runs
# are the longest that cannot be split (600 problems each; the plain greedy run 183-205 s there), and two
# layouts ran out of their 384 s while parity and timelines finished in 230-358 s: every step but the gate
# and the short GPU checks runs at this lower CPU priority, so the gate keeps its cores. Not the compiled
# step either: each catalog case recompiles (35-54 s a case when it ran niced, with one inductor compile
# thread: 41 of 42 cases of a third of the catalog in its 414 s), so its cases are the other long pole
BACKGROUND_NICE = 5
# The warmup collects on the catalog plus this many generated cases per op, not the steps' whole plan.
# Its collect pass builds every case's inputs and calls every implementation (about 0.1 s a case and
# implementation on the H200 host); on the whole nightly plan that alone outlasted the warmup's 10 % of
# a 530 s budget on a fresh H200 (2026-12-01), nothing got compiled, and verify_attention's parity
# workers compiled 784 kernels themselves (608 s summed). Variants are products of a few discrete
# parameters (dtypes, head dims, block sizes, flags): a sample of the draws meets nearly all of them,
# and a variant it misses is compiled by the first step that launches it (its compile_s shows that).
WARMUP_GENERATED = 300
# Shares of --budget-s. The warmup's plan took 30 s to compile and 56 s to collect on a fresh H200
# (2026-12-01; 250 variants), the collect mostly one chunk of big verify_attention cases: with them
# spread it fits in 15 %; a quarter is its ceiling, and what it leaves goes to correctness, which ends
# at 80 % of the budget from the start. The benchmarks get the rest (bench --quick: 76 rows in 106 s).
WARMUP_SHARE = 0.25
CORRECTNESS_ENDS = 0.8


@dataclass
class Step:
    name: str
    argv: list[str]
    budget_s: float
    phase: int = 0  # -1: the warmup, alone first; 0: concurrent correctness steps; 1: alone afterwards
    # (benchmarks); 2: report
    nice: int = 0  # CPU priority increment of the step's processes (0: normal)
    log: Path | None = None
    proc: subprocess.Popen | None = None
    t0: float = 0.0
    wall_s: float = 0.0
    rc: int | None = None
    timed_out: bool = False
    fails: list[str] = field(default_factory=list)
    compile_s: float | None = None  # Triton compile seconds its log reports (warmup: wall; others: summed)
    env: dict = field(default_factory=dict)  # added to the step's environment
    until_s: float | None = None  # must end by this many seconds after the nightly's start (its budget_s
    # shrinks to what is left of that when it starts: a short warmup leaves its time to the steps after it)


def worker_counts(cores: int, gate_runs: int) -> dict[str, int]:
    """Worker processes per step on a machine with ``cores`` CPU cores. On one GPU the steps are
    host-bound (launches, syncs, Python), so the processes of all concurrent steps together are
    sized to about twice the cores (a process waiting on the GPU leaves its core to another):
    parity per op and timelines per family get ``cores // 8`` each, the gate per layout up to its
    runs (``gate_runs``) capped at ``cores // 5``. Measured on the H200 host (16 cores): 31
    processes in all (3 per parity op, 1 per timeline family, 5 per gate layout, torch.compile
    in every parity worker) left each about half a core and no step finished in 380 s."""
    per = max(1, cores // 8)
    return {"parity": per, "timelines": per, "gate": max(1, min(gate_runs, cores // 5))}


def parity_jobs(per: int, weight: float, cores: int) -> int:
    """Parity workers of an op of ``weight`` (``OpSpec.parity_weight``) when an op of weight 1 gets
    ``per``: a heavier op gets ``per · weight`` up to a quarter of the cores (never fewer than
    ``per``); a lighter one (weight < 1) ``per · weight`` rounded down, at least 1."""
    if weight < 1:
        return max(1, int(per * weight))
    return max(per, min(int(per * weight), cores // 4))


def plan(out: Path, *, profile: str, device: str, budget_s: float, jobs: int | None, layouts: list[str] | None,
         families: list[str] | None, bench: bool, gate: bool, ops: list[str] | None = None,
         generated: int | None = None, timelines: int | None = None, cores: int | None = None,
         gate_jobs: int | None = None, compiled_shards: int = 1, day: int | None = None, warmup: bool = True,
         case_timeout_s: float | None = None, cuda_sync: str = "blocking",
         compare_on: str = "device") -> list[Step]:
    """The steps, with their time limits: on a GPU first the warmup alone (``harness.warmup``: the
    Triton variants the parity steps launch on their catalogs and the first ``WARMUP_GENERATED``
    generated cases per op, compiled once in parallel into Triton's cache) in at most
    ``WARMUP_SHARE`` of the budget, then correctness until ``CORRECTNESS_ENDS`` of it from the start
    (what the warmup leaves unused goes to correctness), benchmarks in the rest. Parity and timeline steps run every case under ``case_timeout_s`` (default: the device's,
    ``harness.suite.default_case_timeout``): a stalled case is a ``timeout`` row, never a slow step.
    ``generated`` overrides the generated parity cases per op (default: the profile's),
    ``timelines`` the generated timelines per family (default: the profile's; 500 per family in
    the nightly profile). ``jobs`` and ``gate_jobs`` override the parity workers per op and the
    gate's per layout (default: ``worker_counts``). ``compiled_shards`` > 1 runs one rotating slice
    of the compiled step's catalog per night (``compiled_shard``; ``day`` defaults to today).

    The parity steps run the reference, fused and external implementations on every case; the
    ``compiled`` ones (torch.compile of the reference chain) run the catalog only, in a step of
    their own: each new shape, dtype or layout of a generated case costs them a recompile
    (about 2-3 s each on the H200 host), which took most of the parity steps' time when they ran
    every case."""
    from cases import e2e_gate
    from harness import compare, devices

    gp = "full" if device != "cpu" else "cpu-lite"
    gprof = e2e_gate.PROFILES[gp]
    cores = cores or os.cpu_count() or 1
    workers = worker_counts(cores, 2 + len(gprof.paths) + len(gprof.path_mutants))
    if jobs is not None:
        workers["parity"] = workers["timelines"] = jobs
    if gate_jobs is not None:
        workers["gate"] = gate_jobs
    py = [sys.executable, "-m", "harness"]
    par = CORRECTNESS_ENDS * budget_s
    gen = [] if generated is None else ["--generated", str(generated)]
    kinds = ["--kind", "reference", "--kind", "fused", "--kind", "external"]
    from harness import suite

    limit = case_timeout_s if case_timeout_s is not None else (
        suite.CASE_TIMEOUT_INTERPRETED_S if device == "cpu" else suite.CASE_TIMEOUT_S)
    watchdog = ["--case-timeout-s", f"{limit:g}"]
    steps = []
    if warmup and device != "cpu":  # the interpreter compiles nothing
        from cases import profiles

        warm_gen = min(generated if generated is not None else profiles.PROFILES[profile].generated,
                       WARMUP_GENERATED)
        steps.append(Step("warmup", py + ["warmup", "--device", device, "--profile", profile, "--jobs",
                                          str(min(cores, 16)), "--kind", "fused", "--kind", "external"]
                          + [a for op in ops or OPS for a in ("--op", op)] + ["--generated", str(warm_gen)],
                          WARMUP_SHARE * budget_s, phase=-1))
    steps += [Step(f"parity:{op}", py + ["run", "--op", op, "--device", device, "--profile", profile, "--quiet",
                                       "--jobs", str(parity_jobs(workers["parity"], PARITY_WEIGHT.get(op, 1), cores)),
                                       "--csv", str(out / f"parity-{op}.csv.gz"),
                                       "--junit", str(out / f"parity-{op}.xml"), "--stage-times"]
                   + kinds + gen + watchdog, par, nice=BACKGROUND_NICE)
              for op in ops or OPS]
    if device != "cpu":  # torch.compile's Triton backend needs a GPU; on the CPU `compiled` refuses anyway
        shard = compiled_shard(compiled_shards, day)
        steps.append(Step("parity:compiled",
                          py + ["run", "--device", device, "--profile", profile, "--quiet",
                                # one process per op, at most a fifth of the cores (as a gate layout):
                                # inductor's compiles, not the processes, bound this step
                                "--jobs", str(min(len(ops or OPS), max(1, cores // 5))),
                                "--kind", "compiled", "--generated", "0", "--csv",
                                str(out / "parity-compiled.csv.gz"), "--junit",
                                str(out / "parity-compiled.xml"), "--stage-times",
                                # inductor compiles each catalog case (35-54 s a case, measured): a longer limit
                                "--case-timeout-s", f"{max(limit, 300):g}"]
                          + [a for op in ops or OPS for a in ("--op", op)]
                          + ([] if shard is None else ["--shard", shard]), par))  # normal priority: see below
    from cases import timelines as tl

    tl_gen = (["--generated", str(timelines)] if timelines is not None
              else ["--generated", "500"] if profile == "nightly" else [])
    chosen = families or sorted(tl.FAMILIES)
    for fam in [f for f in chosen if tl.FAMILIES[f].nightly_with not in chosen]:
        twins = [a for f in chosen if tl.FAMILIES[f].nightly_with == fam for a in ("--family", f)]  # in its step
        steps.append(Step(f"timelines:{fam}", py + ["timelines", "--device", device, "--profile", profile,
                                                    "--family", fam, *twins, "--quiet", "--jobs",
                                                    str(parity_jobs(workers["timelines"], tl.FAMILIES[fam].nightly_weight,
                                                                    cores)),
                                                    "--csv", str(out / f"timelines-{fam}.csv.gz")] + tl_gen + watchdog,
                          par,
                          nice=BACKGROUND_NICE))
    steps.append(Step("gpu", py + ["gpu", "--out", str(out / "gpu")], par))
    if gate:
        from harness.e2e import model as M

        for lay in layouts or M.LAYOUTS:
            steps.append(Step(f"gate:{lay}", py + ["gate", "--device", device, "--profile", gp, "--layout", lay,
                                                   "--jobs", str(workers["gate"]), "--csv", str(out / f"gate-{lay}.csv")],
                              par))
    for s in steps:
        if s.phase == 0:
            s.until_s = par
            s.env = {compare.COMPARE_ON_ENV: compare_on}  # where the checks compute (harness.compare.home)
            if device == "cuda":  # the steps share one GPU: a process waiting for it sleeps (harness.devices)
                s.env[devices.SYNC_ENV] = cuda_sync
    if bench:
        # the small shape set: the full one (nox -s bench) took longer than the whole 20 % on the H200
        # (qk_norm_rope 62 s, mla 31 s, verify_attention 2 of 24 shapes when its 109 s ran out)
        steps.append(Step("bench", py + ["bench", "--out", str(out / "bench"), "--quick"],
                          (1 - CORRECTNESS_ENDS) * budget_s, phase=1))
    return steps


def compiled_shard(shards: int, day: int | None = None) -> str | None:
    """The compiled step's slice tonight: ``i/n`` with i = day number (days since 1970-01-01,
    UTC) mod n + 1, so n consecutive nights cover the whole catalog; None for one shard."""
    if shards < 1:
        raise ValueError(f"--compiled-shards: expected >= 1, got {shards}")
    if shards == 1:
        return None
    day = int(time.time() // 86400) if day is None else day
    return f"{day % shards + 1}/{shards}"


def _header_only(path: Path) -> bool:
    """A CSV with a header and no rows: what a step stopped before its first row writes. ``report``
    refuses such a file; the step's own status already fails it, so the report leaves it out rather
    than be lost. Anything else (rows, or a file that does not parse) goes to ``report`` to judge."""
    import pandas as pd

    try:
        return pd.read_csv(path, nrows=1).empty
    except Exception:  # noqa: BLE001 - unreadable: report names what is wrong with it
        return False


def _report_step(out: Path, baseline: str | None) -> Step:
    args = [sys.executable, "-m", "harness", "report", "--out", str(out / "report")]
    for flag, pattern in (("--csv", "parity-*.csv.gz"), ("--gate", "gate-*.csv"), ("--timelines", "timelines-*.csv.gz")):
        for p in sorted(out.glob(pattern)):
            if _header_only(p):
                print(f"nightly: report leaves out {p.name}: no rows (its step's status says why)", flush=True)
            else:
                args += [flag, str(p)]
    perf = out / "bench" / "perf.csv"
    if perf.exists():
        args += ["--perf", str(perf)]
    if baseline:
        args += ["--baseline", baseline]
    return Step("report", args, 120, phase=2)


def _start(step: Step, out: Path) -> None:
    step.log = out / "logs" / f"{step.name.replace(':', '-')}.log"
    step.log.parent.mkdir(parents=True, exist_ok=True)
    # the steps run side by side: one intra-op thread per process unless the caller chose (torch's default,
    # one per core in each of ~26 processes, made every CPU-side comparison crawl; docs/nightly.md)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **step.env)
    env.setdefault("OMP_NUM_THREADS", "1")
    step.t0 = time.time()
    nice = step.nice

    def lower_priority():  # in the child, before exec: inherited by every worker it spawns
        os.nice(nice)

    with open(step.log, "w") as fh:
        step.proc = subprocess.Popen(step.argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=lower_priority if nice else None)


def _poll(step: Step) -> bool:
    """True once the step has ended (stopping it with SIGTERM, then SIGKILL, past its limit)."""
    if step.rc is not None:
        return True
    rc = step.proc.poll()
    elapsed = time.time() - step.t0
    if rc is None and elapsed > step.budget_s and not step.timed_out:
        step.timed_out = True
        step.proc.terminate()  # the CLI keeps its rows on SIGTERM
    if rc is None and step.timed_out and elapsed > step.budget_s + 30:
        step.proc.kill()
    if rc is None:
        return False
    step.rc, step.wall_s = rc, time.time() - step.t0
    lines = step.log.read_text(errors="replace").splitlines()
    step.compile_s = compile_seconds(lines)
    for i, line in enumerate(lines):
        if line.startswith(("FAIL", "GATE FAIL", "GATE MISSED", "SURVIVED", "CLEAN FAILS")):
            nxt = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].strip().startswith("repro:") else ""
            step.fails.append(f"[{step.name}] {line.strip()}" + (f"\n    {nxt}" if nxt else ""))
    return True


def run_steps(steps: list[Step], out: Path, *, poll_s: float = 2.0, progress=print, t0: float | None = None) -> None:
    """Run the steps phase by phase (each phase's steps concurrently). ``t0``: the nightly's start
    (default: now), from which a step's ``until_s`` counts."""
    t0 = time.time() if t0 is None else t0
    for phase in sorted({s.phase for s in steps}):
        group = [s for s in steps if s.phase == phase]
        for s in group:
            if s.until_s is not None:
                s.budget_s = max(0.0, min(s.budget_s, t0 + s.until_s - time.time()))
            _start(s, out)
        progress(f"nightly: phase {phase}: started {', '.join(s.name for s in group)}")
        last = time.time()
        while not all([_poll(s) for s in group]):  # a list: every step polled (its time limit) each round
            time.sleep(poll_s)
            if time.time() - last > 30:
                last = time.time()
                running = [f"{s.name} {time.time() - s.t0:.0f}s" for s in group if s.rc is None]
                progress(f"nightly: running {'; '.join(running)}")
        for s in group:
            state = "TIMEOUT" if s.timed_out else ("ok" if s.rc == 0 else "FAIL")
            progress(f"nightly: {s.name} {state} (rc {s.rc}, {s.wall_s:.0f}s) -> {s.log}")


def compile_seconds(lines: list[str]) -> float | None:
    """Triton compile seconds a step's log reports: the warmup's compile wall (``harness.warmup``'s
    summary line), a run's compiles summed over its processes (``harness.stages.compile_line``)."""
    import re

    from harness import stages, warmup

    total = None
    for line in lines:
        m = (re.match(rf"{re.escape(warmup.LINE)} \d+/\d+ kernel variants in ([0-9.]+) s wall", line)
             or re.match(rf"{re.escape(stages.COMPILE_LINE)}: \d+ kernels, ([0-9.]+) s", line))
        if m:
            total = (total or 0.0) + float(m.group(1))
    return total


def summary(steps: list[Step]) -> str:
    """The step table: status, exit code, wall time, Triton compile time apart from it (``compile_s``:
    the warmup's compile wall; a step's compiles summed over its processes; blank when not reported),
    budget, failure lines, log."""
    import pandas as pd

    rows = [dict(step=s.name, status="TIMEOUT" if s.timed_out else ("ok" if s.rc == 0 else "FAIL"), rc=s.rc,
                 wall_s=round(s.wall_s, 1), compile_s="" if s.compile_s is None else round(s.compile_s, 1),
                 budget_s=round(s.budget_s), failures=len(s.fails), log=str(s.log))
            for s in steps]
    return pd.DataFrame(rows).to_string(index=False)


def fatal(s: Step) -> bool:
    """A step whose result fails the nightly: any that did not exit 0, except a warmup that ran out
    of its time (the steps after it compile what it left, and their compile_s says so)."""
    return s.rc != 0 and not (s.name == "warmup" and s.timed_out)


def main(argv: list[str] | None = None) -> int:
    from cases import profiles
    from cases import timelines as tl
    from harness import usage
    from harness.e2e import model as M

    ap = usage.ArgumentParser(prog="python -m harness nightly", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=usage.output_dir, default="runs/nightly",
                    help="directory for every CSV, log and the report")
    ap.add_argument("--profile", default="nightly", choices=sorted(profiles.PROFILES), help="parity/timelines profile")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "rocm"))
    ap.add_argument("--budget-s", type=usage.finite_float(0.0, strict=True), default=600.0,
                    help="wall-time budget for the whole run")
    ap.add_argument("--jobs", type=usage.positive_int, default=None,
                    help="worker processes per parity and per timelines step (default: by cores)")
    ap.add_argument("--gate-jobs", type=usage.positive_int, default=None,
                    help="worker processes per gate layout (default: by cores)")
    ap.add_argument("--op", action="append", choices=OPS, help="parity ops (default: all)")
    ap.add_argument("--generated", type=usage.count, default=None,
                    help="generated parity cases per op (default: the profile's)")
    ap.add_argument("--timelines", type=usage.count, default=None,
                    help="generated timelines per family (default: the profile's; 500 in the nightly profile)")
    ap.add_argument("--layout", action="append", choices=M.LAYOUTS, help="gate layouts (default: all three)")
    ap.add_argument("--family", action="append", choices=sorted(tl.FAMILIES), help="timeline families (default: all)")
    ap.add_argument("--compiled-shards", type=usage.positive_int, default=1,
                    help="run the compiled step on one rotating slice of n of its catalog per night (default 1: all)")
    ap.add_argument("--case-timeout-s", type=float, default=None,
                    help="per-case limit of the parity and timeline steps (default: 120 s on a GPU, 900 s on the CPU)")
    ap.add_argument("--cuda-sync", default="blocking", choices=("blocking", "spin"),
                    help="how the correctness steps' processes wait for an NVIDIA GPU (VP_CUDA_SYNC; default "
                         "blocking: a waiting process sleeps and leaves its core to the others)")
    ap.add_argument("--compare-on", default="device", choices=("device", "cpu", "auto"),
                    help="where the correctness steps' checks compute (VP_COMPARE_ON; auto: tensors of at most "
                         "64K elements on the CPU)")
    ap.add_argument("--mps", default="auto", choices=mps.MODES,
                    help="run the correctness steps as clients of a private CUDA MPS daemon (harness.mps; on: "
                         "required, auto (the default): when nvidia-cuda-mps-control is on PATH and the device "
                         "is an NVIDIA GPU, off: never)")
    ap.add_argument("--no-warmup", action="store_true", help="no compile-ahead step (harness.warmup) first")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--baseline", type=usage.input_file, default=None,
                    help="a previous nightly's merged parity CSV for the report's diff")
    args = ap.parse_args(argv)
    from harness import devices

    device = args.device if args.device != "auto" else ("cuda" if devices.gpu_present() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = plan(out, profile=args.profile, device=device, budget_s=args.budget_s, jobs=args.jobs,
                 layouts=args.layout, families=args.family, bench=not args.no_bench, gate=not args.no_gate,
                 ops=args.op, generated=args.generated, timelines=args.timelines, gate_jobs=args.gate_jobs,
                 compiled_shards=args.compiled_shards, warmup=not args.no_warmup, case_timeout_s=args.case_timeout_s,
                 cuda_sync=args.cuda_sync, compare_on=args.compare_on)
    t0 = time.time()
    print(f"verify-parity nightly: device={device} profile={args.profile} budget {args.budget_s:.0f}s, "
          f"{len(steps)} steps -> {out}", flush=True)
    say = lambda m: print(m, flush=True)  # noqa: E731
    run_steps([s for s in steps if s.phase < 0], out, progress=say, t0=t0)
    with mps.daemon(args.mps, out / "mps", device=device, log=say) as mps_env:
        correctness = [s for s in steps if s.phase == 0]
        for s in correctness:
            s.env.update(mps_env)
        run_steps(correctness, out, progress=say, t0=t0)
    run_steps([s for s in steps if s.phase > 0], out, progress=say, t0=t0)
    first = [s for s in steps if s.phase < 0]
    report = _report_step(out, args.baseline)
    run_steps([report], out, progress=lambda m: print(m, flush=True))
    steps.append(report)
    print("\n" + summary(steps))
    for s in steps:
        for line in s.fails:
            print(line)
    bad = [s for s in steps if fatal(s)]
    warm = sum(s.compile_s or 0.0 for s in first)
    inside = sum(s.compile_s or 0.0 for s in steps if s.phase >= 0)
    print(f"nightly: {len(steps) - len(bad)}/{len(steps)} steps ok in {time.time() - t0:.0f}s "
          f"(warmup {sum(s.wall_s for s in first):.0f}s, of which compiling {warm:.0f}s; Triton compiles inside the "
          f"steps {inside:.0f}s summed over their processes); report {out / 'report' / 'report.html'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
