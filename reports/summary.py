"""What a parity run reports from its rows: the per (op, implementation) summary table, the failing
rows, and the printout ``run`` ends with (the table, known failures, one repro line per failing
(implementation, case) pair). Pure functions of a rows frame (``reports.rows.to_frame``)."""
from __future__ import annotations

import sys

import pandas as pd

from reports.rows import failing

MAX_REPRO_LINES = 40


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (op, impl): cases, cases passing every check, failing (``timeout`` among them: cases that
    gave no result in their time limit), known, refused; worst err/allowed; the implementation's
    fp8_policy, precision class and NaN policy (when some implementation has one) as its rows state them."""
    if frame.empty:
        return frame
    keys = ["op", "impl", "kind", "case"]
    f = frame.assign(failed=failing(frame["status"]), timeout=frame["status"] == "timeout",
                     refused=frame["status"] == "refused", known=frame["status"] == "known",
                     ratio=frame["err"] / frame["allowed"])
    per_case = f.groupby(keys).agg(failed=("failed", "any"), timeout=("timeout", "any"), refused=("refused", "all"),
                                   known=("known", "any"), ratio=("ratio", "max"), seconds=("seconds", "first"))
    per_case["known"] &= ~per_case["failed"]  # a case with a failure the ledger does not explain counts as failed
    out = per_case.groupby(keys[:3]).agg(
        cases=("failed", "size"), passed=("failed", lambda x: int((~x).sum())), failed=("failed", "sum"),
        timeout=("timeout", "sum"), known=("known", "sum"), refused=("refused", "sum"),
        worst_err_over_allowed=("ratio", "max"), seconds=("seconds", "sum"))
    out["passed"] -= out["refused"] + out["known"]
    out = out.reset_index()
    def stated(col):  # per (op, impl, kind): the distinct values of ``col`` its rows state, joined
        d = frame[keys[:3] + [col]].drop_duplicates()
        return d.groupby(keys[:3])[col].agg(lambda p: ",".join(sorted({str(x) for x in p if x == x})))

    if "fp8_policy" in frame:  # each implementation's fp8 overflow policy, as its rows state it
        out.insert(3, "fp8_policy", out.set_index(keys[:3]).index.map(stated("fp8_policy")).fillna(""))
    if "precision" in frame:  # each implementation's declared precision class (harness.tolerance), beside it
        out.insert(4 if "fp8_policy" in out else 3, "precision",
                   out.set_index(keys[:3]).index.map(stated("precision")).fillna(""))
    if "nan_policy" in frame and (frame["nan_policy"].fillna("") != "").any():  # the NaN handling it is held to
        out.insert(list(out.columns).index("kind") + 1 + ("fp8_policy" in out) + ("precision" in out), "nan_policy",
                   out.set_index(keys[:3]).index.map(stated("nan_policy")).fillna(""))
    return out


def failures(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows whose status fails the run (``reports.rows.FAILING``: fail, timeout)."""
    return frame[failing(frame["status"])]


def print_report(frame: pd.DataFrame, out=sys.stdout) -> int:
    """The summary table, a KNOWN line per (implementation, ledger entry), a FAIL line with its repro
    per failing (implementation, case) pair (the first ``MAX_REPRO_LINES``). Exit status: 1 when
    something failed or nothing ran, else 0."""
    if frame.empty:
        print("no runs", file=out)
        return 1
    s = summary(frame)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3g}".format):
        print("\n" + s.to_string(index=False), file=out)
    known = frame[frame["status"] == "known"]
    for key, g in known.groupby(["impl", "known"], sort=False):
        print(f"KNOWN {key[0]} [{key[1]}]: {g['case'].nunique()} cases ({', '.join(sorted(set(g['check'])))})", file=out)
    bad = failures(frame).drop_duplicates(["impl", "case"])
    for _, r in bad.head(MAX_REPRO_LINES).iterrows():
        print(f"FAIL {r['impl']} {r['case']} [{r['check']}] {r['detail'] or r['worst']}\n  repro: {r['repro']}", file=out)
    if len(bad) > MAX_REPRO_LINES:
        print(f"... {len(bad) - MAX_REPRO_LINES} more failing (impl, case) pairs in the CSV", file=out)
    return 0 if bad.empty else 1
