"""What a store-timing timeline runs and what it gives back: a ``Path`` (the implementations per op
and the backend under test; ``clean_path`` builds a family's from implementation names) and the
run's ``StepRecord``s (one ``harness.compare.Record`` per check, with its step, mode, layer and
check family; ``failures`` keeps the failing ones). ``harness.timelines.runner`` runs a path and re-exports
these names; the end-to-end engine (``harness.e2e.engine``) serves a path too."""
from __future__ import annotations

from dataclasses import dataclass

from cases import timelines as tl
from harness import compare
from harness.backend import CLEAN, Backend
from harness.registry import Impl, Registry
from harness.timelines.prepare import accept_role


@dataclass(frozen=True)
class Path:
    name: str
    family: str
    prepare: Impl | None  # implementation of the family's prepare op (None: plain projections)
    attn: Impl  # implementation of the attention op (role "attn") for decode and verify steps
    # implementation of the acceptance op (role "accept", a tree family's "tree-accept"; None: its reference)
    accept: Impl | None = None
    backend: Backend = CLEAN
    doc: str = ""
    # the end-to-end engine at temperature > 0: the speculative step's sampler (a spec_sampling implementation;
    # None: no sampled speculative decoding on this path). The timelines do not run it
    sampler: Impl | None = None


@dataclass(frozen=True)
class StepRecord:
    step: int
    mode: str
    layer: int
    family: str  # check family: timeline | gate
    record: compare.Record  # (None only while its step's checks are being made: ``TimelineRun._flush``)


def clean_path(reg: Registry, family: str, *, prepare: str = "fused", attn: str = "fused", accept: str | None = None,
               backend: Backend = CLEAN) -> Path:
    """The family's path on the named implementations. ``accept`` None: the acceptance op's
    implementation named like ``attn`` when there is one, else its reference. A backend other than
    the clean one shows in the name (``family:prepare+attn:backend``)."""
    fam = tl.FAMILIES[family]
    p = None if fam.prepare == "projection" else reg.impls[f"{fam.prepare}/{prepare}"]
    acc_op = reg.by_role(accept_role(fam))  # a tree family's: the tree acceptance op
    acc = None
    if acc_op:
        op = acc_op[0].name
        acc = reg.impls.get(f"{op}/{accept or attn}") or (None if accept else reg.impls.get(f"{op}/reference"))
        if acc is None:
            raise KeyError(f"{op}/{accept}")
    name = f"{family}:{prepare}+{attn}" + (f"+{accept}" if accept else "") + (
        "" if backend is CLEAN or backend == CLEAN else f":{backend.name}")
    return Path(name, family, p, reg.impls[f"{reg.attention().name}/{attn}"], acc, backend)


def failures(records: list[StepRecord]) -> list[StepRecord]:
    return [s for s in records if not s.record.passed]
