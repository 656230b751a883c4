"""Deliberately broken implementations. Each is registered like any other implementation and
names, in its ``doc``, the seed and the bug class; ``catches`` lists the checks that must
flag it. ``nox -s mutants`` (and ``tests/test_mutants.py``) fail if one survives.
"""
from __future__ import annotations

from harness.registry import Registry


def register(reg: Registry) -> None:
    from cases.mutants import qk_norm_rope

    for impl in qk_norm_rope.MUTANTS:
        reg.add(impl)
