"""What the op benchmarks share: the run profile, one shape's measurement (every implementation
timed and its launches counted through ``harness.profiling``), PerfRow assembly and the summary
(pure functions of the timings), the run plan with its wall-time estimate, and the driver that
``python -m harness.bench`` and each ``python -m harness.bench.<op>`` call.

An op benchmark module provides: ``OP``; ``IMPLS`` (the PerfRow impl names it measures, with
``reference`` = the unfused chain and ``compiled`` = torch.compile of it); ``EXPECTED_LAUNCHES``
(fused impl -> launches it must make, else the run exits 1); ``WARMUP_MS``, ``REP_MS`` (do_bench);
``EXTRA_TIMINGS`` (do_bench calls per shape beyond IMPLS); ``shapes(quick)`` (each with a
``case`` id); ``measurements(shapes, ctx)``, yielding one ``Measured`` per shape; ``wide_row(measured,
rows) -> (its wide row, the progress line)`` with ``rows`` the shape's PerfRows by impl; ``WIDE_CSV``,
the file in ``out`` its wide rows go to (``run_shapes``, the loop over its shapes); optionally
``finish(out, ctx)``, called after that file is written; optionally ``GRAPH_REP_MS`` (each impl also
timed replayed from a CUDA graph, ``profiling.graph_time_us``: its PerfRows come in pairs, ``mode``
eager and graph) and ``OURS`` (the impls that are ours, default the ``EXPECTED_LAUNCHES`` ones: the
rows of the summary table). ``main_for`` is each op's command line.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch


@dataclass(frozen=True)
class VerifyShape:
    """A verify batch of the prepare benchmarks: B requests × L tokens (3 drafts + 1 bonus), H local
    q heads; ``suffix`` completes the case id (e.g. ",D=512")."""
    B: int  # requests
    H: int  # local q heads
    L: int = 4
    suffix: str = ""

    @property
    def T(self) -> int:
        return self.B * self.L

    @property
    def case(self) -> str:
        return f"B={self.B},L={self.L},H={self.H}{self.suffix}"

from harness import devices, profiling
from reports.rows import PerfRow, Provenance, write_csv

NO_GPU = ("no GPU visible to torch (torch.cuda.is_available() is False): nothing was measured and no perf.csv "
          "was written. These benchmarks time compiled kernels on a GPU; timings under the Triton interpreter "
          "mean nothing.")

# Wall-time model of a run on an H200 (the budget test and the plan printed without a GPU).
# Guesses on the safe side, to be replaced by measured numbers: one torch.compile graph (one per
# shape: dynamic=False), one torch.profiler session (count_launches), do_bench's own overhead.
COMPILE_S = 4.0
PROFILER_S = 0.3
DO_BENCH_OVERHEAD = 1.3
GRAPH_CAPTURE_S = 0.3  # capturing ~rep_ms of calls into one graph (thousands of launches) and its warm-up
# --quick must stay well under 3 min: start-up and slow calls get the rest. 130 = 120 + mla_fp8_prepare's
# graph-replayed timings (4 shapes x 4 impls, modelled 8 s by graph_timing_s)
QUICK_BUDGET_S = 130.0
# the nightly's full set must stay under ~6 min: 310 = 300 + the shared-KV single-dot variant's 24 shapes x
# (one timing + one profiler session), modelled 10 s (verify_attention's fused-shared-kv-bf16p, beside fused-shared-kv);
# + 50 for verify_accept's 9 shapes x 3 implementations (modelled 48 s; 25 s on the H200 on 2026-12-01)
# + 25 for mla_fp8_prepare's graph-replayed timings (12 shapes x 4 impls, modelled 25 s)
FULL_BUDGET_S = 385.0


@dataclass(frozen=True)
class BenchProfile:
    name: str  # the provenance profile of every row
    quick: bool


QUICK = BenchProfile("bench-quick", quick=True)
FULL = BenchProfile("bench-full", quick=False)


def profile_for(quick: bool) -> BenchProfile:
    return QUICK if quick else FULL


@dataclass(frozen=True)
class Timing:
    p20_us: float
    p50_us: float
    p80_us: float
    launches: int  # kernels per call; -1 = not measured
    graph_us: float = math.nan  # median replayed from a CUDA graph; NaN = not measured (not asked, or no capture)


NOT_MEASURED = Timing(math.nan, math.nan, math.nan, -1)  # e.g. out of memory at this shape
MODES = ("eager", "graph")  # PerfRow.mode


@dataclass(frozen=True)
class Context:
    dev: devices.Device
    prov: Provenance
    copy_gbps: float  # measured device-to-device copy bandwidth (read + write)
    sms: int  # streaming multiprocessors / compute units (split-KV sizing)


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
    """``expected``: op -> {impl: launches}. One line per row that launched another count."""
    return [f"{r.op} {r.impl} {r.case}: {r.launches} kernel launches, expected {expected[r.op][r.impl]}"
            + (" (not measured)" if r.launches < 0 else "")
            for r in rows if r.impl in expected.get(r.op, {}) and r.launches != expected[r.op][r.impl]]


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


def compile_static(fn: Callable) -> Callable:
    """torch.compile(fn, dynamic=False): one graph per benchmarked shape. Past dynamo's default
    recompile limit (8) it silently runs eager and the 'compiled' column would time the eager
    chain (seen on the H200), so the limits are raised first."""
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, 256)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 1024)
    return torch.compile(fn, dynamic=False)


def measure(impls: dict[str, Callable[[], object]], dev: devices.Device, *, warmup_ms: int, rep_ms: int,
            graph_rep_ms: int | None = None) -> dict[str, Timing]:
    """Each zero-argument callable: one call outside the timed region (compile, autotune, lazy
    allocations), then p20/p50/p80 and its kernel launches; with ``graph_rep_ms`` also its median
    replayed from a CUDA graph (``Timing.graph_us``; a callable that cannot be captured is said and
    left NaN). Out of memory -> NOT_MEASURED."""
    out = {}
    for name, fn in impls.items():
        try:
            fn()
            devices.synchronize(dev)
            p20, p50, p80 = profiling.time_quantiles_us(fn, warmup=warmup_ms, rep=rep_ms)
            out[name] = Timing(p20, p50, p80, profiling.count_launches(fn, warmup=0))
        except torch.OutOfMemoryError:
            print(f"  {name}: out of memory, not measured", flush=True)
            out[name] = NOT_MEASURED
            torch.cuda.empty_cache()
            continue
        if graph_rep_ms is not None:
            try:
                out[name] = dataclasses.replace(out[name], graph_us=profiling.graph_time_us(fn, rep=graph_rep_ms))
            except Exception as exc:  # noqa: BLE001 - a sync or a host-side step in the call: not capturable
                print(f"  {name}: no graph timing ({type(exc).__name__}: {str(exc)[:160]})", flush=True)
                devices.synchronize(dev)
    return out


def context(profile: BenchProfile, seed: int = 0) -> Context:
    """The GPU, the provenance every row carries (as parity rows build it) and the copy roof."""
    from harness.suite import provenance

    dev = devices.select("auto")
    return Context(dev=dev, prov=provenance(dev, profile, seed), copy_gbps=profiling.copy_bandwidth_gbps(),
                   sms=torch.cuda.get_device_properties(0).multi_processor_count)


# ----------------------------------------------------------------------------- one op's run

@dataclass(frozen=True)
class Measured:
    """One shape of an op's run: its timings per impl, the bytes the op must move there, and what
    else the op's wide row needs (``extra``: numbers, no tensors)."""
    shape: Any  # has a ``case`` id
    timings: dict[str, Timing]
    bytes_moved: int
    extra: Mapping[str, Any] = field(default_factory=dict)


