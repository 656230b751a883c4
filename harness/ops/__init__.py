"""Registry entries, one module per op: ``harness/ops/<op>.py`` defines ``register(reg)``,
which adds the op's ``OpSpec`` and its built-in implementations (reference, fused, compiled).

Each op has five pieces with one name stem — ``reference/<op>.py``, ``fused/<op>.py``,
``cases/<op>.py``, ``harness/ops/<op>.py``, ``tests/test_<op>.py`` — which
``tests/test_inventory.py`` checks. Adding an op = adding its name to ``BUILTIN``: everything the
shared machinery needs about it (tolerances, kill matrix, GPU plan, nightly, benchmark, its role in
the timeline models) is in its ``OpSpec``, and no shared module names it.
"""
from __future__ import annotations

import functools
import importlib

from harness.registry import OpSpec, Registry

BUILTIN = ("qk_norm_rope", "mla_fp8_prepare", "verify_attention", "verify_accept")


def register_builtin(reg: Registry) -> None:
    for op in BUILTIN:
        importlib.import_module(f"harness.ops.{op}").register(reg)


@functools.cache
def builtin_specs() -> dict[str, OpSpec]:
    """The built-in ops' specs by name, in ``BUILTIN`` order (a registry of their own, built once)."""
    reg = Registry()
    register_builtin(reg)
    return dict(reg.ops)
