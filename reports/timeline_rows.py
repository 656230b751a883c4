"""Store-timing timeline runs as rows (``reports.rows.TimelineRow``): a run's one-line repro, its
rows, the per-(model family, path) summary and each failing run's first failing check. Shared by
``python -m harness timelines`` and the report, so both print the same table and the same repro.
"""
from __future__ import annotations

import hashlib
import shlex

import pandas as pd

from cases import base
from reports.rows import Provenance, TimelineRow, failing

SUMMARY_KEY = ["model_family", "path"]
RUN_KEY = ["model_family", "path", "timeline"]  # one timeline through one path
SUMMARY_COLS = SUMMARY_KEY + ["runs", "passed", "failed", "checks", "failed_checks"]


def repro_line(device_kind: str, t, spec: tuple, plugins: tuple[str, ...] = ()) -> str:
    """The command that reruns timeline ``t`` on one path; ``spec`` is the CLI's path spec:
    ("clean", prepare, attn, backend, accept) or ("mutant", name) (``harness.timelines.suite``); ``plugins``:
    the ``--impl module:attr[name]`` values that load the path's plugged-in implementations again
    (``Impl.impl_arg``); a backend spec (``module:attr``) is loaded again by ``--backend``."""
    cmd = f"python -m harness timelines --device {device_kind} --timeline '{base.case_id('timeline', t)}'"
    cmd += "".join(f" --impl {shlex.quote(a)}" for a in plugins)
    if spec[0] == "mutant":
        return f"{cmd} --path-mutant {spec[1]}"
    if len(spec) > 3 and spec[3]:
        cmd += f" --backend {shlex.quote(spec[3])}"
    names = [x for x in (*spec[1:3], *spec[4:5]) if x]
    return cmd if names == ["fused", "fused"] else f"{cmd} --path {'+'.join(names)}"


def rows_for(path_name: str, t, records: list, repro: str, prov: Provenance) -> list[TimelineRow]:
    """One row per check of ``harness.timelines.runner.run_timeline``'s records, in their order."""
    tid = t.name or base.case_id("timeline", t)
    return [TimelineRow(path=path_name, timeline=tid, model_family=t.family, step=s.step, mode=s.mode, layer=s.layer,
                        family=s.family, check=s.record.check, status="pass" if s.record.passed else "fail",
                        err=s.record.err, allowed=s.record.allowed, detail=s.record.detail or s.record.worst,
                        repro=repro, **prov.__dict__) for s in records]


def lost_rows(path_name: str, t, lost, repro: str, prov: Provenance) -> list[TimelineRow]:
    """The one row of a run that gave no result (``harness.pool.Lost``): status ``timeout`` (past
    ``--case-timeout-s``) or ``fail`` (its worker process died), where its stack was and is on disk."""
    where = lost.innermost()
    return [TimelineRow(path=path_name, timeline=t.name or base.case_id("timeline", t), model_family=t.family,
                        step=-1, mode="", layer=-1, family="timeline",
                        check="timeout" if lost.reason == "timeout" else "run",
                        status="timeout" if lost.reason == "timeout" else "fail", err=float("nan"),
                        allowed=float("nan"), detail=lost.detail + (f"; at {where}" if where else ""), repro=repro,
                        **prov.__dict__)]


def stack_name(t) -> str:
    """A timed-out run's stack file name: the timeline's name (or family) and a hash of its id."""
    return f"{t.name or t.family}-{hashlib.sha1(base.case_id('timeline', t).encode()).hexdigest()[:10]}"


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (model family, path): timeline runs, passed and failed runs (a ``timeout`` run among the
    failed), checks, failed checks."""
    if frame.empty:
        return pd.DataFrame(columns=SUMMARY_COLS)
    f = frame.assign(failed=failing(frame["status"]))
    runs = f.groupby(RUN_KEY, sort=False)["failed"].any().groupby(SUMMARY_KEY, sort=False)
    out = runs.agg(runs="size", failed="sum").join(
        f.groupby(SUMMARY_KEY, sort=False)["failed"].agg(checks="size", failed_checks="sum")).reset_index()
    out["passed"] = out["runs"] - out["failed"]
    return out[SUMMARY_COLS].astype({c: int for c in SUMMARY_COLS[2:]})


def first_failures(frame: pd.DataFrame) -> pd.DataFrame:
    """The first failing check (row order: step, then layer) of every failing run, in run order."""
    bad = frame[failing(frame["status"])]
    return bad.drop_duplicates(RUN_KEY, keep="first").reset_index(drop=True)


def fail_line(r) -> str:
    """A failing run's headline: where its first failing check failed, and what it says."""
    return f"step {r['step']} ({r['mode']}) layer {r['layer']} [{r['check']}] {r['detail']}"
