"""How often the distributional check of ``spec_sampling`` fails: its false-alarm rate on clean
implementations and its detection rate (power) against each mutant, over many independent checks.

    python -m cases.spec_sampling.power --impl reference --checks 10000 [--trials N] [--out CSV]
    python -m cases.spec_sampling.power --impl fused --checks 60
    python -m cases.spec_sampling.power --mutants --checks 100

Check i runs the distributional check (``cases/spec_sampling/distribution.py``: the same batches,
verdict and alpha the parity suite uses) on catalog case ``i mod 3`` of the three distributional
ones with its seed replaced by ``i // 3 + SEED0`` — a new problem (logits, q) and new random streams
each time. ``--trials`` replaces the case's trial count (the bound alpha holds for every count;
the power does not). Prints one line per (implementation, case): checks, records failed, rate.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import pandas as pd
import torch

from cases.spec_sampling import catalog as c
from cases.spec_sampling import distribution as dist
from harness import devices
from harness.ops import default_registry

SEED0 = 1000  # checks' seeds start here: away from the catalog's own


def dist_cases() -> list:
    return [k for k in c.catalog() if k.mode == "distribution"]


def one_check(fn, case, dev, alpha: float) -> dict:
    """The two records of one distributional check of ``fn`` on ``case``: {check: passed}."""
    pairs = []
    for inputs in dist.batches(case, dev):
        out = fn(**inputs)
        pairs.append(({k: v.cpu() if hasattr(v, "cpu") else v for k, v in inputs.items()},
                      {k: v.cpu() for k, v in out.items()}))
    return {r.check: r.passed for r in dist.verdict(case, pairs, alpha)}


def measure(impl_names: list[str], checks: int, trials: int | None, dev, out: str | None = None) -> pd.DataFrame:
    reg = default_registry(with_plugins=False)
    alpha = reg.ops["spec_sampling"].distribution.alpha
    base = dist_cases()
    rows = []
    for name in impl_names:
        fn = reg.impls[f"spec_sampling/{name}"].fn
        t0 = time.perf_counter()
        for i in range(checks):
            case = dataclasses.replace(base[i % len(base)], seed=SEED0 + i // len(base),
                                       **({"trials": trials} if trials else {}))
            got = one_check(fn, case, dev, alpha)
            rows.append(dict(impl=name, case=base[i % len(base)].name, seed=case.seed, trials=case.trials,
                             output_ids=got["distribution:output_ids"], accept_length=got["distribution:accept_length"]))
            if out and len(rows) % 500 == 0:  # a long measurement keeps what it has
                pd.DataFrame(rows).to_csv(out, index=False)
        print(f"{name}: {checks} checks in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    df = df.assign(failed=~(df.output_ids & df.accept_length), ids_failed=~df.output_ids, acc_failed=~df.accept_length)
    return df.groupby(["impl", "case"], sort=False).agg(
        checks=("failed", "size"), trials=("trials", "first"), failed=("failed", "sum"),
        output_ids_failed=("ids_failed", "sum"), accept_length_failed=("acc_failed", "sum")).reset_index()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", action="append", help="clean implementations (default: reference)")
    ap.add_argument("--mutants", action="store_true", help="every spec_sampling mutant instead")
    ap.add_argument("--checks", type=int, default=300, help="checks per implementation")
    ap.add_argument("--trials", type=int, default=None, help="trials per request (default: the case's)")
    ap.add_argument("--out", help="CSV of every check")
    args = ap.parse_args(argv)
    dev = devices.select("auto")
    if args.mutants:
        from cases.spec_sampling.mutants import MUTANTS

        names = [m.name for m in MUTANTS]
    else:
        names = args.impl or ["reference"]
    torch.set_num_threads(1)  # small tensors: threads only contend
    df = measure(names, args.checks, args.trials, dev, args.out)
    if args.out:
        df.to_csv(args.out, index=False)
    print(summary(df).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
