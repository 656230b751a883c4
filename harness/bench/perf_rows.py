"""From timings to numbers, no GPU: ``Timing`` (one implementation's measurement at one shape), the
PerfRows of a shape (``perf_rows``: eager, and graph-replayed), the fused launch counts that are wrong
(``launch_failures``), the per-(op, impl, mode) ``summary`` and the per-shape ``table`` of ours against
every other implementation. Pure functions of the timings (``harness.bench.perf`` re-exports them)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from reports.rows import PerfRow, Provenance


@dataclass(frozen=True)
class Timing:
    p20_us: float
    p50_us: float
    p80_us: float
    launches: int  # kernels per call; -1 = not measured
    graph_us: float = math.nan  # median replayed from a CUDA graph; NaN = not measured (not asked, or no capture)


NOT_MEASURED = Timing(math.nan, math.nan, math.nan, -1)  # e.g. out of memory at this shape
MODES = ("eager", "graph")  # PerfRow.mode


def ratio(num: float, den: float) -> float:
    """num / den; NaN when either is missing or den is not positive."""
    return num / den if den > 0 and not math.isnan(num) else math.nan


def bandwidth(bytes_moved: int, us: float, copy_gbps: float) -> tuple[float, float]:
    """(GB/s, fraction of the measured copy bandwidth) of moving ``bytes_moved`` in ``us``."""
    gbps = ratio(bytes_moved / 1e9, us * 1e-6)
    return gbps, ratio(gbps, copy_gbps)


def perf_rows(op: str, case: str, timings: dict[str, Timing], *, bytes_moved: int, copy_gbps: float,
              prov: Provenance, graph: bool = False) -> list[PerfRow]:
    """One PerfRow per implementation of one shape (``mode`` eager: do_bench's p20/p50/p80), and with
    ``graph`` a second one per implementation (``mode`` graph: the graph-replayed median as p50, p20
    and p80 NaN; NaN throughout where it was not measured, never 0). Ratios are against the
    ``reference`` and ``compiled`` timings of the same shape and mode (> 1: this impl is faster);
    bandwidth counts the bytes the op must move, the same for every impl."""
    rows = []
    for mode in MODES[:2 if graph else 1]:
        p50 = {impl: (t.p50_us if mode == "eager" else t.graph_us) for impl, t in timings.items()}
        ref, comp = p50.get("reference", math.nan), p50.get("compiled", math.nan)
        for impl, t in timings.items():
            q20, q80 = (t.p20_us, t.p80_us) if mode == "eager" else (math.nan, math.nan)
            gbps, frac = bandwidth(bytes_moved, p50[impl], copy_gbps)
            rows.append(PerfRow(op=op, impl=impl, case=case, mode=mode, p20_us=q20, p50_us=p50[impl], p80_us=q80,
                                reference_p50_us=ref, compiled_p50_us=comp, speedup_vs_reference=ratio(ref, p50[impl]),
                                speedup_vs_compiled=ratio(comp, p50[impl]), gbps=gbps, frac_of_copy=frac,
                                launches=t.launches, **dataclasses.asdict(prov)))
    return rows


def launch_failures(rows: list[PerfRow], expected: dict[str, dict[str, int]]) -> list[str]:
    """``expected``: op -> {impl: launches}. One line per (op, impl, shape) that launched another count
    (its eager row: a graph row carries the same count, counted once per call)."""
    return [f"{r.op} {r.impl} {r.case}: {r.launches} kernel launches, expected {expected[r.op][r.impl]}"
            + (" (not measured)" if r.launches < 0 else "")
            for r in rows if r.mode == "eager" and r.impl in expected.get(r.op, {})
            and r.launches != expected[r.op][r.impl]]


def _geomean(x: pd.Series) -> float:
    x = x[x > 0]
    return float(np.exp(np.log(x).mean())) if len(x) else math.nan


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (op, impl, mode): shapes, median p50, geometric mean and minimum of both speedups, the
    best fraction of copy bandwidth, the launch counts seen."""
    g = frame.groupby(["op", "impl", "mode"], sort=False)
    return g.agg(shapes=("case", "size"), p50_us_median=("p50_us", "median"),
                 x_reference_geomean=("speedup_vs_reference", _geomean),
                 x_reference_min=("speedup_vs_reference", "min"),
                 x_compiled_geomean=("speedup_vs_compiled", _geomean),
                 x_compiled_min=("speedup_vs_compiled", "min"),
                 frac_of_copy_max=("frac_of_copy", "max"),
                 launches=("launches", lambda s: "/".join(str(v) for v in sorted(set(s))))).reset_index()


def table(frame: pd.DataFrame, ours_by_op: Mapping[str, tuple[str, ...]]) -> pd.DataFrame:
    """The summary table of a run, one line per (op, shape, impl of ours): its graph-replayed and
    eager p50 (``graph_us``, ``eager_us``), then per other impl of the same shape (the reference
    chain, torch.compile of it, the op's other baselines, external implementations) its p50 over
    ours under graph replay (``x_<impl>``) and eager (``x_<impl>_eager``): > 1 = ours faster, and
    ours' % of the copy bandwidth in both modes. NaN where a number was not measured (an op
    timed eager only has NaN graph columns: never 0, never the eager number)."""
    p50 = frame.pivot_table(index=["op", "case", "impl"], columns="mode", values="p50_us", aggfunc="first",
                            dropna=False, sort=False)
    pct = frame.pivot_table(index=["op", "case", "impl"], columns="mode", values="frac_of_copy", aggfunc="first",
                            dropna=False, sort=False) * 100
    p50, pct = (f.reindex(columns=list(MODES)) for f in (p50, pct))
    lines = []
    for (op, case), g in frame.groupby(["op", "case"], sort=False):
        impls = list(dict.fromkeys(g["impl"]))
        for impl in (i for i in impls if i in ours_by_op.get(op, ())):
            key = (op, case, impl)
            line = {"op": op, "case": case, "impl": impl, "graph_us": p50.loc[key, "graph"],
                    "eager_us": p50.loc[key, "eager"]}
            for other in (i for i in impls if i not in ours_by_op.get(op, ())):
                o = (op, case, other)
                line[f"x_{other}"] = ratio(p50.loc[o, "graph"], p50.loc[key, "graph"])
                line[f"x_{other}_eager"] = ratio(p50.loc[o, "eager"], p50.loc[key, "eager"])
            line.update(pct_copy_graph=pct.loc[key, "graph"], pct_copy_eager=pct.loc[key, "eager"])
            lines.append(line)
    t = pd.DataFrame(lines)
    if t.empty:
        return t
    head = ["op", "case", "impl", "graph_us", "eager_us"]
    xs = [c for c in t.columns if c.startswith("x_")]
    return t[head + sorted(xs, key=lambda c: (c.endswith("_eager"), _X_ORDER.get(c.removesuffix("_eager"), 9), c))
             + ["pct_copy_graph", "pct_copy_eager"]]


_X_ORDER = {"x_reference": 0, "x_compiled": 1}  # then the other impls by name


def print_table(t: pd.DataFrame) -> str:
    """``table``'s text: missing numbers print as ``missing``."""
    with pd.option_context("display.width", 250, "display.max_columns", 60, "display.float_format", "{:.3g}".format):
        return t.to_string(index=False, na_rep="missing")
