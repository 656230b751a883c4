"""The list of built-in ops (``BUILTIN``) and how their registry entries load: each op's
``cases/<op>/spec.py`` defines ``register(reg)``, which adds the op's ``OpSpec`` and its built-in
implementations (reference, fused, compiled).

Each op lives in four homes with one name stem — ``reference/<op>/`` (the chain, its oracle and
other forms), ``fused/<op>/`` (wrapper and gate, dispatch, launch configuration, kernels),
``cases/<op>/`` (spec and registrations, catalog and strategies, mutants, GPU mutants, bad-input
classes, benchmark, timeline prepare adapter) and ``tests/test_<op>*.py`` — which
``tests/test_inventory.py`` checks. Adding an op = adding its name to ``BUILTIN``: everything the
shared machinery needs about it (tolerances, kill matrix, GPU plan, nightly, benchmark, its role in
the timeline models) is in its ``OpSpec``, and no shared module names it.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: ``BUILTIN`` alone (the CLI's --op choices) imports no torch
    import torch

    from harness import tolerance
    from harness.registry import OpSpec, Registry

BUILTIN = ("qk_norm_rope", "mla_fp8_prepare", "verify_attention", "verify_accept", "verify_tree_accept",
           "spec_sampling")


def register_builtin(reg: Registry) -> None:
    for op in BUILTIN:
        importlib.import_module(f"cases.{op}.spec").register(reg)


@functools.cache
def builtin_specs() -> dict[str, OpSpec]:
    """The built-in ops' specs by name, in ``BUILTIN`` order (a registry of their own, built once)."""
    from harness.registry import Registry

    reg = Registry()
    register_builtin(reg)
    return dict(reg.ops)


def _prepare_adapter(op: str):
    """``OpSpec.timeline`` of a built-in op of role ``prepare``: its ``cases/<op>/prepare.py`` adapter."""
    return importlib.import_module(f"cases.{op}.prepare").ADAPTER


def stem_spec(op: str, *, case_type: str, reference: str, **fields) -> OpSpec:
    """The ``OpSpec`` of built-in ``op`` with the fields its stem modules give, by attribute name:
    ``case_type`` and the case side (``catalog``, ``strategy`` = its ``cases``, ``build_inputs``,
    ``case_cost`` when it has one) from ``cases/<op>/catalog.py``; the chain ``reference`` from
    ``reference/<op>/chain.py`` and the oracle ``<op>_oracle`` from ``reference/<op>/oracle.py`` (the chain's
    module when the op has no oracle module), both as ``harness.registry.Deferred`` (imported at the first call:
    reading the spec imports no torch); its GPU benchmark ``cases/<op>/bench.py`` (``bench``) and, for role
    ``prepare``, its timeline adapter from ``cases/<op>/prepare.py`` (``timeline``) unless
    ``fields`` say otherwise. ``fields``: every other OpSpec field."""
    c = importlib.import_module(f"cases.{op}.catalog")
    oracle = f"reference.{op}.oracle"
    if importlib.util.find_spec(oracle) is None:
        oracle = f"reference.{op}.chain"
    from harness.registry import Deferred, OpSpec

    fields.setdefault("bench", f"cases.{op}.bench")
    fields.setdefault("case_cost", getattr(c, "case_cost", None))
    if fields.get("role") == "prepare":
        fields.setdefault("timeline", functools.partial(_prepare_adapter, op))
    return OpSpec(name=op, case_type=getattr(c, case_type), catalog=c.catalog, strategy=c.cases,
                  build_inputs=c.build_inputs, reference=Deferred(f"reference.{op}.chain:{reference}"),
                  oracle=Deferred(f"{oracle}:{op}_oracle"),
                  **fields)


def default_registry(*, with_mutants: bool = True, with_plugins: bool = True, extra: tuple[str, ...] = ()) -> Registry:
    """Built-in ops and implementations, then mutants, entry points and ``extra`` module:attr specs."""
    from cases import mutants
    from harness.registry import Registry

    reg = Registry()
    register_builtin(reg)
    if with_mutants:
        mutants.register(reg)
    if with_plugins:
        reg.load_entry_points()
    for spec in extra:
        reg.load_spec(spec)
    return reg


def tolerance_overrides() -> dict[tuple[str, str], tolerance.Tolerance]:
    """Every built-in op's overrides, keyed (op, output name) (``OpSpec.tolerances``)."""
    return {(op, out): tol for op, spec in builtin_specs().items() for out, tol in spec.tolerances.items()}


def lookup_tolerance(op: str, output: str, dtype: torch.dtype) -> tolerance.Tolerance:
    """The tolerance of a built-in op's output (its ``OpSpec.tolerances`` entry, else the dtype's
    floor); with the spec at hand, ``OpSpec.tolerance`` says the same for any registered op."""
    from harness import tolerance

    spec = builtin_specs().get(op)
    return spec.tolerance(output, dtype) if spec is not None else tolerance.floor(op, output, dtype)
