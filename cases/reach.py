"""Which regions of each op's case space the generated cases reach, and how often.

A region is a predicate over a generated case (and, where the case alone does not say, the
inputs it builds: positions, prefix lengths). ``tests/test_reach.py`` holds every region at
>= ``MIN_FRACTION`` of a profile's generated cases, so a strategy change that starves one (RoPE
the identity in most cases, a fallback branch never drawn) fails there, not in a kernel bug
that goes unseen. Print the tables:

    python -m cases.reach [--profile ci] [--op OP] [--seed 0]
"""
from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
import cases
from cases import base
from cases.profiles import PROFILES, current

MIN_FRACTION = 0.2


def _ops() -> dict[str, tuple[Callable, Callable, dict]]:
    """op -> (strategy, facts, regions) for every case module ``cases/<op>/catalog.py`` that declares its
    regions: ``REACH`` (region name -> predicate over the case and its facts), ``cases`` (the
    strategy) and optionally ``reach_facts(case) -> dict`` (what the case alone does not say)."""
    out = {}
    for m in sorted(pkgutil.iter_modules(cases.__path__), key=lambda m: m.name):
        if not m.ispkg or importlib.util.find_spec(f"cases.{m.name}.catalog") is None:
            continue
        mod = importlib.import_module(f"cases.{m.name}.catalog")
        if isinstance(getattr(mod, "REACH", None), dict):
            out[m.name] = (mod.cases, getattr(mod, "reach_facts", lambda c: {}), mod.REACH)
    return out


OPS = _ops()


@functools.cache
def generated(op: str, n: int, seed: int = 0) -> tuple:
    """The ``n`` generated cases a parity run with this seed draws (suite.plan_cases)."""
    return tuple(base.draw(OPS[op][0](), n, rng_seed=seed))


@functools.cache
def hits(op: str, n: int, seed: int = 0) -> dict[str, int]:
    """Region -> how many of the ``n`` generated cases fall in it."""
    strategy, facts, regions = OPS[op]
    out = dict.fromkeys(regions, 0)
    for c in generated(op, n, seed):
        f = facts(c)
        for name, pred in regions.items():
            out[name] += bool(pred(c, f))
    return out


def counts(op: str, profile: str | None = None) -> list[int]:
    """Case counts a profile draws for ``op``: the profile's, and the interpreter's cap if lower."""
    from harness.ops import default_registry  # the caps live in the op specs

    prof = current(profile)
    cap = default_registry().ops[op].interpreter_generated
    return [prof.generated] + ([cap] if cap is not None and cap < prof.generated else [])


def table(op: str, profile: str | None = None, seed: int = 0) -> str:
    ns = counts(op, profile)
    cols = [hits(op, n, seed) for n in ns]
    head = " | ".join(f"{n} cases" + (" (interpreter)" if i else "") for i, n in enumerate(ns))
    width = max(map(len, OPS[op][2]))
    lines = [f"{op} ({current(profile).name} profile, seed {seed}): fraction of generated cases in each region",
             f"{'region':<{width}} | {head}"]
    for name in OPS[op][2]:
        lines.append(f"{name:<{width}} | " + " | ".join(f"{col[name] / n:>5.0%}" + (" <" if col[name] / n < MIN_FRACTION
                                                                                  else "  ")
                                                       for col, n in zip(cols, ns)))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cases.reach", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", choices=sorted(PROFILES), default=None, help="default: $VP_PROFILE or ci")
    ap.add_argument("--op", choices=sorted(OPS), action="append", help="default: every op")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("\n\n".join(table(op, args.profile, args.seed) for op in args.op or OPS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
