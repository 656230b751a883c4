"""The report (the class × op table of outcomes, one repro line per failure) and the command
line, ``python -m harness.fuzz``."""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from harness import usage
from harness.fuzz.args import OPS
from harness.fuzz.call import OUTCOMES
from harness.fuzz.runner import DEFAULT_TIMEOUT_S, Result, run, worker_main
from harness.fuzz.strategies import CLASSES, Job, expand_classes, plan


def table(results: list[Result | None], jobs: list[Job]) -> "pandas.DataFrame":  # noqa: F821
    """class → op → outcome counts (plus skipped), one row per (class, op)."""
    import pandas as pd

    rows = [{"class": j.cls, "op": j.op, "expect": CLASSES[j.cls].expected(j.op),
             "outcome": r.outcome if r is not None else "skipped"} for j, r in zip(jobs, results)]
    cols = [*OUTCOMES, "skipped"]
    if not rows:
        return pd.DataFrame(columns=["class", "op", "expect", *cols])
    df = pd.crosstab([pd.Series([r["class"] for r in rows], name="class"),
                      pd.Series([r["op"] for r in rows], name="op"),
                      pd.Series([r["expect"] for r in rows], name="expect")],
                     pd.Series([r["outcome"] for r in rows], name="outcome"))
    df = df.reindex(columns=cols, fill_value=0)
    order = {n: i for i, n in enumerate(CLASSES)}
    return df.sort_index(key=lambda ix: ix.map(lambda v: order.get(v, v) if ix.name == "class" else v))


def failing_classes(results: list[Result | None]) -> set[str]:
    return {r.job.cls for r in results if r is not None and r.bad}


def report(results: list[Result | None], jobs: list[Job], out=None, per_key: int = 2) -> int:
    """Print the table and one repro line per failure (``per_key`` per class, op and target); 1 on any bad outcome."""
    import pandas as pd

    out = out or sys.stdout

    with pd.option_context("display.max_rows", None, "display.width", 250, "display.max_columns", None):
        print(table(results, jobs).reset_index().to_string(index=False), file=out)
    shown: Counter = Counter()
    bad = [r for r in results if r is not None and r.bad]
    for r in bad:
        key = (r.job.cls, r.job.op, r.job.target)
        shown[key] += 1
        if shown[key] <= per_key:
            print(f"FAIL {r.job.cls} {r.job.op} {r.job.arg} {r.job.target}: {r.outcome}: {r.detail[:400]}\n"
                  f"  repro: {r.repro}", file=out)
    hidden = sum(max(0, n - per_key) for n in shown.values())
    if hidden:
        print(f"... {hidden} more failures of the same class, op and target", file=out)
    n_bad_cls = len(failing_classes(results))
    print(f"{len([r for r in results if r is not None])} calls, {len(bad)} bad, classes failing: {n_bad_cls} of "
          f"{len({j.cls for j in jobs})}", file=out)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    from harness import fuzz as bad_inputs

    p = usage.ArgumentParser(prog="python -m harness.fuzz", description=bad_inputs.__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "rocm", "auto"),
                   help="auto: the GPU if torch sees one, else the CPU interpreter")
    p.add_argument("--classes", nargs="*", help="class names or groups (stride, dtype, device, ...); default: all")
    p.add_argument("--ops", nargs="*", choices=OPS, default=list(OPS))
    p.add_argument("--targets", nargs="*", help="module:attr of built-in targets, or module:attr@<built-in>")
    p.add_argument("--examples", type=usage.positive_int, default=2, help="drawn bad inputs per class, op and argument")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=usage.finite_float(0, strict=True), default=DEFAULT_TIMEOUT_S, help="seconds per call before it is a hang")
    p.add_argument("--stop-after", type=usage.count, default=5,
                   help="skip a class's remaining calls on an op after this many bad outcomes (0: never)")
    p.add_argument("--jobs", type=usage.positive_int, default=1, help="worker processes")
    p.add_argument("--list", action="store_true", help="print the classes and exit")
    p.add_argument("--verbose", action="store_true", help="print every call's outcome as it comes")
    p.add_argument("--one", help="run one job (the JSON of a repro line) and print its outcome")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args.device)
    if args.list:
        for c in CLASSES.values():
            exp = c.expect if isinstance(c.expect, str) else ", ".join(f"{k}: {v}" for k, v in c.expect.items())
            print(f"{c.name:28s} {exp:10s} {c.doc}")
        return 0
    from harness import devices

    if args.one:
        job = Job.from_dict(json.loads(args.one))
        res = run([job], device=devices.select(args.device).kind, timeout=args.timeout)[0]
        print(f"{job.cls} {job.op} {job.arg} {job.target}: {res.outcome} (expected "
              f"{'typed-error' if res.expect == 'error' else 'correct'}): {res.detail}")
        return 1 if res.bad else 0
    try:
        classes = expand_classes(args.classes)
    except ValueError as e:
        p.error(str(e))
    device = devices.select(args.device)
    jobs = plan(device, classes=classes, ops=tuple(args.ops), targets=args.targets, examples=args.examples,
                seed=args.seed)
    show = (lambda r: print(f"{r.outcome:13s} {r.job.cls} {r.job.op} {r.job.arg} {r.job.target}: {r.detail[:300]}",
                            flush=True)) if args.verbose else None
    results = run(jobs, device=device.kind, timeout=args.timeout, stop_after=args.stop_after, workers=args.jobs,
                  progress=show)
    return report(results, jobs)

