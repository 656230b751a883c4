"""Real parity runs for the report tests: a clean run and the same run with a mutant plugged in
under the fused implementation's name, so that its rows line up key for key with the clean ones.

Four qk_norm_rope catalog cases, two in verify mode (where ``mutant-store-left-on-in-verify``
bites) and two in decode mode (where it computes what the fused kernel computes), with the
reference chain in both runs.
"""
from __future__ import annotations

import dataclasses

from cases import profiles
from harness.ops import default_registry
from harness.parity import suite
from harness.registry import Registry
from reports.rows import to_frame
from tests.helpers import harness_cli, subprocess_env

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


TIMELINE = "qwen35-gqa/width-1"  # the smallest qwen35 catalog timeline: one verify step that stores
TIMELINE_MUTANT = "path-store-before-attention"  # seed 000: kernel parity passes, the timeline fails


def timeline_cli(*args, timeout=600):
    """``python -m harness timelines --device cpu ...`` as a user runs it."""
    return harness_cli(["timelines", "--device", "cpu", *args], env=subprocess_env(OMP_NUM_THREADS="1"),
                       timeout=timeout)


def timeline_csvs(tmp):
    """Two timelines CSVs of ``TIMELINE`` from the CLI: the reference path (passes) and the
    store-before-attention path mutant (fails) -> (clean.csv, mutant.csv, the mutant's printed repro)."""
    clean, mutant = tmp / "timelines-clean.csv", tmp / "timelines-mutant.csv"
    r = timeline_cli("--timeline", TIMELINE, "--path", "reference+reference", "--quiet", "--csv", clean)
    assert r.returncode == 0, r.stdout + r.stderr
    r = timeline_cli("--timeline", TIMELINE, "--path-mutant", TIMELINE_MUTANT, "--quiet", "--csv", mutant)
    assert r.returncode == 1 and r.stdout.count("\nFAIL ") == 1, r.stdout + r.stderr
    repro = next(line for line in r.stdout.splitlines() if line.strip().startswith("repro: ")).split("repro: ", 1)[1]
    return clean, mutant, repro
