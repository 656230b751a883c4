"""The op benchmarks' driver: the run profile, one shape's measurement (every implementation timed
and its launches counted through ``harness.gpu.profiling``), the run plan with its wall-time estimate,
and the run that ``python -m harness.bench`` and each ``python -m cases.<op>.bench`` call. PerfRow
assembly and the summary (pure functions of the timings) are ``harness.bench.perf_rows``, the shapes'
and wide rows' shared parts ``harness.bench.wide_rows``.

An op benchmark module provides: ``OP``; ``IMPLS`` (the PerfRow impl names it measures, with
``reference`` = the unfused chain and ``compiled`` = torch.compile of it); ``EXPECTED_LAUNCHES``
(fused impl -> launches it must make, else the run exits 1); ``WARMUP_MS``, ``REP_MS`` (do_bench);
``EXTRA_TIMINGS`` (do_bench calls per shape beyond IMPLS); ``shapes(quick)`` (each with a
``case`` id); ``measurements(shapes, ctx)``, yielding one ``Measured`` per shape; ``wide_row(measured,
rows) -> (its wide row, the progress line)`` with ``rows`` the shape's PerfRows by impl; ``WIDE_CSV``,
the file in ``out`` its wide rows go to (``run_shapes``, the loop over its shapes); optionally
``finish(out, ctx)``, called after that file is written; optionally ``GRAPH_REP_MS`` (each impl also
timed replayed from a CUDA graph, ``profiling.graph_time_us``: its PerfRows come in pairs, ``mode``
eager and graph), ``PEERS`` (external impls measured beside IMPLS where they are installed, such as
SGLang's kernels; the plan's estimate counts them as installed), ``refused_peers()`` ({peer: the one line
saying what this machine lacks to run it}, printed with the plan, GPU or not; the op's own measurements leave
those peers out) and ``OURS`` (the impls that are ours, default the ``EXPECTED_LAUNCHES`` ones: the rows of
the summary table). ``main_for`` is each op's command line.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from harness import devices, usage
from harness.gpu import profiling
from harness.bench.perf_rows import NOT_MEASURED, Timing, launch_failures, perf_rows, print_table, summary, table
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
# + 15 for qk_norm_rope's graph-replayed timings and SGLang's kernel beside them (4 shapes x 4, modelled 13 s)
# + 5 for verify_accept's graph-replayed timings (3 shapes x 3 impls, modelled 5 s)
# + 15 for verify_tree_accept's 2 shapes x 3 implementations (modelled 11 s)
# + 15 for spec_sampling's 2 shapes x 6 implementations, vLLM's and SGLang's samplers among them (modelled 13 s; its
# inputs' fp64 boundary clearing, not modelled, adds a few seconds at B 256); mla_fp8_prepare's peer SGLang's JIT
# CUDA kernel (4 shapes x 1, modelled 4 s) fits in what was left (its cold JIT build is not modelled: ~20 s)
QUICK_BUDGET_S = 180.0
# the full set (the nightly runs --quick) must stay near 7 min: 310 = 300 + the shared-KV single-dot variant's 24 shapes x
# (one timing + one profiler session), modelled 10 s (verify_attention's fused-shared-kv-bf16p, beside fused-shared-kv);
# + 50 for verify_accept's 9 shapes x 3 implementations (modelled 48 s; 25 s on the H200 on 2026-12-01)
# + 25 for mla_fp8_prepare's graph-replayed timings (12 shapes x 4 impls, modelled 25 s)
# + 45 for qk_norm_rope's graph-replayed timings and SGLang's kernel (12 shapes x 4, modelled 32 s) and
# verify_attention's two SGLang peers, now in the model (24 shapes x 2, modelled 21 s)
# + 15 for verify_accept's graph-replayed timings (9 shapes x 3 impls, modelled 14 s)
# + 50 for verify_tree_accept's 9 shapes x 3 implementations (modelled 48 s)
# + 75 for spec_sampling's 12 shapes x 6 implementations, vLLM's and SGLang's samplers among them (modelled 79 s)
# + 15 for mla_fp8_prepare's peer SGLang's JIT CUDA kernel (12 shapes x 1, modelled 12 s; its JIT build, a
# first call outside the model, is logged apart: ~20 s cold, a load from the cache warm)
FULL_BUDGET_S = 585.0


@dataclass(frozen=True)
class BenchProfile:
    name: str  # the provenance profile of every row
    quick: bool


QUICK = BenchProfile("bench-quick", quick=True)
FULL = BenchProfile("bench-full", quick=False)


def profile_for(quick: bool) -> BenchProfile:
    return QUICK if quick else FULL


@dataclass(frozen=True)
class Context:
    dev: devices.Device
    prov: Provenance
    copy_gbps: float  # measured device-to-device copy bandwidth (read + write)
    sms: int  # streaming multiprocessors / compute units (split-KV sizing)


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
    left NaN). Out of memory, or any error of the call -> NOT_MEASURED, said in one line."""
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
        except Exception as exc:  # noqa: BLE001 - e.g. torch.compile's own codegen failing at one shape
            # the other columns are still worth having; ours failing fails the bench (launch_failures)
            print(f"  {name}: failed, not measured ({type(exc).__name__}: "
                  f"{(str(exc).strip().splitlines() or [''])[-1][:200]})", flush=True)
            out[name] = NOT_MEASURED
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
    from harness.parity.suite import provenance

    dev = devices.select("auto")
    return Context(dev=dev, prov=provenance(dev, profile, seed), copy_gbps=profiling.copy_bandwidth_gbps(),
                   sms=torch.cuda.get_device_properties(0).multi_processor_count)


