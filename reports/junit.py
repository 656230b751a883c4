"""Parity rows -> JUnit XML: one testsuite per op, one testcase per (op, impl, case).

A failing case's message is its worst check (largest err/allowed; exact checks, which have no
ratio, rank first) and its one-line repro; the body lists every failing check. A case whose
every row is ``refused`` is skipped with the implementation's reason; a ``timeout`` row (no result
within the case's time limit) is a failure like a failing check.

Timeline rows (``TimelineRow``), when given: one testsuite ``timelines.<model family>``, one
testcase per timeline run (a timeline through one path), failing on its first failing check
(step order) with the run's repro; the body lists every failing check. Timeline rows carry no
timing, so these testcases have no ``time``.
"""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

from reports.timeline_rows import RUN_KEY, fail_line
from reports.rows import failing, replacing

CASE_KEY = ["op", "impl", "case"]
PROVENANCE = ["git_sha", "device", "arch", "fp8_format", "torch", "triton", "shim", "profile", "seed"]


def _ratio(r) -> float:
    try:
        v = float(r["err"]) / float(r["allowed"])
    except (TypeError, ValueError, ZeroDivisionError):
        return math.inf
    return math.inf if math.isnan(v) else v


def worst_failure(group: pd.DataFrame):
    bad = group[failing(group["status"])]
    return max((r for _, r in bad.iterrows()), key=_ratio)


def failure_line(r) -> str:
    ratio = _ratio(r)
    what = "" if math.isinf(ratio) else f"err/allowed={ratio:.3g}; "
    return f"{r['check']}: {what}{r['detail'] or r['worst']}"


def _suite(root: ET.Element, name: str, rows: pd.DataFrame) -> ET.Element:
    suite = ET.SubElement(root, "testsuite", name=name)
    props = ET.SubElement(suite, "properties")
    for col in PROVENANCE:
        if col in rows.columns:
            ET.SubElement(props, "property", name=col, value=str(rows[col].iloc[0]))
    return suite


def _timeline_suites(root: ET.Element, timelines: pd.DataFrame) -> None:
    for fam, per_fam in timelines.groupby("model_family", sort=False):
        suite = _suite(root, f"timelines.{fam}", per_fam)
        bad_rows = per_fam[failing(per_fam["status"])]
        bad_runs = dict(iter(bad_rows.groupby(RUN_KEY, sort=False)))  # the few failing runs, their failing rows
        runs = per_fam.drop_duplicates(RUN_KEY)  # every run once, in order of its first row
        for _, path, tid in runs[RUN_KEY].itertuples(index=False):
            tc = ET.SubElement(suite, "testcase", classname=f"timelines.{fam}", name=f"{tid} [{path}]")
            bad = bad_runs.get((fam, path, tid))
            if bad is not None:
                first = bad.iloc[0]
                el = ET.SubElement(tc, "failure", message=f"{fail_line(first)} | repro: {first['repro']}",
                                   type=str(first["check"]))
                el.text = "\n".join([fail_line(r) for _, r in bad.iterrows()] + [f"repro: {first['repro']}"])
        for k, v in (("tests", len(runs)), ("failures", len(bad_runs)), ("errors", 0), ("skipped", 0)):
            suite.set(k, str(v))


def to_xml(frame: pd.DataFrame, *, name: str = "verify-parity", timelines: pd.DataFrame | None = None) -> ET.ElementTree:
    root = ET.Element("testsuites", name=name)
    for op, per_op in frame.groupby("op", sort=False):
        suite = _suite(root, str(op), per_op)
        status = per_op["status"]
        flags = pd.DataFrame({"bad": failing(status), "refused": status == "refused", "known": status == "known"})
        per_case = flags.groupby([per_op[c] for c in CASE_KEY], sort=False, dropna=False).agg(
            bad=("bad", "any"), refused=("refused", "all"), known=("known", "any"))
        firsts = per_op.drop_duplicates(CASE_KEY)  # each case's first row, in the groups' order
        odd = per_case[per_case["bad"] | per_case["refused"] | per_case["known"]]  # the few that need their rows
        odd_rows = dict(iter(per_op.merge(odd.index.to_frame(index=False), on=CASE_KEY)
                             .groupby(CASE_KEY, sort=False))) if len(odd) else {}
        fails = skips = 0
        secs_all = firsts["seconds"].fillna(0.0).astype(float)
        for (_, impl, case), secs, flag in zip(firsts[CASE_KEY].itertuples(index=False), secs_all,
                                              per_case.itertuples(index=False)):
            tc = ET.SubElement(suite, "testcase", classname=f"{op}.{impl}", name=str(case), time=f"{secs:.3f}")
            if not (flag.bad or flag.refused or flag.known):
                continue
            g = odd_rows[(op, impl, case)]
            if flag.bad:  # fail or timeout
                fails += 1
                w = worst_failure(g)
                body = [failure_line(r) + f"\n    worst: {r['worst']}" for _, r in g[failing(g["status"])].iterrows()]
                el = ET.SubElement(tc, "failure", message=f"{failure_line(w)} | repro: {w['repro']}", type=str(w["check"]))
                el.text = "\n".join(body + [f"repro: {w['repro']}"])
            elif flag.refused:
                skips += 1
                ET.SubElement(tc, "skipped", message=f"refused: {g['detail'].iloc[0]}")
            else:  # an expected failure: the ledger entry that explains it
                skips += 1
                k = g[g["status"] == "known"]
                ET.SubElement(tc, "skipped", message=f"known failure {k['known'].iloc[0]}: "
                                                     f"{', '.join(sorted(set(k['check'])))} | repro: {k['repro'].iloc[0]}")
        suite.set("tests", str(len(firsts)))
        suite.set("failures", str(fails))
        suite.set("errors", "0")
        suite.set("skipped", str(skips))
        suite.set("time", f"{sum(secs_all.tolist()):.3f}")  # summed in case order, as before
    if timelines is not None:
        _timeline_suites(root, timelines)
    ET.indent(root)
    return ET.ElementTree(root)


def write(frame: pd.DataFrame, path: str | Path, *, timelines: pd.DataFrame | None = None) -> Path:
    """The JUnit XML of ``frame`` at ``path``, all or nothing (``reports.rows.replacing``)."""
    with replacing(path) as tmp:
        to_xml(frame, timelines=timelines).write(tmp, encoding="utf-8", xml_declaration=True)
    return Path(path)
