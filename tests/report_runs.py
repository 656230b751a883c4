"""Real parity runs for the report tests: a clean run and the same run with a mutant plugged in
under the fused implementation's name, so that its rows line up key for key with the clean ones.

Four qk_norm_rope catalog cases, two in verify mode (where ``mutant-store-left-on-in-verify``
bites) and two in decode mode (where it computes what the fused kernel computes), with the
reference chain in both runs.
"""
from __future__ import annotations

import dataclasses

from cases import profiles
from harness import suite
from harness.registry import Registry, default_registry
from reports.rows import to_frame

OP = "qk_norm_rope"
CASES = ("neox", "with-q-weight", "neox-decode-q-weight", "tiny-rows-decode")
MUTANT = "mutant-store-left-on-in-verify"


def _registry():
    full = default_registry(with_plugins=False)
    spec = full.ops[OP]
    chosen = [c for c in spec.catalog(big=False) if c.name in CASES]
    assert len(chosen) == len(CASES), f"catalog lost a case the report tests use: {CASES}"
    reg = Registry()
    reg.add_op(dataclasses.replace(spec, catalog=lambda big=False: chosen))
    return full, reg


def run_frame(device, *, mutant: bool, shard_spec: str | None = None):
    """Rows of reference + fused; with ``mutant`` the fused slot holds the mutant (same name and kind)."""
    full, reg = _registry()
    ref, fused = full.impls[f"{OP}/reference"], full.impls[f"{OP}/fused"]
    if mutant:
        fused = dataclasses.replace(full.impls[f"{OP}/{MUTANT}"], name=fused.name, kind=fused.kind)
    rows = suite.run(reg, dev=device, profile=profiles.current("dev"), ops=[OP], impls=[ref, fused],
                     generated=0, progress=False, shard_spec=shard_spec)
    return to_frame(rows)
