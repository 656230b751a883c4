"""One self-contained HTML report (inline CSS and SVG, no network assets) rendered with jinja2.

Sections: regressions against the baseline (every one, first), provenance, summary, per-op tables, failures (worst check, worst elements, repro
line), error-vs-shape plots, store-timing timelines (runs per model family and path, each failing
run's first failing check and repro), mutant kill matrix, benchmark ratios, gate verdicts,
baseline diff.
Everything shown is a column of the rows or a count/grouping of them. Sections with nothing failing
are collapsed (``<details>``); no table is wider than the page (cells wrap, long case ids are cut with
the whole id as their title): tests/test_report_browser.py reads both off Chromium at 1,400 x 900.
"""
from __future__ import annotations

import math
from pathlib import Path

import jinja2
import pandas as pd

from reports import timeline_rows
from reports import plots
from reports.junit import CASE_KEY, PROVENANCE, failure_line, worst_failure
from reports.rows import failing, replacing

MAX_DIFF_ROWS = 1000  # changes other than REGRESS shown (every REGRESS is, first); diff.csv has them all
OTHER_CHANGES = ["SLOWER", "FIXED", "CHANGED", "NEW", "REMOVED"]  # the diff section's order, after the regressions
MAX_ID = 90  # characters of a case id shown in a table cell; the whole id is its title (hover) and in diff.csv
MAX_TIMELINE_FAILURES = 1000  # failing timeline runs shown; junit.xml has them all
TL_FAIL_COLS = ["model_family", "path", "timeline", "step", "mode", "layer", "check", "err", "allowed", "detail"]


def _fmt(v) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4g}"
    return "" if v is None else str(v)


def _short(v) -> str:
    """A long id cut to ``MAX_ID`` characters (the cell's ``title`` holds it whole)."""
    v = _fmt(v)
    return v if len(v) <= MAX_ID else v[: MAX_ID - 1] + "…"


def diff_parts(diff: pd.DataFrame | None) -> tuple[list[dict], list[dict], int]:
    """(every REGRESS row, the other changes in ``OTHER_CHANGES`` order cut at ``MAX_DIFF_ROWS``, how many
    of those were cut)."""
    if diff is None:
        return [], [], 0
    other = diff[diff["change"] != "REGRESS"]
    other = other.assign(_o=other["change"].map({c: i for i, c in enumerate(OTHER_CHANGES)})) \
        .sort_values("_o", kind="stable").drop(columns="_o")
    return (_records(diff[diff["change"] == "REGRESS"]), _records(other.head(MAX_DIFF_ROWS)),
            max(len(other) - MAX_DIFF_ROWS, 0))


def _records(frame: pd.DataFrame | None) -> list[dict]:
    return [] if frame is None else frame.to_dict("records")


def base_check(checks: pd.Series) -> pd.Series:
    """Each check's name without its rerun suffix (``numeric:o@poisoned`` -> ``numeric:o``), worked out once per
    distinct name (a nightly has a million rows and a few hundred names)."""
    return checks.map({c: str(c).split("@")[0] for c in checks.unique()})


def per_op_checks(frame: pd.DataFrame, op: str) -> pd.DataFrame:
    """impl × check: "failing/total" rows, else "ok total" or "refused total" (poisoned-output
    reruns folded into their check)."""
    f = frame[frame["op"] == op]
    f = f.assign(check=base_check(f["check"]), failed=failing(f["status"]), refused=f["status"] == "refused")
    g = f.groupby(["impl", "check"]).agg(failed=("failed", "sum"), refused=("refused", "sum"),
                                         total=("failed", "size")).reset_index()
    g["cell"] = [f"{a}/{n}" if a else f"refused {n}" if r == n else f"ok {n}"
                 for a, r, n in zip(g["failed"], g["refused"], g["total"])]
    return g.pivot(index="impl", columns="check", values="cell").fillna("").reset_index()


def kill_matrix(mutants: pd.DataFrame) -> pd.DataFrame:
    """mutant × check: number of cases in which the check flagged the mutant; killed = any."""
    f = mutants.assign(check=base_check(mutants["check"]))
    bad = f[failing(f["status"])]
    m = bad.groupby(["op", "impl", "check"])["case"].nunique().unstack("check")
    m = m.reindex(pd.MultiIndex.from_frame(f[["op", "impl"]].drop_duplicates())).fillna(0).astype(int)
    m.insert(0, "cases", f.groupby(["op", "impl"])["case"].nunique().reindex(m.index).values)
    m.insert(1, "killed", (m.drop(columns="cases") > 0).any(axis=1).map({True: "KILLED", False: "SURVIVED"}))
    return m.reset_index()


