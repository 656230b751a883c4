"""Case identity: every case is a frozen dataclass whose id encodes all of its fields, so
``python -m harness repro <case-id>`` rebuilds it exactly, with no catalog lookup needed.

    qk_norm_rope:T=4,H=16,D=512,...        (generated)
    qk_norm_rope/dsv4-verify-b8-h16         (named catalog entry)
"""
from __future__ import annotations

import dataclasses
import functools
import random
import typing

DRAW_BYTES = 4096  # random bytes behind one drawn case; the strategies here take 63 at most (timelines)


def case_id(op: str, case) -> str:
    fields = ",".join(f"{f.name}={getattr(case, f.name)}" for f in dataclasses.fields(case) if f.name != "name")
    return f"{op}:{fields}"


def display_id(op: str, case) -> str:
    return f"{op}/{case.name}" if getattr(case, "name", "") else case_id(op, case)


def parse_case(case_type: type, text: str):
    """Inverse of ``case_id`` (the part after ``op:``)."""
    hints = typing.get_type_hints(case_type)
    kwargs = {}
    for part in filter(None, text.split(",")):
        if "=" not in part:
            raise ValueError(f"case id: expected key=value, got {part!r}")
        key, val = part.split("=", 1)
        if key not in hints:
            raise ValueError(f"case id: unknown field {key!r} for {case_type.__name__}")
        typ = hints[key]
        if typing.get_origin(typ) is typing.Literal:
            choices = typing.get_args(typ)
            if val not in choices:
                raise ValueError(f"case id: {key}={val!r}: expected one of {', '.join(choices)}")
            kwargs[key] = val
        elif typ is bool:
            if val not in ("True", "False"):
                raise ValueError(f"case id: {key}={val!r}: expected True or False")
            kwargs[key] = val == "True"
        else:
            kwargs[key] = typ(val)
    return case_type(**kwargs)


def composite(fn):
    """``hypothesis.strategies.composite`` applied at the first call, not at import: a catalog module
    declares its strategies without importing hypothesis, so reading the catalogs (``python -m harness
    list``) imports neither it nor torch. ``fn`` imports what it draws with in its body."""
    @functools.cache
    def strategy():
        from hypothesis import strategies as st

        return st.composite(fn)

    @functools.wraps(fn)
    def build(*args, **kwargs):
        return strategy()(*args, **kwargs)

    return build


def draw(strategy, n: int, *, rng_seed: int = 0, slack: int = 10) -> list:
    """``n`` distinct cases from a strategy (fewer if it repeats itself), deterministic for a given
    seed, on a budget of ``n + n // 3 + slack`` draws.

    Each case is drawn on its own: hypothesis's fuzzing entry point (``fuzz_one_input``) turns
    ``DRAW_BYTES`` bytes of ``random.Random(rng_seed)`` into one case, every choice uniform over
    its options. So a region of the cases holds its probability's share (a strategy weights a
    region by repeating an option), not what the test engine's search happened to dwell on: its
    cases mutate one another (one fallback branch took 1 % or 23 % of 300 cases, by seed) and
    take constants from the source of whatever local modules are loaded (the same seed gave
    other cases once another project module had been imported first)."""
    from hypothesis import given, settings

    out, seen = [], set()

    @settings(database=None)
    @given(strategy)
    def collect(c):
        key = dataclasses.astuple(c)
        if key not in seen and len(out) < n:
            seen.add(key)
            out.append(c)

    rng = random.Random(rng_seed)
    for _ in range(n + n // 3 + slack):
        if len(out) == n:
            break
        collect.hypothesis.fuzz_one_input(rng.randbytes(DRAW_BYTES))
    return out
