"""Baseline diff: this run vs a previous run's CSV.

Parity, per (op, impl, case, check): REGRESS (pass or refused -> fail or timeout; and a case of
the baseline that now times out: its one ``timeout`` row), FIXED (fail or timeout -> pass or
refused), NEW, REMOVED, CHANGED (pass <-> refused, fail <-> timeout). Perf, per (op, impl, case, mode): SLOWER when
this run's p20 is above the baseline's p80 by more than ``threshold`` (0.10 = 10 %), i.e. the two
runs' spreads are apart, not only their medians: between two H200 nightlies the eager p50 of
host-bound shapes (B 1, a few launches) moved by 0.2-12x with the host's load while their spreads
overlapped (a median rule flagged 7 such rows, this one 3). Unchanged keys are left out.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from reports.rows import FAILING

PARITY_KEY = ["op", "impl", "case", "check"]
PERF_KEY = ["op", "impl", "case", "mode"]
COLUMNS = ["kind", "op", "impl", "case", "check", "change", "old", "new", "repro"]
_RANK = {"pass": 0, "refused": 1, "known": 2, "timeout": 3, "fail": 4}  # known: a ledger entry explains the failure


def _status(frame: pd.DataFrame) -> pd.DataFrame:
    """One status per key; a key seen twice (overlapping shards) keeps its worst status."""
    f = frame.assign(_rank=frame["status"].map(_RANK))
    f = f.sort_values("_rank", kind="stable").drop_duplicates(PARITY_KEY, keep="last")
    return f[PARITY_KEY + ["status", "repro"]]


def _changes(old: pd.Series, new: pd.Series) -> np.ndarray:
    """Per key, from its old and new status (NaN: the key is missing on that side), the first that holds of:
    NEW (no old), REMOVED (no new), SAME, REGRESS (new fails, old did not), FIXED (the other way round),
    CHANGED. Column-wise: a nightly diffs a million keys."""
    o_na, n_na = old.isna().to_numpy(), new.isna().to_numpy()
    o_bad, n_bad = old.isin(FAILING).to_numpy(), new.isin(FAILING).to_numpy()
    same = (old.astype(object).to_numpy() == new.astype(object).to_numpy()) & ~o_na & ~n_na
    return np.select([o_na, n_na, same, n_bad & ~o_bad, o_bad & ~n_bad], ["NEW", "REMOVED", "SAME", "REGRESS", "FIXED"],
                     "CHANGED")


def parity_diff(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    m = _status(old).merge(_status(new), on=PARITY_KEY, how="outer", suffixes=("_old", "_new"))
    m["change"] = _changes(m["status_old"], m["status_new"])
    # a case that timed out has one ``timeout`` row instead of its checks: a NEW row, but the case was there
    known = pd.MultiIndex.from_frame(old[PARITY_KEY[:3]].drop_duplicates())
    was = pd.MultiIndex.from_frame(m[PARITY_KEY[:3]]).isin(known)
    m.loc[(m["change"] == "NEW") & (m["status_new"] == "timeout") & was, "change"] = "REGRESS"
    m = m[m["change"] != "SAME"]
    return pd.DataFrame({"kind": "parity", **{k: m[k] for k in PARITY_KEY}, "change": m["change"],
                         "old": m["status_old"].fillna(""), "new": m["status_new"].fillna(""),
                         "repro": m["repro_new"].fillna(m["repro_old"]).fillna("")}, columns=COLUMNS)


def perf_diff(old: pd.DataFrame, new: pd.DataFrame, threshold: float = 0.10) -> pd.DataFrame:
    """Per (op, impl, case, mode); a graph row has its median only (no p20/p80): its p50 stands
    for both ends of its spread."""
    cols = PERF_KEY + ["p20_us", "p50_us", "p80_us"]
    m = old[cols].merge(new[cols], on=PERF_KEY, suffixes=("_old", "_new"))
    m = m[m["p20_us_new"].fillna(m["p50_us_new"]) > m["p80_us_old"].fillna(m["p50_us_old"]) * (1.0 + threshold)]
    return pd.DataFrame({"kind": "perf", **{k: m[k] for k in PERF_KEY}, "check": m["mode"] + " p50_us",
                         "change": "SLOWER",
                         "old": m["p50_us_old"], "new": m["p50_us_new"], "repro": ""}, columns=COLUMNS)


def diff(old: pd.DataFrame, new: pd.DataFrame, *, old_perf: pd.DataFrame | None = None,
         new_perf: pd.DataFrame | None = None, threshold: float = 0.10) -> pd.DataFrame:
    parts = [parity_diff(old, new)]
    if old_perf is not None and new_perf is not None and not old_perf.empty and not new_perf.empty:
        parts.append(perf_diff(old_perf, new_perf, threshold))
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)


def regressions(d: pd.DataFrame) -> pd.DataFrame:
    return d[d["change"] == "REGRESS"]