KM_COLS = ["subject", "kind", "parity", "timeline", "gate", "e2e", "first_failure"]


def _targeted(km: pd.DataFrame | None) -> pd.DataFrame | None:
    """The targeted kill matrix (``harness.mutants.killmatrix`` CSV); an older CSV without the e2e column reads 'not run'."""
    if km is None or km.empty:
        return None
    km = km.assign(e2e=km["e2e"] if "e2e" in km else "not run")
    return km.assign(first_failure=km["first_failure"].fillna("").astype(str).str.slice(0, 160))[KM_COLS]


def failure_groups(frame: pd.DataFrame) -> list[dict]:
    bad = frame[failing(frame["status"])]
    out = []
    for (op, impl, case), g in bad.groupby(CASE_KEY, sort=False):
        w = worst_failure(g)
        out.append(dict(op=op, impl=impl, case=case, headline=failure_line(w), repro=w["repro"],
                        checks=g[["check", "err", "allowed", "max_abs", "mismatch_frac", "worst", "detail"]]
                        .to_dict("records")))
    return out


def render(frame: pd.DataFrame, *, mutants: pd.DataFrame | None = None, perf: pd.DataFrame | None = None,
           gate: pd.DataFrame | None = None, diff: pd.DataFrame | None = None, baseline: str = "",
           threshold: float = 0.10, killmatrix: pd.DataFrame | None = None,
           timelines: pd.DataFrame | None = None) -> str:
    from reports.summary import summary

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = _fmt
    env.filters["short"] = _short
    ops = list(frame["op"].unique())  # in order of first appearance
    prov = {c: sorted({str(v) for v in frame[c].unique()}) for c in PROVENANCE if c in frame.columns}
    if "shim" in prov:  # rows of compiled runs carry no shim id ("" once frames.read has read them): say so
        prov["shim"] = sorted({v or "off (compiled Triton)" for v in prov["shim"]})
    s = summary(frame) if not frame.empty else pd.DataFrame()
    counts = frame.groupby("status").size().to_dict() if not frame.empty else {}
    diff_counts = diff.groupby("change").size().to_dict() if diff is not None and not diff.empty else {}
    km = kill_matrix(mutants) if mutants is not None and not mutants.empty else None
    tl_sum = None if timelines is None else timeline_rows.summary(timelines)
    tl_bad = None if timelines is None else timeline_rows.first_failures(timelines)
    regress_rows, other_rows, diff_more = diff_parts(diff)
    return env.get_template("report.html.j2").render(
        prov=prov, counts=counts, n_rows=len(frame), n_cases=frame[CASE_KEY].drop_duplicates().shape[0],
        summary=_records(s), summary_cols=list(s.columns),
        ops=[dict(name=op, table=per_op_checks(frame, op), svg=plots.svg(frame, op),
                  failing=bool(failing(frame[frame["op"] == op]["status"]).any())) for op in ops],
        failures=failure_groups(frame),
        timelines=timelines is not None, tl_summary=_records(tl_sum), tl_summary_cols=timeline_rows.SUMMARY_COLS,
        tl_runs=0 if tl_sum is None else int(tl_sum["runs"].sum()),
        tl_failed=0 if tl_sum is None else int(tl_sum["failed"].sum()),
        tl_failures=_records(None if tl_bad is None else tl_bad.head(MAX_TIMELINE_FAILURES)), tl_fail_cols=TL_FAIL_COLS,
        tl_more=0 if tl_bad is None else max(len(tl_bad) - MAX_TIMELINE_FAILURES, 0),
        kills=_records(km), kill_cols=[] if km is None else list(km.columns),
        km_rows=_records(_targeted(killmatrix)), km_cols=KM_COLS,
        perf=_records(perf), perf_cols=[] if perf is None else [c for c in perf.columns if c not in PROVENANCE],
        gate=gate, gate_rows=_records(gate), gate_cols=[] if gate is None else [c for c in gate.columns if c not in PROVENANCE],
        diff=diff, diff_counts=diff_counts, regress_rows=regress_rows, diff_rows=other_rows, diff_more=diff_more,
        baseline=baseline, threshold=threshold)


def write(path: str | Path, frame: pd.DataFrame, **kw) -> Path:
    """The report page at ``path``, all or nothing (``reports.rows.replacing``)."""
    page = render(frame, **kw)
    with replacing(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return Path(path)
