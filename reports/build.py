"""``python -m harness report``: merge shard results files (CSV or Parquet), write merged.parquet (every parity
row, ``reports.rows.to_parquet``), junit.xml, diff.csv, report.html."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from reports import timeline_rows
from reports import diff as diffs
from reports import frames, html, junit
from reports.rows import GateRow, ParityRow, PerfRow, TimelineRow, failing, write_frame

# harness.mutants.killmatrix.KillRow's columns that the report shows
KILL_MATRIX_COLUMNS = ["subject", "kind", "parity", "timeline", "gate", "first_failure", "seconds"]
MERGED = "merged.parquet"  # every parity row of the run (the next run's --baseline); a CSV of a nightly was 704 MB


@dataclass(frozen=True)
class Built:
    out: Path
    rows: int
    failed_rows: int
    regress: int
    diff_rows: int
    timeline_runs: int = 0
    failed_timeline_runs: int = 0
    inputs: tuple = ()  # (flag, path, rows) per file read, in the order read


def build(csvs: list, out: str | Path, *, mutants: list = (), perf: list = (), gate: list = (),
          baseline: str | Path | None = None, baseline_perf: str | Path | None = None,
          threshold: float = 0.10, killmatrix: list = (), timelines: list = ()) -> Built:
    out = Path(out)
    inputs = []

    def read(flag, paths, row_type):
        got = []
        f = frames.read(paths, row_type, counts=got)
        inputs.extend((flag, str(p), n) for p, n in got)
        return f

    frame = read("--csv", csvs, ParityRow)  # every file is checked before anything is written
    tl = read("--timelines", timelines, TimelineRow) if timelines else None
    mut = read("--mutants", mutants, ParityRow) if mutants else None
    prf = read("--perf", perf, PerfRow) if perf else None
    gt = read("--gate", gate, GateRow) if gate else None
    old = read("--baseline", [baseline], ParityRow) if baseline else None
    old_perf = read("--baseline-perf", [baseline_perf], PerfRow) if baseline and baseline_perf else None
    kms = [frames.read_one(p, KILL_MATRIX_COLUMNS, "kill-matrix", complete="seconds") for p in killmatrix]
    inputs.extend(("--kill-matrix", str(p), len(f)) for p, f in zip(killmatrix, kms))
    km = pd.concat(kms, ignore_index=True) if kms else None
    out.mkdir(parents=True, exist_ok=True)
    write_frame(frame, out / MERGED)
    junit.write(frame, out / "junit.xml", timelines=tl)
    d = None
    if baseline:
        d = diffs.diff(old, frame, old_perf=old_perf, new_perf=prf, threshold=threshold)
    write_frame(d if d is not None else diffs.parity_diff(frame.iloc[:0], frame.iloc[:0]), out / "diff.csv")
    html.write(out / "report.html", frame, mutants=mut, perf=prf, gate=gt, diff=d,
               baseline=str(baseline or ""), threshold=threshold, killmatrix=km, timelines=tl)
    tl_runs = timeline_rows.summary(tl) if tl is not None else None
    return Built(out=out, rows=len(frame), failed_rows=int(failing(frame["status"]).sum()),
                 regress=0 if d is None else len(diffs.regressions(d)), diff_rows=0 if d is None else len(d),
                 timeline_runs=0 if tl_runs is None else int(tl_runs["runs"].sum()),
                 failed_timeline_runs=0 if tl_runs is None else int(tl_runs["failed"].sum()), inputs=tuple(inputs))
