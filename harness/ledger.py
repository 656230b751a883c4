"""Known-failure ledgers: a kernel's real, reported defects, as data, so that a run stays green on
them, fails on any other failure, and fails when a known failure stops happening.

An entry names the implementations, the case pattern (a predicate over the op's case, with its words),
the checks that fail, the cause and where it lives upstream. In a parity run (``--ledger``):
  * a failing check of an implementation that an entry covers, on a case it matches, is ``known``
    (its row's status; ``ParityRow.known`` names the entry) instead of ``fail``;
  * a case an entry matches that ran (was not refused) with none of the entry's checks failing gets a
    failing row ``ledger:<entry id>``: the bug looks fixed — narrow or remove the entry (a waiver must
    not outlive its bug).
Ledgers live in ``cases/ledgers/<name>.py`` (``LEDGER``); ``--ledger NAME`` or ``--ledger module:attr``.

Two entry types (docs/plugins.md, "Known-failure ledgers"):
  * ``KnownFailure``: the pattern is a predicate over the case dataclass (``when(case)``);
  * ``KnownFailureOnInputs``: a failure that depends on the case's data (a NaN row, a value that
    cancels), listed exactly: ``when(case)`` narrows by the case first, then
    ``when_inputs(case, inputs)`` decides on the inputs as built for the run (the same seeded
    draws the implementation got, copied to the host). A case the data does not hit is not
    covered: it must pass, and a case it hits must fail as the entry says.
"""
from __future__ import annotations

import fnmatch
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KnownFailure:
    id: str  # short, stable: it appears in rows (``known``) and in ``ledger:<id>`` checks
    op: str
    impls: tuple[str, ...]  # implementation names it covers
    checks: tuple[str, ...]  # fnmatch patterns over check names, e.g. "finite:o*" (every run's suffix)
    when: Callable[[Any], bool]  # the case pattern, over the op's case dataclass
    pattern: str  # the same in words
    cause: str
    upstream: str  # where it lives upstream: release + file::function, an issue or a PR

    def __post_init__(self):
        for name in ("id", "op", "pattern", "cause", "upstream"):
            if not getattr(self, name):
                raise ValueError(f"known failure {self.id or '?'}: {name} must not be empty")
        if not self.impls or not self.checks:
            raise ValueError(f"known failure {self.id}: impls and checks must not be empty")

    def covers(self, op: str, impl: str, case, inputs: Callable[[], Mapping] | None = None) -> bool:
        """Whether the entry covers ``impl`` of ``op`` on ``case``; ``inputs``: a zero-argument callable
        returning the case's built inputs (read only by ``KnownFailureOnInputs``)."""
        return op == self.op and impl in self.impls and bool(self.when(case))

    def explains(self, check: str) -> bool:
        return any(fnmatch.fnmatchcase(check, p) for p in self.checks)


@dataclass(frozen=True)
class KnownFailureOnInputs(KnownFailure):
    """A known failure whose pattern needs the case's data: ``when(case)`` first (cheap; True for every
    case the data may hit), then ``when_inputs(case, inputs)`` over the keyword arguments the
    implementation was called with (``OpSpec.build_inputs`` of the case, copied to the host; read
    them, never write them). ``pattern`` says both in words."""
    when_inputs: Callable[[Any, Mapping], bool]

    def __post_init__(self):
        super().__post_init__()
        if not callable(self.when_inputs):
            raise ValueError(f"known failure {self.id}: when_inputs must be callable (case, inputs) -> bool")

    def covers(self, op: str, impl: str, case, inputs: Callable[[], Mapping] | None = None) -> bool:
        if not super().covers(op, impl, case):
            return False
        if inputs is None:
            raise ValueError(f"known failure {self.id}: its condition reads the case's inputs; none given")
        return bool(self.when_inputs(case, inputs()))


def load(spec: str) -> tuple[KnownFailure, ...]:
    """``NAME`` (``cases.ledgers.NAME``) or ``module:attr``: a sequence of KnownFailure."""
    mod, attr = spec.split(":", 1) if ":" in spec else (f"cases.ledgers.{spec}", "LEDGER")
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--ledger {spec}: {exc}") from exc
    entries = tuple(obj() if callable(obj) else obj)
    bad = [type(e).__name__ for e in entries if not isinstance(e, KnownFailure)]
    if bad:
        raise ValueError(f"--ledger {spec}: expected KnownFailure entries, got {bad}")
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids):
        raise ValueError(f"--ledger {spec}: duplicate entry ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return entries


def verdicts(ledger, op: str, impl: str, case, failing: list[str], inputs: Callable[[], Mapping] | None = None
             ) -> tuple[dict[str, str], list[KnownFailure]]:
    """(check -> id of the entry explaining it, entries covering the case that explain none of ``failing``).
    ``inputs``: a zero-argument callable returning the case's built inputs, for ``KnownFailureOnInputs``."""
    covering = [e for e in ledger if e.covers(op, impl, case, inputs)]
    known = {}
    for check in failing:
        for e in covering:
            if e.explains(check):
                known[check] = e.id
                break
    silent = [e for e in covering if not any(e.explains(c) for c in failing)]
    return known, silent
