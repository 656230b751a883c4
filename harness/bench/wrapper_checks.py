"""Host cost of the fused wrappers' argument checks (a tool, not a test and not a kernel benchmark).

    python -m harness.bench.wrapper_checks [--iters N] [--repeats R] [--csv PATH] [--baseline DIR]

Each public fused wrapper is timed eagerly, as a caller pays for it (host time per call, the device
synchronized at the end of every timed loop), on hot-path shapes: qk_norm_rope DeepSeek-V4 (H 16,
D 512, R 64) at T 5 / 64 / 1280 in target-verify and in decode with the ring store;
mla_fp8_prepare Kimi-K3 at B 64 x L 4 x H 64 (the wrapper and the backend step); verify_attention
GQA B 8 x L 4, H 16, D 256, prefix 4K, 8 splits (split-KV, shared-KV and the dispatcher). Columns:

  wrapper_us     the wrapper as it is (validate + allocate + launch, + can_handle where it has one)
  unchecked_us   the same call with the shared validators (``reference.<op>.validate`` and, for the
                 MLA step, ``validate_pool`` and ``validate_tensors``) replaced by a stub returning their result
  validate_us    the validators alone; checks_frac = (wrapper - unchecked) / wrapper
  *_syncs        host syncs of one call (CUDA: ``torch.cuda.set_sync_debug_mode``; -1 on the CPU)

``--baseline DIR`` runs this same script against the checkout in DIR (e.g. the commit before new
checks: ``git worktree add DIR <sha>``) in a subprocess, and prints the ratios of this tree's
times and syncs to DIR's. On the CPU the shapes shrink (the interpreter runs the kernels: the
times say only that the tool works).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from unittest import mock

import torch


@dataclass(frozen=True)
class Row:
    op: str
    wrapper: str  # the public function timed
    case: str
    wrapper_us: float  # median host time per call
    unchecked_us: float  # the same call, shared validators stubbed
    validate_us: float  # the shared validators alone
    checks_frac: float  # (wrapper - unchecked) / wrapper
    wrapper_syncs: int  # host syncs per call; -1: not counted (no CUDA)
    validate_syncs: int


@dataclass(frozen=True)
class Entry:
    op: str
    wrapper: str
    case: str
    build: Callable[[], dict]  # fresh keyword arguments of one call
    call: Callable[..., object]  # the wrapper
    validators: tuple[tuple[object, str, Callable[[dict], dict]], ...]  # (module, name, kw -> its arguments)


def entries(dev, small: bool) -> list[Entry]:
    """Every op's entries: ``wrapper_entries(dev, small)`` of its benchmark module (``OpSpec.bench``),
    in ``harness.ops.BUILTIN`` order."""
    import importlib

    from harness.ops import builtin_specs

    out = []
    for spec in builtin_specs().values():
        mod = importlib.import_module(spec.bench) if spec.bench else None
        if mod is not None and hasattr(mod, "wrapper_entries"):
            out += mod.wrapper_entries(dev, small)
    return out


# ----------------------------------------------------------------------------- measuring

def host_us(fn: Callable[[], object], sync: Callable[[], None], *, iters: int, repeats: int) -> float:
    """Median over ``repeats`` loops of ``iters`` calls of the host time per call, the device
    synchronized at the end of each loop (after one untimed call)."""
    fn()
    sync()
    loops = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        loops.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(loops)


def host_syncs(fn: Callable[[], object]) -> int:
    """Synchronizing CUDA operations in one call of ``fn`` (torch's sync debug mode); -1 without CUDA."""
    if not torch.cuda.is_available():
        return -1
    torch.cuda.synchronize()
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(before)
    return sum("synchroniz" in str(w.message) for w in seen)


def measure(e: Entry, sync, *, iters: int, repeats: int) -> Row:
    kw = e.build()
    wrapper = lambda: e.call(**kw)  # noqa: E731

    def validate():
        for mod, name, args in e.validators:
            getattr(mod, name)(**args(kw))

    results = [(mod, name, getattr(mod, name)(**args(kw))) for mod, name, args in e.validators]
    t_wrap = host_us(wrapper, sync, iters=iters, repeats=repeats)
    t_val = host_us(validate, sync, iters=iters, repeats=repeats)
    s_wrap, s_val = host_syncs(wrapper), host_syncs(validate)
    with _stubbed(results):
        t_bare = host_us(wrapper, sync, iters=iters, repeats=repeats)
    return Row(e.op, e.wrapper, e.case, t_wrap, t_bare, t_val, (t_wrap - t_bare) / t_wrap, s_wrap, s_val)


@contextlib.contextmanager
def _stubbed(results):
    """Each (module, name) replaced by a stub returning the given result, inside the with-block."""
    with contextlib.ExitStack() as stack:
        for mod, name, res in results:
            stack.enter_context(mock.patch.object(mod, name, lambda *_a, _res=res, **_k: _res))
        yield


def run(*, iters: int | None, repeats: int | None) -> tuple[list[Row], str]:
    from harness import devices

    dev = devices.select(os.environ.get("VP_DEVICE", "auto"))
    small = dev.interpreted
    iters = iters or (2 if small else 50)
    repeats = repeats or (1 if small else 7)
    rows = []
    for e in entries(dev, small):
        rows.append(measure(e, lambda: devices.synchronize(dev), iters=iters, repeats=repeats))
        r = rows[-1]
        print(f"  {r.wrapper:28s} {r.case:44s} wrapper {r.wrapper_us:9.1f} us  unchecked {r.unchecked_us:9.1f} us  "
              f"validate {r.validate_us:8.1f} us  checks {r.checks_frac:6.1%}  syncs {r.wrapper_syncs}/{r.validate_syncs}",
              flush=True)
    return rows, f"{dev.kind}:{dev.name} ({dev.arch}), iters {iters} x {repeats}"


def _baseline_rows(tree: Path, iters: int | None, repeats: int | None) -> list[dict]:
    """This script run against the checkout in ``tree`` (its reference/, fused/, cases/ and harness/)."""
    out = tree / ".wrapper_checks_baseline.json"
    argv = [str(Path(__file__).resolve()), "--json", str(out)] + \
        (["--iters", str(iters)] if iters else []) + (["--repeats", str(repeats)] if repeats else [])
    code = f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    print(f"baseline: {tree}", flush=True)
    subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, check=True)
    rows = json.loads(out.read_text())
    out.unlink()
    return rows


