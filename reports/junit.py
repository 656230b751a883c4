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

from harness.timeline_rows import RUN_KEY, fail_line
from reports.rows import failing

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
        n = fails = 0
        for (_, path, tid), g in per_fam.groupby(RUN_KEY, sort=False):
            tc = ET.SubElement(suite, "testcase", classname=f"timelines.{fam}", name=f"{tid} [{path}]")
            n += 1
            bad = g[failing(g["status"])]
            if not bad.empty:
                fails += 1
                first = bad.iloc[0]
                el = ET.SubElement(tc, "failure", message=f"{fail_line(first)} | repro: {first['repro']}",
                                   type=str(first["check"]))
                el.text = "\n".join([fail_line(r) for _, r in bad.iterrows()] + [f"repro: {first['repro']}"])
        for k, v in (("tests", n), ("failures", fails), ("errors", 0), ("skipped", 0)):
            suite.set(k, str(v))


def to_xml(frame: pd.DataFrame, *, name: str = "verify-parity", timelines: pd.DataFrame | None = None) -> ET.ElementTree:
    root = ET.Element("testsuites", name=name)
    for op, per_op in frame.groupby("op", sort=False):
        suite = _suite(root, str(op), per_op)
        n = fails = skips = 0
        total = 0.0
        for (_, impl, case), g in per_op.groupby(CASE_KEY, sort=False):
            secs = float(g["seconds"].iloc[0]) if pd.notna(g["seconds"].iloc[0]) else 0.0
            tc = ET.SubElement(suite, "testcase", classname=f"{op}.{impl}", name=str(case), time=f"{secs:.3f}")
            n, total = n + 1, total + secs
            if failing(g["status"]).any():  # fail or timeout
                fails += 1
                w = worst_failure(g)
                body = [failure_line(r) + f"\n    worst: {r['worst']}" for _, r in g[failing(g["status"])].iterrows()]
                el = ET.SubElement(tc, "failure", message=f"{failure_line(w)} | repro: {w['repro']}", type=str(w["check"]))
                el.text = "\n".join(body + [f"repro: {w['repro']}"])
            elif (g["status"] == "refused").all():
                skips += 1
                ET.SubElement(tc, "skipped", message=f"refused: {g['detail'].iloc[0]}")
            elif (g["status"] == "known").any():  # an expected failure: the ledger entry that explains it
                skips += 1
                k = g[g["status"] == "known"]
                ET.SubElement(tc, "skipped", message=f"known failure {k['known'].iloc[0]}: "
                                                     f"{', '.join(sorted(set(k['check'])))} | repro: {k['repro'].iloc[0]}")
        suite.set("tests", str(n))
        suite.set("failures", str(fails))
        suite.set("errors", "0")
        suite.set("skipped", str(skips))
        suite.set("time", f"{total:.3f}")
    if timelines is not None:
        _timeline_suites(root, timelines)
    ET.indent(root)
    return ET.ElementTree(root)


def write(frame: pd.DataFrame, path: str | Path, *, timelines: pd.DataFrame | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    to_xml(frame, timelines=timelines).write(path, encoding="utf-8", xml_declaration=True)
    return path
