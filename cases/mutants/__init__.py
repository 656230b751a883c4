"""Deliberately broken implementations, one module per op: ``cases/mutants/<op>.py`` holds a
list ``MUTANTS`` of ``Impl(kind="mutant")``. Each names, in its ``doc``, the seed and the bug
class, and in ``catches`` the checks that must flag it. ``nox -s mutants`` (and
``tests/test_mutants.py``) fail if one survives.

``cases/mutants/gpu.py`` is not loaded here (no op is called "gpu"): its mutants compute the
right numbers the wrong way (extra launches, a gate that flips between graph capture and
replay), so only ``harness.gpu_checks`` on a GPU can flag them; the kill matrix says so.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation only: harness.registry.default_registry imports this package
    from harness.registry import Registry


def register(reg: Registry) -> None:
    for op in sorted(reg.ops):
        if importlib.util.find_spec(f"cases.mutants.{op}") is None:
            continue
        for impl in importlib.import_module(f"cases.mutants.{op}").MUTANTS:
            reg.add(impl)
    # store-timing mutants (op-level ones; the path mutants are not Impls), cases/mutants/timelines.py
    for impl in importlib.import_module("cases.mutants.timelines").MUTANTS:
        if impl.op in reg.ops:
            reg.add(impl)