# the columns fused_vs_chain fills, in a wide row's order (the *_us: p50)
FUSED_VS_CHAIN_COLUMNS = (("fused_us", float), ("reference_us", float), ("compiled_us", float),
                          ("reference_over_fused", float), ("compiled_over_fused", float), ("fused_gbps", float),
                          ("fused_frac_of_copy", float), ("fused_launches", int), ("reference_launches", int),
                          ("compiled_launches", int))


def wide_row_type(module: str, shape_columns: tuple, own_columns: tuple) -> type:
    """The frozen dataclass ``BenchRow`` of ``module``'s wide rows: ``shape_columns`` ((name, type)
    pairs), then ``FUSED_VS_CHAIN_COLUMNS``, then ``own_columns``."""
    return dataclasses.make_dataclass("BenchRow", [*shape_columns, *FUSED_VS_CHAIN_COLUMNS, *own_columns],
                                      frozen=True, namespace={"__module__": module})


def fused_vs_chain(m: Measured, fused: PerfRow) -> dict:
    """The wide-row columns every op has: the fused impl's p50, ratios, bandwidth and launches beside
    the reference chain's and torch.compile's."""
    t = m.timings
    return dict(fused_us=t["fused"].p50_us, reference_us=t["reference"].p50_us, compiled_us=t["compiled"].p50_us,
                reference_over_fused=fused.speedup_vs_reference, compiled_over_fused=fused.speedup_vs_compiled,
                fused_gbps=fused.gbps, fused_frac_of_copy=fused.frac_of_copy, fused_launches=t["fused"].launches,
                reference_launches=t["reference"].launches, compiled_launches=t["compiled"].launches)