def report(rows: list[Row], base: list[dict] | None):
    import pandas as pd

    frame = pd.DataFrame([dataclasses.asdict(r) for r in rows])
    if base:
        b = pd.DataFrame(base)[["wrapper", "case", "wrapper_us", "validate_us", "wrapper_syncs", "validate_syncs"]]
        frame = frame.merge(b, on=["wrapper", "case"], how="left", suffixes=("", "_base"))
        frame["wrapper_x_base"] = frame["wrapper_us"] / frame["wrapper_us_base"]
        frame["validate_x_base"] = frame["validate_us"] / frame["validate_us_base"]
    return frame


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.wrapper_checks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, help="calls per timed loop (default 50 on a GPU, 2 on the CPU)")
    ap.add_argument("--repeats", type=int, help="timed loops; the median is reported (default 7 / 1)")
    ap.add_argument("--csv", type=Path, help="write the table here")
    ap.add_argument("--baseline", type=Path, help="a checkout to compare with (its own validators, same shapes)")
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)  # the rows, for a --baseline parent
    args = ap.parse_args(argv)
    base = _baseline_rows(args.baseline.resolve(), args.iters, args.repeats) if args.baseline else None
    rows, where = run(iters=args.iters, repeats=args.repeats)
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows]))
        return 0
    frame = report(rows, base)
    import pandas as pd

    shown = frame.drop(columns=["op"]).assign(checks_frac=frame["checks_frac"].map("{:.1%}".format))
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.2f}".format):
        print(f"wrapper checks on {where}")
        print(shown.to_string(index=False))
    total = frame[["wrapper_us", "unchecked_us"]].sum()
    print(f"all wrappers: {total.wrapper_us:.1f} us with checks, {total.unchecked_us:.1f} us without "
          f"(x{total.wrapper_us / total.unchecked_us:.3f})"
          + ("" if not base or math.isnan(frame["wrapper_us_base"].sum()) else
             f"; baseline {frame['wrapper_us_base'].sum():.1f} us (this tree x"
             f"{total.wrapper_us / frame['wrapper_us_base'].sum():.3f})"))
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(args.csv, index=False)
        print(f"-> {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
