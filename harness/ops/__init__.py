"""Registry entries, one module per op: ``harness/ops/<op>.py`` defines ``register(reg)``,
which adds the op's ``OpSpec`` and its built-in implementations (reference, fused, compiled).

Each op has five pieces with one name stem — ``reference/<op>.py``, ``fused/<op>.py``,
``cases/<op>.py``, ``harness/ops/<op>.py``, ``tests/test_<op>.py`` — which
``tests/test_inventory.py`` checks. Adding an op = adding its name to ``BUILTIN``.
"""
from __future__ import annotations

import importlib

from harness.registry import Registry

BUILTIN = ("qk_norm_rope", "mla_fp8_prepare", "verify_attention", "verify_accept")


def register_builtin(reg: Registry) -> None:
    for op in BUILTIN:
        importlib.import_module(f"harness.ops.{op}").register(reg)
