"""Parity rows -> JUnit XML: one testsuite per op, one testcase per (op, impl, case).

A failing case's message is its worst check (largest err/allowed; exact checks, which have no
ratio, rank first) and its one-line repro; the body lists every failing check. A case whose
every row is ``refused`` is skipped with the implementation's reason.
"""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

CASE_KEY = ["op", "impl", "case"]
PROVENANCE = ["git_sha", "device", "arch", "fp8_format", "torch", "triton", "shim", "profile", "seed"]


def _ratio(r) -> float:
    try:
        v = float(r["err"]) / float(r["allowed"])
    except (TypeError, ValueError, ZeroDivisionError):
        return math.inf
    return math.inf if math.isnan(v) else v


def worst_failure(group: pd.DataFrame):
    bad = group[group["status"] == "fail"]
    return max((r for _, r in bad.iterrows()), key=_ratio)


def failure_line(r) -> str:
    ratio = _ratio(r)
    what = "" if math.isinf(ratio) else f"err/allowed={ratio:.3g}; "
    return f"{r['check']}: {what}{r['detail'] or r['worst']}"


def to_xml(frame: pd.DataFrame, *, name: str = "verify-parity") -> ET.ElementTree:
    root = ET.Element("testsuites", name=name)
    for op, per_op in frame.groupby("op", sort=False):
        suite = ET.SubElement(root, "testsuite", name=str(op))
        props = ET.SubElement(suite, "properties")
        for col in PROVENANCE:
            if col in per_op.columns:
                ET.SubElement(props, "property", name=col, value=str(per_op[col].iloc[0]))
        n = fails = skips = 0
        total = 0.0
        for (_, impl, case), g in per_op.groupby(CASE_KEY, sort=False):
            secs = float(g["seconds"].iloc[0]) if pd.notna(g["seconds"].iloc[0]) else 0.0
            tc = ET.SubElement(suite, "testcase", classname=f"{op}.{impl}", name=str(case), time=f"{secs:.3f}")
            n, total = n + 1, total + secs
            if (g["status"] == "fail").any():
                fails += 1
                w = worst_failure(g)
                body = [failure_line(r) + f"\n    worst: {r['worst']}" for _, r in g[g["status"] == "fail"].iterrows()]
                el = ET.SubElement(tc, "failure", message=f"{failure_line(w)} | repro: {w['repro']}", type=str(w["check"]))
                el.text = "\n".join(body + [f"repro: {w['repro']}"])
            elif (g["status"] == "refused").all():
                skips += 1
                ET.SubElement(tc, "skipped", message=f"refused: {g['detail'].iloc[0]}")
        suite.set("tests", str(n))
        suite.set("failures", str(fails))
        suite.set("errors", "0")
        suite.set("skipped", str(skips))
        suite.set("time", f"{total:.3f}")
    ET.indent(root)
    return ET.ElementTree(root)


def write(frame: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    to_xml(frame).write(path, encoding="utf-8", xml_declaration=True)
    return path
