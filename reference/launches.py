"""The reference chains' launches: the functions of ``reference/<op>/chain.py`` that stand for one
launch of the unfused chain each (``@launch``), counted on request.

A GPU launch check (``harness.gpu.runners.check_launches``) compares the calls of a chain's launches
with its design (``OpSpec.gpu.stages`` names them, ``expected_stages`` counts them): ``counted()``
yields the names of the launches called while the block runs. Under ``torch.compile`` nothing is
recorded (the compiled chain traces straight through), so the compiled graphs are those of the bare
functions.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable

import torch

_LOGS: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar("verify_parity_launch_logs", default=())


def launch(fn: Callable) -> Callable:
    """Mark ``fn`` as one launch of its chain; its calls are recorded under its name in every open
    ``counted`` log."""
    name = fn.__name__

    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        if not torch.compiler.is_compiling():
            for log in _LOGS.get():
                log.append(name)
        return fn(*args, **kwargs)

    recorded.chain_launch = name
    return recorded


def is_launch(fn) -> bool:
    """Whether ``fn`` is marked with ``@launch``."""
    return isinstance(getattr(fn, "chain_launch", None), str)


@contextlib.contextmanager
def counted():
    """Yields the list of the launches called while the block runs, by name, in call order."""
    log: list[str] = []
    token = _LOGS.set(_LOGS.get() + (log,))
    try:
        yield log
    finally:
        _LOGS.reset(token)
