"""Case identity: every case is a frozen dataclass whose id encodes all of its fields, so
``python -m harness repro <case-id>`` rebuilds it exactly, with no catalog lookup needed.

    qk_norm_rope:T=4,H=16,D=512,...        (generated)
    qk_norm_rope/dsv4-verify-b8-h16         (named catalog entry)
"""
from __future__ import annotations

import dataclasses
import typing

from hypothesis import Phase, given, seed, settings


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
        kwargs[key] = (val == "True") if typ is bool else typ(val)
    return case_type(**kwargs)


def draw(strategy, n: int, *, rng_seed: int = 0, slack: int = 10) -> list:
    """``n`` distinct cases from a strategy (fewer if it repeats itself), deterministic for a given
    seed (no shrinking), on a budget of ``n + n // 3 + slack`` hypothesis examples."""
    out, seen = [], set()

    @seed(rng_seed)
    @settings(max_examples=n + n // 3 + slack, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(__import__("hypothesis").HealthCheck))
    @given(strategy)
    def collect(c):
        key = dataclasses.astuple(c)
        if key not in seen and len(out) < n:
            seen.add(key)
            out.append(c)

    collect()
    return out
