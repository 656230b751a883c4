"""The nightly's runner: starting its steps as subprocesses (log, environment, CPU priority),
polling them against their time limits, phase by phase, and reading back what they did (exit code,
wall and Triton compile seconds, FAIL lines); the report step over the CSVs they wrote, the step
table and which results fail the nightly."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from harness.nightly.plan import Step


def _header_only(path: Path) -> bool:
    """A results file with columns and no rows: what a step stopped before its first row writes. ``report``
    refuses such a file; the step's own status already fails it, so the report leaves it out rather
    than be lost. Anything else (rows, or a file that does not parse) goes to ``report`` to judge."""
    import pandas as pd
    import pyarrow.parquet as pq

    from reports.frames import is_parquet_file

    try:
        return pq.ParquetFile(path).metadata.num_rows == 0 if is_parquet_file(path) else pd.read_csv(path, nrows=1).empty
    except Exception:  # noqa: BLE001 - unreadable: report names what is wrong with it
        return False


def report_step(out: Path, baseline: str | None) -> Step:
    args = [sys.executable, "-m", "harness", "report", "--out", str(out / "report")]
    for flag, pattern in (("--csv", "parity-*.parquet"), ("--gate", "gate-*.csv"), ("--timelines", "timelines-*.parquet")):
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
    """Triton compile seconds a step's log reports: the warmup's compile wall (``harness.gpu.warmup``'s
    summary line), a run's compiles summed over its processes (``harness.parity.stages.compile_line``)."""
    import re

    from harness.parity import stages
    from harness.gpu import warmup

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
