"""Compile every Triton kernel variant a parity plan launches, once, up front, in parallel processes.

    python -m harness warmup --device cuda --profile nightly --generated 1700 [--op OP] [--kind KIND]
                             [--impl NAME|module:attr] [--shard i/n] [--case TEXT] [--jobs N]

The plan is the one ``python -m harness run`` makes from the same arguments. A cold run compiles
each variant the first time one of its cases launches it, inside that case's time and again in
every worker process. Triton specialises a kernel on more than its constexprs (argument dtypes,
integers equal to 1 or divisible by 16, 16-byte pointer alignment), so a case's shape does not say
which variant it needs; the variants are found the way Triton finds them:

  collect  every planned case's inputs are built and each selected implementation is called as the
           parity run calls it (fresh inputs; then caller-provided outputs) while Triton's
           ``jit_cache_hook`` answers "skip": nothing is compiled or launched, and each variant's
           specialization (Triton's own cache key; the serialized signature, constexprs,
           attributes and options) is recorded. Cases are spread over ``--jobs`` processes.
  compile  each distinct variant is compiled once by ``JITFunction.preload`` (the JIT's own
           compile path), the variants spread over ``--jobs`` processes. The binaries land in
           Triton's cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``): a run's first launch
           of a variant then reads it from there (milliseconds) instead of compiling it.

Implementations of kind ``reference`` (torch only) and ``compiled`` (torch.compile: inductor has
its own kernels and cache) are not called. Under the interpreter there is nothing to compile.
``--target sm90|gfx942|gfx950`` is a dry run for a GPU this machine lacks (the CPU tests use it):
inputs on the CPU, kernels compiled for that target; whether a real GPU's runs then hit those cache
entries depends on an identical toolchain.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

from harness.gpu.warmup_worker import Variant, collect, compile_variant, dry_device, init_worker

LINE = "warmup: compiled"  # harness.nightly.run reads the summary line that starts with this
SKIP_KINDS = ("reference", "compiled")
CASES_PER_TASK = 20
TASK_TIMEOUT_S = 900.0


def _params(v: Variant) -> dict[str, str]:
    """param -> how this variant specialises it: a constexpr's value, an int's or pointer's type with
    ``D`` (divisible by 16) or ``1`` (Triton's specialisation marks), from the JIT's key."""
    import ast
    import json

    names = list(json.loads(v.data)["signature"])
    try:
        spec = ast.literal_eval(v.key[: v.key.rindex("]{") + 1])
    except (ValueError, SyntaxError):
        return {}
    return {n: (repr(x[1]) if x[0] == "constexpr" else f"{x[0]}{'/' + str(x[1]) if x[1] else ''}")
            for n, x in zip(names, spec)}


def describe(variants: list[Variant]) -> "pd.DataFrame":
    """Per kernel: its variants and the parameters whose specialisation differs between them (with
    how many distinct values each takes): what multiplies a kernel's compiles."""
    import pandas as pd

    rows = []
    by: dict[str, list[dict]] = {}
    for v in variants:
        by.setdefault(v.kernel, []).append(_params(v))
    for kernel, ps in sorted(by.items()):
        names = list(dict.fromkeys(n for p in ps for n in p))
        vary = {n: sorted({p.get(n, "?") for p in ps}) for n in names}
        text = " ".join(f"{n}({len(vals)}: {','.join(vals)[:40]})" for n, vals in vary.items() if len(vals) > 1)
        rows.append(dict(kernel=kernel.rsplit(".", 1)[-1], variants=len(ps), varies=text))
    return pd.DataFrame(rows, columns=["kernel", "variants", "varies"])


def plan_tasks(reg, ops, impls, profile, *, seed=0, generated=None, shard_spec=None, case_filter=None,
               interpreted=False) -> list[tuple]:
    """(op, impl keys, cases) chunks of the parity plan of ``harness.parity.suite.run`` with the same arguments:
    each ``big`` catalog case a task of its own, every op's big ones first, then the other cases in
    chunks of ``CASES_PER_TASK``. Workers take tasks in this order, so the longest start first: a big
    case's inputs take seconds to draw (a verify_attention case of B 32 x prefix 32K about 10 s on
    the H200 host), and 20 of them in one chunk made that chunk 35 of the collect's 56 s (2026-12-01)."""
    from cases import base
    from harness.parity import suite

    big, rest = [], []
    for op in ops:
        keys = [i.key for i in impls if i.op == op and i.kind not in SKIP_KINDS]
        if not keys:
            continue
        spec = reg.ops[op]
        key = functools.partial(base.case_id, spec.name)
        small = {key(c) for c in spec.catalog(big=False)}
        planned = suite.shard(suite.plan_cases(spec, profile, seed=seed, generated=generated,
                                               interpreted=interpreted), shard_spec)
        cases = [p.case for p in planned if not case_filter or case_filter in p.display or case_filter in p.full_id]
        heavy_ids = {key(c) for c in spec.catalog(big=profile.big)} - small
        heavy = [c for c in cases if key(c) in heavy_ids]
        light = [c for c in cases if key(c) not in heavy_ids]
        big += [(op, keys, [c]) for c in heavy]
        rest += [(op, keys, light[i:i + CASES_PER_TASK]) for i in range(0, len(light), CASES_PER_TASK)]
    return big + rest


def run(tasks: list[tuple], jobs: int, dev, *, plugin_specs=(), target: str | None = None, progress=print,
        list_only: bool = False) -> int:
    """Collect, then compile (not with ``list_only``); prints per-kernel counts, what varies between a
    kernel's variants, and the summary line. 1 when a variant failed to compile or a task was lost."""
    import pandas as pd

    from harness import pool

    init = dict(initializer=init_worker, initargs=(dev.kind, dev.fp8_format, tuple(plugin_specs), target),
                timeout_s=TASK_TIMEOUT_S, isolate=True)
    t0 = time.time()
    variants: dict[tuple, Variant] = {}
    errors, lost, spent = [], [], []
    for k, res in pool.run(collect, tasks, jobs, name=lambda t: f"warmup-collect-{t[0]}", **init):
        if isinstance(res, pool.Lost):
            lost.append(f"collect {tasks[k][0]} ({len(tasks[k][2])} cases): {res.detail}")
            continue
        for v in res[0]:
            variants.setdefault((v.module, v.qualname, v.key), v)
        errors += res[1]
        spent.append(dict(op=tasks[k][0], cases=len(tasks[k][2]), **res[2]))
    collect_s = time.time() - t0
    n_cases = sum(len(t[2]) for t in tasks)
    progress(f"warmup: {len(variants)} kernel variants in {n_cases} cases ({collect_s:.1f} s to collect, "
             f"{jobs} processes)" + (f"; {len(errors)} calls raised (first: {errors[0]})" if errors else ""))
    if spent:  # where the collect's time went: the rest of its wall time is worker start-up and idling
        per = pd.DataFrame(spent).assign(slowest_task_s=lambda f: f["inputs"] + f["calls"]).groupby("op").agg(
            cases=("cases", "sum"), inputs_s=("inputs", "sum"), calls_s=("calls", "sum"),
            slowest_task_s=("slowest_task_s", "max")).reset_index()
        progress("  collect, summed over processes:\n" + per.to_string(index=False, float_format="{:.1f}".format))
    todo = sorted(variants.values(), key=lambda v: (v.kernel, v.key))
    for _, r in describe(todo).iterrows():
        progress(f"  {r['kernel']}: {r['variants']} variants; varies: {r['varies'] or '-'}")
    if list_only:
        return 1 if lost else 0
    t1 = time.time()
    done = []
    for k, res in pool.run(compile_variant, todo, jobs, name=lambda v: f"warmup-compile-{v.qualname}", **init):
        v = todo[k]
        if isinstance(res, pool.Lost):
            done.append(dict(kernel=v.kernel, seconds=res.seconds, error=res.detail))
        else:
            done.append(dict(kernel=v.kernel, seconds=res[0], error=res[1]))
    compile_s = time.time() - t1
    frame = pd.DataFrame(done, columns=["kernel", "seconds", "error"])
    if len(frame):
        per = frame.assign(failed=frame["error"] != "").groupby("kernel").agg(
            variants=("seconds", "size"), failed=("failed", "sum"), compile_s=("seconds", "sum")).reset_index()
        progress(per.to_string(index=False, float_format="{:.1f}".format))
    for _, r in frame[frame["error"] != ""].head(20).iterrows():
        progress(f"FAIL warmup {r['kernel']}: {r['error']}")
    for line in lost:
        progress(f"FAIL warmup {line}")
    from triton import knobs

    ok = int((frame["error"] == "").sum())
    progress(f"{LINE} {ok}/{len(frame)} kernel variants in {compile_s:.1f} s wall ({frame['seconds'].sum():.1f} s "
             f"summed over processes); collect {collect_s:.1f} s; cache {knobs.cache.dir}")
    return 1 if ok < len(frame) or lost else 0


def main(argv: list[str] | None = None) -> int:
    from cases import profiles
    from harness import usage
    from harness.gpu import compile as compile_check
    from harness.ops import BUILTIN

    ap = usage.ArgumentParser(prog="python -m harness warmup", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "rocm"))
    ap.add_argument("--target", default=None, choices=sorted(compile_check.TARGETS),
                    help="dry run: compile for this target from a machine without it (inputs on the CPU)")
    ap.add_argument("--impl", action="append", help="as for `run`: a name, or module:attr to load one (repeatable)")
    ap.add_argument("--op", action="append", choices=BUILTIN)
    ap.add_argument("--kind", action="append", choices=("fused", "external", "mutant"),
                    help="implementation kinds to warm up (default: fused, external: what `run` and nightly run)")
    ap.add_argument("--profile", default=None, choices=sorted(profiles.PROFILES), help="default: $VP_PROFILE or ci")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--generated", type=usage.count, default=None, help="as for `run`: generated cases per op")
    ap.add_argument("--shard", type=usage.shard, default=None, metavar="I/N",
                    help="i/n: the i-th of n deterministic slices, as for `run`")
    ap.add_argument("--case", default=None, help="only cases whose id contains this text")
    ap.add_argument("--jobs", type=usage.at_least(1), default=min(os.cpu_count() or 1, 16),
                    help="processes (default: cores, max 16)")
    ap.add_argument("--list", action="store_true",
                    help="collect only: print the variants per kernel and what varies between them, compile nothing")
    return usage.guarded(ap.prog, _warm, ap.parse_args(argv))


