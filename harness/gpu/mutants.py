"""GPU-only mutants: the right numbers, computed the wrong way — bugs that only launch counting
and CUDA-graph capture can see (``harness.gpu.checks``; each ``catches`` names ``gpu:*`` checks).

One module per op, ``cases/mutants/gpu/<op>.py`` with a list ``MUTANTS``:

  mutant-two-launches (qk_norm_rope, mla_fp8_prepare)
      the "fused" op runs its own kernel twice — q part, then kv/k part — so it computes
      exactly what the one-launch kernel computes (same kernel, same math) in two launches:
      the launch saving the fusion exists for is gone and only a launch count shows it;
  mutant-dispatch-falls-through (verify_attention)
      the backend runs the routed kernel, then falls through to the per-head split-KV kernel
      as well (a missing return): the same ``o``, 4 launches instead of 2;
  mutant-gate-flips-per-call (qk_norm_rope, verify_attention)
      the dispatch gate reads a switch that changes between calls (a counter here; in serving a
      Python global or an environment variable flipped at run time): CUDA-graph capture bakes
      one branch in, the eager call on the replay inputs takes the other. Each branch is a
      correct path, so parity cannot tell; the graph check compares the decisions.

Not registered by ``cases.mutants.register`` (it loads ``cases/<op>/mutants.py`` per op, and no
op is called "gpu"): every one passes the CPU parity suite and the timelines by construction,
so the CPU kill matrix would list them as survivors (nor ``cases/mutants/gpu/<op>.py``: the package is not an op). ``harness.gpu.checks`` registers them
(``register``); the kill matrix prints ``skip_note()`` instead.
"""
from __future__ import annotations

import importlib
import importlib.util
import os

from harness.ops import BUILTIN
from harness.registry import Impl, Registry

LAUNCHES = "gpu:launches"
GRAPH_GATE = "gpu:graph-gate"
FAMILIES = (LAUNCHES, GRAPH_GATE)  # MUTANTS' order: by the check family that flags them, then by op


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def fused_step_with(op: str, step: str, **planted):
    """An implementation of ``op``: the function ``step`` of ``fused/<op>/wrapper.py`` called with ``planted``
    (the hook carrying the bug: a ``gate_fn``, a ``kernel_fn``) and the caller's arguments."""
    def fn(**kw):
        return getattr(importlib.import_module(f"fused.{op}.wrapper"), step)(**planted, **kw)
    return fn


def two_launches(op: str, fn, doc: str) -> Impl:
    """``op``'s ``mutant-two-launches``: ``fn`` runs the op's own kernel in two launches (the launch
    count, ``gpu:launches``, flags it)."""
    return Impl(op, "mutant-two-launches", "mutant", fn, doc=doc, catches=(LAUNCHES,))


def gate_flips_per_call(op: str, step: str, gate_fn, doc: str) -> Impl:
    """``op``'s ``mutant-gate-flips-per-call``: ``fused/<op>/wrapper.py``'s ``step`` with ``gate_fn``, a gate
    whose decision changes between calls (the graph check, ``gpu:graph-gate``, flags it)."""
    return Impl(op, "mutant-gate-flips-per-call", "mutant", fused_step_with(op, step, gate_fn=gate_fn), doc=doc,
                catches=(GRAPH_GATE,))


def _collect() -> list[Impl]:
    """Every op's ``MUTANTS`` of ``cases/mutants/gpu/<op>.py``, ordered by the check family that
    flags them (launch counts, then graph gates), then by op (``harness.ops.BUILTIN``)."""
    found = [m for op in BUILTIN if importlib.util.find_spec(f"cases.{op}.gpu_mutants") is not None
             for m in importlib.import_module(f"cases.{op}.gpu_mutants").MUTANTS]
    return sorted(found, key=lambda m: FAMILIES.index(m.catches[0]))


MUTANTS = _collect()


def is_gpu_mutant(impl: Impl) -> bool:
    """A mutant only the GPU checks are expected to flag."""
    return impl.kind == "mutant" and any(c.startswith("gpu:") for c in impl.catches)


def register(reg: Registry) -> list[Impl]:
    out = [m for m in MUTANTS if m.op in reg.ops]
    for m in out:
        reg.add(m)
    return out


def skip_note() -> str:
    """What the CPU kill matrix prints about the mutants it does not run."""
    names = ", ".join(m.key for m in MUTANTS)
    return (f"not in this matrix: {len(MUTANTS)} GPU-only mutants (cases/mutants/gpu/: {names}); they compute "
            f"the right numbers, so parity and timelines cannot flag them: launch counts and CUDA-graph capture "
            f"need a GPU (python -m harness.gpu.checks)")