def fused_line(m: Measured, fused: PerfRow) -> str:
    """The progress line's head: the fused p50, its share of the copy roof, its ratios to the chain
    and to torch.compile."""
    return (f"fused {fused.p50_us:7.2f} us (launches {fused.launches}, {fused.frac_of_copy:5.1%} of copy) | "
            f"x{fused.speedup_vs_reference:5.2f} vs reference (launches {m.timings['reference'].launches}) | "
            f"x{fused.speedup_vs_compiled:5.2f} vs compiled")


def run_shapes(mod, shape_list: list, ctx: Context, out: Path) -> list[PerfRow]:
    """One op's run: per shape of ``mod.measurements`` its PerfRows (eager, and graph-replayed where
    ``mod`` has ``GRAPH_REP_MS``) and a progress line; its wide rows (``mod.wide_row``, given the
    shape's eager rows by impl) to ``out / mod.WIDE_CSV``, then ``mod.finish(out, ctx)`` where it has one."""
    rows, wide = [], []
    for m in mod.measurements(shape_list, ctx):
        new = perf_rows(mod.OP, m.shape.case, m.timings, bytes_moved=m.bytes_moved, copy_gbps=ctx.copy_gbps,
                        prov=ctx.prov, graph=hasattr(mod, "GRAPH_REP_MS"))
        rows += new
        row, line = mod.wide_row(m, {r.impl: r for r in new if r.mode == "eager"})
        wide.append(row)
        print(f"  {m.shape.case}: {line}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([dataclasses.asdict(r) for r in wide]).to_csv(out / mod.WIDE_CSV, index=False)
    if hasattr(mod, "finish"):
        mod.finish(out, ctx)
    print(f"  wrote {out / mod.WIDE_CSV}")
    return rows


def ours(mod) -> tuple[str, ...]:
    """The impls of ``mod`` that are this project's kernels: ``mod.OURS``, else its ``EXPECTED_LAUNCHES``."""
    return tuple(getattr(mod, "OURS", mod.EXPECTED_LAUNCHES))


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


def main_for(mod, argv: list[str] | None, *, quick_help: str, options: Mapping[str, str] = {},
             pick: Callable[[argparse.Namespace, argparse.ArgumentParser], list] | None = None) -> int:
    """``python -m harness.bench.<op> --out DIR [--quick]``: ``run_ops`` on that op alone, its CSVs in
    DIR. ``options``: its own repeatable int flags -> their help; ``pick(args, parser)``: the shapes
    they select (default: the profile's)."""
    ap = argparse.ArgumentParser(prog=f"python -m harness.bench.{mod.OP}", description=mod.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help=f"directory for {mod.WIDE_CSV} and perf.csv")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    for flag, text in options.items():
        ap.add_argument(flag, type=int, action="append", help=text)
    args = ap.parse_args(argv)
    return run_ops([mod], out=args.out, quick=args.quick, nested=False, prog=ap.prog,
                   shapes=None if pick is None else {mod.OP: pick(args, ap)})


# ----------------------------------------------------------------------------- plan and driver

def estimate_s(mod, shapes: list) -> float:
    """Modelled wall time of one op's run over ``shapes`` (see COMPILE_S)."""
    per_timing = DO_BENCH_OVERHEAD * (mod.WARMUP_MS + mod.REP_MS) / 1e3 + 0.05
    graph = len(mod.IMPLS) * graph_timing_s(mod.GRAPH_REP_MS) if hasattr(mod, "GRAPH_REP_MS") else 0.0
    return len(shapes) * (COMPILE_S + (len(mod.IMPLS) + mod.EXTRA_TIMINGS) * per_timing + len(mod.IMPLS) * PROFILER_S
                          + graph)


def graph_timing_s(rep_ms: int) -> float:
    """Modelled seconds of one ``profiling.graph_time_us(rep=rep_ms)``: do_bench_cudagraph replays a
    graph of ~rep_ms of calls 10 times, after capturing it (GRAPH_CAPTURE_S)."""
    return 11 * rep_ms / 1e3 + GRAPH_CAPTURE_S


def plan_lines(mods: list, shapes: dict[str, list]) -> list[str]:
    lines = [f"  {m.OP}: {len(shapes[m.OP])} shapes x {len(m.IMPLS)} impls ({', '.join(m.IMPLS)}), "
             f"do_bench {m.WARMUP_MS}+{m.REP_MS} ms"
             + (f" + graph replay {m.GRAPH_REP_MS} ms" if hasattr(m, "GRAPH_REP_MS") else " (eager only)")
             + f", ~{estimate_s(m, shapes[m.OP]):.0f} s" for m in mods]
    total = sum(estimate_s(m, shapes[m.OP]) for m in mods)
    return lines + [f"  modelled total ~{total:.0f} s on an H200 (plus start-up)"]


def run_ops(mods: list, *, out: Path, quick: bool, nested: bool, shapes: dict[str, list] | None = None,
            prog: str = "harness.bench") -> int:
    """Run each op's benchmark; write ``out/perf.csv`` (all ops' PerfRows), ``out/table.csv`` (``table``,
    also printed) and each op's own CSV (in ``out/<op>/`` when ``nested``, else in ``out``). Exit status: 1 when a fused impl made
    another number of launches than it must, else 0 — also without a GPU, after saying so."""
    shapes = {m.OP: (shapes or {}).get(m.OP) or m.shapes(quick) for m in mods}
    plan = plan_lines(mods, shapes)
    if not devices.gpu_present():
        print(f"{prog}: {NO_GPU}")
        print("would run:", *plan, sep="\n")
        return 0
    ctx = context(profile_for(quick))
    print(f"{prog}: {ctx.dev.name} ({ctx.dev.arch}, {ctx.sms} SMs), torch {ctx.prov.torch}, triton {ctx.prov.triton}, "
          f"git {ctx.prov.git_sha}; copy bandwidth {ctx.copy_gbps:.0f} GB/s", *plan, sep="\n", flush=True)
    rows: list[PerfRow] = []
    for m in mods:
        t0 = time.monotonic()
        print(f"[{m.OP}] {len(shapes[m.OP])} shapes", flush=True)
        rows += run_shapes(m, shapes[m.OP], ctx, out / m.OP if nested else out)
        print(f"[{m.OP}] done in {time.monotonic() - t0:.0f} s", flush=True)
    path = write_csv(rows, out / "perf.csv")
    frame = pd.DataFrame([dataclasses.asdict(r) for r in rows])
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.3g}".format):
        print(summary(frame).to_string(index=False))
    t = table(frame, {m.OP: ours(m) for m in mods})
    t.to_csv(out / "table.csv", index=False)
    print(f"\nours per shape (graph = replayed from a CUDA graph; x_<impl> = its p50 / ours, > 1: ours faster; "
          f"% of copy = of {ctx.copy_gbps:.0f} GB/s):", print_table(t), sep="\n")
    print(f"{len(rows)} perf rows -> {path}; the table -> {out / 'table.csv'}")
    bad = launch_failures(rows, {m.OP: m.EXPECTED_LAUNCHES for m in mods})
    for line in bad:
        print("FAIL", line)
    return 1 if bad else 0
