"""The whole nightly in one command: on a GPU first the warmup (every Triton kernel variant the
parity steps launch, compiled once, in parallel: ``harness.gpu.warmup``), then parity per op,
timelines per family, GPU-only checks, the gate per layout, then benchmarks alone on the device,
then the report.

    python -m harness nightly --out runs/nightly [--profile nightly] [--budget-s 600]

Steps are subprocesses of the ordinary CLI (``python -m harness run|timelines|gpu|gate|bench|
report``), so each one's CSV, JUnit and FAIL/repro lines are exactly what a user gets from that
command. The correctness steps run concurrently (one GPU is shared; the CPU cores drive the
launches), each under a time limit derived from ``--budget-s``: a step that runs out is stopped
with SIGTERM, keeps the rows it has and counts as failed. The benchmarks run afterwards, alone,
so that their timings are not taken beside other work. The report merges every CSV the steps
wrote (parity per op and timelines as Parquet, gate, perf) into ``OUT/report``.

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
import sys
import time
from pathlib import Path

from harness.nightly import mps
from harness.nightly import steps as nightly_steps
from harness.nightly.plan import OPS, plan


def main(argv: list[str] | None = None) -> int:
    from cases import e2e_gate, profiles
    from cases import timelines as tl
    from harness import usage

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
    ap.add_argument("--layout", action="append", choices=e2e_gate.LAYOUTS, help="gate layouts (default: all three)")
    ap.add_argument("--family", action="append", choices=sorted(tl.FAMILIES), help="timeline families (default: all)")
    ap.add_argument("--compiled-shards", type=usage.positive_int, default=1,
                    help="run the compiled step on one rotating slice of n of its catalog per night (default 1: all)")
    ap.add_argument("--case-timeout-s", type=usage.finite_float(0, strict=True), default=None,
                    help="per-case limit of the parity and timeline steps (default: 120 s on a GPU, 900 s on the CPU)")
    ap.add_argument("--cuda-sync", default="blocking", choices=("blocking", "spin"),
                    help="how the correctness steps' processes wait for an NVIDIA GPU (VP_CUDA_SYNC; default "
                         "blocking: a waiting process sleeps and leaves its core to the others)")
    ap.add_argument("--compare-on", default="device", choices=("device", "cpu", "auto"),
                    help="where the correctness steps' checks compute (VP_COMPARE_ON; auto: tensors of at most "
                         "64K elements on the CPU)")
    ap.add_argument("--mps", default="auto", choices=mps.MODES,
                    help="run the correctness steps as clients of a private CUDA MPS daemon (harness.nightly.mps; on: "
                         "required, auto (the default): when nvidia-cuda-mps-control is on PATH and the device "
                         "is an NVIDIA GPU, off: never)")
    ap.add_argument("--no-warmup", action="store_true", help="no compile-ahead step (harness.gpu.warmup) first")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--baseline", type=usage.input_file, default=None,
                    help="a previous nightly's merged parity rows (its report/merged.parquet, or a CSV) for "
                         "the report's diff")
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
    nightly_steps.run_steps([s for s in steps if s.phase < 0], out, progress=say, t0=t0)
    with mps.daemon(args.mps, out / "mps", device=device, log=say) as mps_env:
        correctness = [s for s in steps if s.phase == 0]
        for s in correctness:
            s.env.update(mps_env)
        nightly_steps.run_steps(correctness, out, progress=say, t0=t0)
    nightly_steps.run_steps([s for s in steps if s.phase > 0], out, progress=say, t0=t0)
    first = [s for s in steps if s.phase < 0]
    report = nightly_steps.report_step(out, args.baseline)
    nightly_steps.run_steps([report], out, progress=lambda m: print(m, flush=True))
    steps.append(report)
    print("\n" + nightly_steps.summary(steps))
    for s in steps:
        for line in s.fails:
            print(line)
    bad = [s for s in steps if nightly_steps.fatal(s)]
    warm = sum(s.compile_s or 0.0 for s in first)
    inside = sum(s.compile_s or 0.0 for s in steps if s.phase >= 0)
    print(f"nightly: {len(steps) - len(bad)}/{len(steps)} steps ok in {time.time() - t0:.0f}s "
          f"(warmup {sum(s.wall_s for s in first):.0f}s, of which compiling {warm:.0f}s; Triton compiles inside the "
          f"steps {inside:.0f}s summed over their processes); report {out / 'report' / 'report.html'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
