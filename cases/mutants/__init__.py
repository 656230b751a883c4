"""Deliberately broken implementations, one module per op: ``cases/<op>/mutants.py`` holds a
list ``MUTANTS`` of ``Impl(kind="mutant")`` (and, for store-timing bugs only a timeline shows,
``TIMELINE_MUTANTS``, registered after every op's ``MUTANTS``). Each names, in its ``doc``, the seed and the bug
class, and in ``catches`` the checks that must flag it. ``nox -s mutants`` (and
``tests/test_mutants.py``) fail if one survives.

``cases/mutants/gpu/`` is not loaded here (no op is called "gpu"): its mutants compute the
right numbers the wrong way (extra launches, a gate that flips between graph capture and
replay), so only ``harness.gpu.checks`` on a GPU can flag them; the kill matrix says so.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation only: harness.ops.default_registry imports this package
    from harness.registry import Registry


def register(reg: Registry) -> None:
    mods = [importlib.import_module(f"cases.{op}.mutants") for op in sorted(reg.ops)
            if importlib.util.find_spec(f"cases.{op}.mutants") is not None]
    for mod in mods:
        for impl in mod.MUTANTS:
            reg.add(impl)
    # then the store-timing ones (op-level; the path mutants of cases/mutants/timelines.py are not Impls)
    for mod in mods:
        for impl in getattr(mod, "TIMELINE_MUTANTS", ()):
            reg.add(impl)