# ----------------------------------------------------------------------------- one op's run

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


def main_for(mod, argv: list[str] | None, *, quick_help: str, options: Mapping[str, str] = {},
             pick: Callable[[argparse.Namespace, argparse.ArgumentParser], list] | None = None) -> int:
    """``python -m cases.<op>.bench --out DIR [--quick]``: ``run_ops`` on that op alone, its CSVs in
    DIR. ``options``: its own repeatable int flags -> their help; ``pick(args, parser)``: the shapes
    they select (default: the profile's)."""
    ap = usage.ArgumentParser(prog=f"python -m cases.{mod.OP}.bench", description=mod.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help=f"directory for {mod.WIDE_CSV} and perf.csv")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    for flag, text in options.items():
        ap.add_argument(flag, type=usage.positive_int, action="append", help=text)
    args = ap.parse_args(argv)
    return run_ops([mod], out=args.out, quick=args.quick, nested=False, prog=ap.prog,
                   shapes=None if pick is None else {mod.OP: pick(args, ap)})


# ----------------------------------------------------------------------------- plan and driver

def estimate_s(mod, shapes: list) -> float:
    """Modelled wall time of one op's run over ``shapes`` (see COMPILE_S)."""
    per_timing = DO_BENCH_OVERHEAD * (mod.WARMUP_MS + mod.REP_MS) / 1e3 + 0.05
    timed = len(mod.IMPLS) + len(getattr(mod, "PEERS", ()))  # peers: modelled as installed
    graph = timed * graph_timing_s(mod.GRAPH_REP_MS) if hasattr(mod, "GRAPH_REP_MS") else 0.0
    return len(shapes) * (COMPILE_S + (timed + mod.EXTRA_TIMINGS) * per_timing + timed * PROFILER_S + graph)


def graph_timing_s(rep_ms: int) -> float:
    """Modelled seconds of one ``profiling.graph_time_us(rep=rep_ms)``: do_bench_cudagraph replays a
    graph of ~rep_ms of calls 10 times, after capturing it (GRAPH_CAPTURE_S)."""
    return 11 * rep_ms / 1e3 + GRAPH_CAPTURE_S


def plan_lines(mods: list, shapes: dict[str, list]) -> list[str]:
    lines = [f"  {m.OP}: {len(shapes[m.OP])} shapes x {len(m.IMPLS)} impls ({', '.join(m.IMPLS)})"
             + (f" + peers where they run ({', '.join(m.PEERS)})" if getattr(m, "PEERS", ()) else "")
             + f", do_bench {m.WARMUP_MS}+{m.REP_MS} ms"
             + (f" + graph replay {m.GRAPH_REP_MS} ms" if hasattr(m, "GRAPH_REP_MS") else " (eager only)")
             + f", ~{estimate_s(m, shapes[m.OP]):.0f} s" for m in mods]
    total = sum(estimate_s(m, shapes[m.OP]) for m in mods)
    refused = [f"  {m.OP}: {peer} refused on this machine: {why}"
               for m in mods if hasattr(m, "refused_peers") for peer, why in m.refused_peers().items()]
    return lines + [f"  modelled total ~{total:.0f} s on an H200 (plus start-up)"] + refused


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
