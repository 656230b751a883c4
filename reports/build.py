"""``python -m harness report``: merge shard CSVs, write merged.csv, junit.xml, diff.csv, report.html."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import timeline_rows
from reports import diff as diffs
from reports import frames, html, junit
from reports.rows import GateRow, ParityRow, PerfRow, TimelineRow, failing


@dataclass(frozen=True)
class Built:
    out: Path
    rows: int
    failed_rows: int
    regress: int
    diff_rows: int
    timeline_runs: int = 0
    failed_timeline_runs: int = 0


def build(csvs: list, out: str | Path, *, mutants: list = (), perf: list = (), gate: list = (),
          baseline: str | Path | None = None, baseline_perf: str | Path | None = None,
          threshold: float = 0.10, killmatrix: list = (), timelines: list = ()) -> Built:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    frame = frames.read(csvs, ParityRow)
    frame.to_csv(out / "merged.csv", index=False)
    tl = frames.read(timelines, TimelineRow) if timelines else None
    junit.write(frame, out / "junit.xml", timelines=tl)
    mut = frames.read(mutants, ParityRow) if mutants else None
    prf = frames.read(perf, PerfRow) if perf else None
    gt = frames.read(gate, GateRow) if gate else None
    d = None
    if baseline:
        old_perf = frames.read([baseline_perf], PerfRow) if baseline_perf else None
        d = diffs.diff(frames.read([baseline], ParityRow), frame, old_perf=old_perf, new_perf=prf, threshold=threshold)
    (d if d is not None else diffs.parity_diff(frame.iloc[:0], frame.iloc[:0])).to_csv(out / "diff.csv", index=False)
    km = pd.concat([pd.read_csv(p) for p in killmatrix], ignore_index=True) if killmatrix else None
    html.write(out / "report.html", frame, mutants=mut, perf=prf, gate=gt, diff=d,
               baseline=str(baseline or ""), threshold=threshold, killmatrix=km, timelines=tl)
    tl_runs = timeline_rows.summary(tl) if tl is not None else None
    return Built(out=out, rows=len(frame), failed_rows=int(failing(frame["status"]).sum()),
                 regress=0 if d is None else len(diffs.regressions(d)), diff_rows=0 if d is None else len(d),
                 timeline_runs=0 if tl_runs is None else int(tl_runs["runs"].sum()),
                 failed_timeline_runs=0 if tl_runs is None else int(tl_runs["failed"].sum()))
