"""Where a parity run's time goes: wall time per stage of each (implementation, case) run.

Stages (``harness.parity.runners`` and ``harness.parity.suite`` time them):

  inputs      the case's inputs: seeded CPU draws, the copy to the device (once per case)
  reference   the reference chain on the inputs (once per case)
  oracle      the fp64 oracle (once per case)
  allowance   the reference chain with a precision class's roundings emulated (once per class and case)
  copy        fresh copies of the inputs (can_handle's too) and of the writable buffers' bytes, per run
  impl        the implementation's first call
  compare     the checks of the first call's outputs and writes (``finite``, ``numeric``, ...)
  rerun       the determinism / poisoned-allocator rerun (the call)
  compare:rerun      its checks
  poisoned    the poisoned-output run (the call)
  compare:poisoned   its checks
  rows        the CSV rows of the run (in the parent process)

The setup stages (inputs, reference, oracle) count toward the implementation whose run built
the setup. Each stage is ``time.perf_counter`` around the work; a GPU's queue is drained at the
boundaries only with ``VP_STAGE_TIMES=1`` (a sync per stage: the numbers then say where the
device time goes, at the price of the overlap a run without it has). Triton compiles that happen
inside a stage are counted too (``compile``: seconds and kernels, a part of the stage that
launched them), from Triton's JIT hooks.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

STAGES = ("inputs", "reference", "oracle", "allowance", "copy", "impl", "compare", "rerun", "compare:rerun",
          "poisoned", "compare:poisoned", "distribution", "rows")
COMPILE = "compile"  # seconds inside Triton compiles (a part of the stages above, not a stage of its own)
COMPILES = "compiles"  # how many kernels were compiled
SYNC_ENV = "VP_STAGE_TIMES"

_current: dict | None = None  # the collector of the run in progress in this process


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def collect():
    """A fresh {stage: seconds} for the code in the block (nested collectors stack)."""
    global _current
    outer, _current = _current, defaultdict(float)
    try:
        yield _current
    finally:
        _current = outer


@contextlib.contextmanager
def timed(stage: str):
    """Add the block's wall time to ``stage`` of the current collector (no collector: no-op)."""
    if _current is None:
        yield
        return
    sync = os.environ.get(SYNC_ENV) == "1"
    if sync:
        _sync()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if sync:
            _sync()
        if _current is not None:
            _current[stage] += time.perf_counter() - t0


_hooks_on = False


def count_triton_compiles() -> None:
    """Count Triton JIT compiles (and their seconds) into the current collector, in this process.
    Chains to hooks already installed; a no-op under the interpreter (nothing is compiled)."""
    global _hooks_on
    if _hooks_on or os.environ.get("TRITON_INTERPRET") == "1":
        return
    try:
        from triton import knobs
    except ImportError:
        return
    pre, post = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    started: list[float] = []

    def before(**kw):
        started.append(time.perf_counter())
        return pre(**kw) if pre else None

    def after(**kw):
        if started and _current is not None:
            _current[COMPILE] += time.perf_counter() - started.pop()
            _current[COMPILES] += 1
        elif started:
            started.pop()
        return post(**kw) if post else None

    knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = before, after
    _hooks_on = True


class Table:
    """Stage seconds per op, summed over every (implementation, case) run added, and each run's own
    seconds per stage (for the median: a process's one-time costs, such as the first load of a
    kernel from the disk cache or of a torch kernel's module, land in a few runs and move the mean,
    not the median)."""

    def __init__(self):
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.runs: dict[str, int] = defaultdict(int)
        self.per_run: dict[str, list[dict[str, float]]] = defaultdict(list)

    def add(self, op: str, stages: dict | tuple, run: bool = True) -> None:
        stages = dict(stages)
        for k, v in stages.items():
            self.seconds[op][k] += v
        self.runs[op] += int(run)
        if run:
            self.per_run[op].append(stages)
        elif self.per_run[op]:  # the parent's share of the run it just wrote rows for (``rows``)
            for k, v in stages.items():
                self.per_run[op][-1][k] = self.per_run[op][-1].get(k, 0.0) + v

    def frame(self) -> pd.DataFrame:
        """op, stage, runs, total_s, mean_ms (per run), median_ms (over the runs, a run without
        the stage counting 0), share (of the op's summed stage time). The row ``all`` is the sum
        over the stages (its median is the median run's total, not the sum of the medians)."""
        import pandas as pd  # here: `list` and each worker's start need no pandas

        rows = []
        for op in sorted(self.seconds):
            sec, runs = self.seconds[op], self.per_run[op]
            total = sum(sec.get(s, 0.0) for s in STAGES)
            n = max(self.runs[op], 1)

            def median(key) -> float:
                vals = [key(r) for r in runs]
                return 1e3 * float(statistics.median(vals)) if vals else float("nan")

            for s in STAGES + (COMPILE,):
                if s in sec:
                    rows.append(dict(op=op, stage=s if s != COMPILE else f"({COMPILE}, {int(sec[COMPILES])} kernels)",
                                     runs=self.runs[op], total_s=sec[s], mean_ms=1e3 * sec[s] / n,
                                     median_ms=median(lambda r, s=s: r.get(s, 0.0)),
                                     share=sec[s] / total if total else float("nan")))
            rows.append(dict(op=op, stage="all", runs=self.runs[op], total_s=total, mean_ms=1e3 * total / n,
                             median_ms=median(lambda r: sum(r.get(s, 0.0) for s in STAGES)),
                             share=1.0 if total else float("nan")))
        return pd.DataFrame(rows, columns=["op", "stage", "runs", "total_s", "mean_ms", "median_ms", "share"])

    def compiles(self) -> tuple[int, float]:
        """(kernels compiled, seconds compiling) over every op."""
        return (int(sum(s.get(COMPILES, 0) for s in self.seconds.values())),
                sum(s.get(COMPILE, 0.0) for s in self.seconds.values()))

    def format(self) -> str:
        f = self.frame()
        if f.empty:
            return "stage times: no runs"
        f = f.assign(total_s=f["total_s"].map("{:.2f}".format), mean_ms=f["mean_ms"].map("{:.2f}".format),
                     median_ms=f["median_ms"].map("{:.2f}".format),
                     share=f["share"].map(lambda x: f"{100 * x:.1f}%"))
        sync = "synced per stage" if os.environ.get(SYNC_ENV) == "1" else f"not synced ({SYNC_ENV}=1 syncs)"
        return f"stage times (wall, summed over workers; {sync}):\n" + f.to_string(index=False)


COMPILE_LINE = "triton compiles during the run"


def compile_line(table: Table) -> str:
    """One line (``harness.nightly.run`` parses it): kernels the run's processes compiled and the seconds
    it took (a disk-cache hit counts too, in milliseconds; ``python -m harness warmup`` fills it)."""
    n, secs = table.compiles()
    return f"{COMPILE_LINE}: {n} kernels, {secs:.1f} s"
