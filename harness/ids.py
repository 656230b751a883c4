"""The ids a user hands the CLI back, parsed: a case id (``op/catalog-name`` or ``op:field=value,...``,
as a FAIL line's repro prints it), a timeline (a catalog name or a ``timeline:...`` id) and an
end-to-end path (``prepare+attn``). A bad one is a ``UsageError`` / ``argparse.ArgumentTypeError``
naming it, never a traceback."""
from __future__ import annotations

import argparse

from harness.usage import UsageError


def parse_case_id(reg, cid: str):
    """``op/catalog-name`` or ``op:field=value,...`` -> (the op's spec, the case)."""
    from cases import base

    generated = ":" in cid.split("/")[0]
    if generated:
        op, fields = cid.split(":", 1)
    else:
        op, fields = cid.split("/", 1) if "/" in cid else (cid, "")
    if op not in reg.ops:
        raise UsageError("case id", f"unknown op {op!r} in {cid!r}; known: {', '.join(sorted(reg.ops))}")
    spec = reg.ops[op]
    if generated:
        try:
            return spec, base.parse_case(spec.case_type, fields)
        except (ValueError, TypeError) as exc:
            raise UsageError("case id", f"{cid!r}: {str(exc).removeprefix('case id: ')}") from None
    named = {c.name: c for c in spec.catalog(big=True)}
    if fields not in named:
        raise UsageError("case id", f"no catalog case {fields!r} in {op}; known: {', '.join(named)}")
    return spec, named[fields]


def timeline_arg(text: str):
    """``--timeline``: a catalog name or a ``timeline:...`` id (a FAIL line's) -> the Timeline."""
    from cases import base
    from cases import timelines as tl

    if text.startswith("timeline:"):
        try:
            t = base.parse_case(tl.Timeline, text.split(":", 1)[1])
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {str(exc).removeprefix('case id: ')}") from None
        if t.family not in tl.FAMILIES:
            raise argparse.ArgumentTypeError(f"{text!r}: family={t.family!r}: expected one of {', '.join(tl.FAMILIES)}")
        try:
            batches = tl.parse_steps(t.steps)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
        if not batches:
            raise argparse.ArgumentTypeError(f"{text!r}: steps={t.steps!r}: no batch (e.g. steps=P:0.4;V:0.2)")
        return t
    named = {t.name: t for t in tl.catalog()}
    if text not in named:
        raise argparse.ArgumentTypeError(f"no catalog timeline {text!r} (and not a 'timeline:...' id); "
                                         f"known: {', '.join(named)}")
    return named[text]


def path_arg(text: str) -> tuple[str, str]:
    """``--path prepare+attn`` -> (prepare, attn); the names are checked against the registry later."""
    parts = text.split("+")
    if len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected prepare+attn implementation names, e.g. fused+fused, got {text!r}")
    return parts[0], parts[1]


def timeline_path_arg(text: str) -> tuple[str, ...]:
    """``timelines --path prepare+attn[+accept]`` -> its names (checked against the registry later)."""
    parts = text.split("+")
    if len(parts) not in (2, 3) or not all(parts):
        raise argparse.ArgumentTypeError(f"expected prepare+attn[+accept] implementation names, e.g. fused+fused, "
                                         f"got {text!r}")
    return tuple(parts)
