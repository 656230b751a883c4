"""The dispatch gates' decisions as they are taken: each fused backend step (``fused/<op>/wrapper.py``)
asks its gate through ``decide``, which is also how a decision is observed.

A graph check (``harness.gpu.runners.check_graph``) needs the decisions a step took while a CUDA graph
was captured and those it takes eagerly on the replay inputs: ``recorded()`` collects every decision
taken inside the block, whatever ``gate_fn`` the caller passed (a mutant's own gate included). A CUDA
graph never calls the gate again: ``forced(decisions)`` replays recorded decisions in order instead of
calling the gate, which is how a stand-in capture on the CPU models a replay.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator

_RECORDERS: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar("verify_parity_gate_logs", default=())
_FORCED: contextvars.ContextVar[Iterator | None] = contextvars.ContextVar("verify_parity_gate_forced", default=None)


def decide(gate_fn: Callable, **state):
    """``gate_fn(**state)``, or the next forced decision inside ``forced``; every open ``recorded``
    log gets it."""
    pending = _FORCED.get()
    if pending is not None:
        try:
            decision = next(pending)
        except StopIteration:
            raise RuntimeError("forced gate decisions exhausted: the step took more decisions than were recorded") from None
    else:
        decision = gate_fn(**state)
    for log in _RECORDERS.get():
        log.append(decision)
    return decision


@contextlib.contextmanager
def recorded():
    """Yields the list of every gate decision taken while the block runs (nested blocks each get all
    of theirs)."""
    log: list = []
    token = _RECORDERS.set(_RECORDERS.get() + (log,))
    try:
        yield log
    finally:
        _RECORDERS.reset(token)


@contextlib.contextmanager
def forced(decisions: Iterable):
    """While the block runs, the gates are not called: each step takes the next of ``decisions``."""
    token = _FORCED.set(iter(list(decisions)))
    try:
        yield
    finally:
        _FORCED.reset(token)