def _warm(args) -> int:
    """``main`` after its arguments are parsed (a usage error found here is one line, exit 2)."""
    from harness.cli import setup as cli_setup

    if args.target:
        args.device = "cpu"  # the parent only plans; the workers pretend to be the target
    dev, prof, reg = cli_setup.setup(args)
    if args.target:
        dev = dry_device(args.target)
    ops, impls = cli_setup.select_impls(reg, args, ("fused", "external"))  # a bad --impl is refused everywhere
    if not args.target and dev.interpreted:
        print("warmup: the Triton interpreter compiles nothing (no GPU); nothing to do")
        return 0
    tasks = plan_tasks(reg, ops, impls, prof, seed=args.seed, generated=args.generated, shard_spec=args.shard,
                       case_filter=args.case, interpreted=False)
    print(f"verify-parity warmup: device={dev.kind} ({dev.name}, {dev.arch}) profile={prof.name} "
          f"ops={','.join(ops)} impls={','.join(i.key for i in impls if i.kind not in SKIP_KINDS)} jobs={args.jobs}",
          flush=True)
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return run(tasks, args.jobs, dev, plugin_specs=cli_setup.plugin_specs(args), target=args.target,
                   progress=lambda m: print(m, flush=True), list_only=args.list)
    except KeyboardInterrupt:  # a time limit: what compiled is in the cache
        print("warmup: interrupted; the variants compiled so far are in the cache", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
