"""Every class in report order (``CLASSES``, with groups), the hypothesis strategy of one class's
bad inputs, and the plan: the jobs of a run, each rebuilt exactly from its fields."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from harness.fuzz import classes_call
from harness.fuzz import classes_layout
from harness.fuzz import classes_values
from harness.fuzz.args import OPS, arg
from harness.fuzz.badclass import BadClass, replace_fields
from harness.fuzz.targets import base_cases, resolve_target, targets_for

CLASSES: dict[str, BadClass] = {c.name: c for c in (
    *classes_layout.CLASSES, *classes_values.CLASSES, *classes_call.CLASSES)}


def expand_classes(tokens: list[str] | None) -> list[str]:
    """Class names, or group names (the part before the first '-') selecting every class of the group."""
    if not tokens:
        return list(CLASSES)
    out = []
    for tok in tokens:
        hits = [tok] if tok in CLASSES else [n for n, c in CLASSES.items() if c.group == tok]
        if not hits:
            raise ValueError(f"classes: {tok!r} is neither a class nor a group; groups: "
                             f"{sorted({c.group for c in CLASSES.values()})}")
        out += [h for h in hits if h not in out]
    return out


@dataclass(frozen=True)
class BadInput:
    """A valid case of ``op`` and the one way class ``cls`` breaks its argument ``arg`` (``*``: the call)."""
    op: str
    cls: str
    arg: str
    case: Any
    params: tuple[tuple[str, Any], ...]


def bad_inputs(op: str, cls: str, a: str, device) -> st.SearchStrategy[BadInput]:
    """Hypothesis strategy: a valid case (``base_cases``) with the fields the break needs, and its parameters."""
    c = CLASSES[cls]
    needs = dict(arg(op, a).needs) if a != "*" else {}

    def build(case, p):
        case = c.prepare(op, a, replace_fields(case, **needs), p)
        return BadInput(op, cls, a, case, tuple(sorted(p.items())))

    return st.builds(build, base_cases(op, device), c.params(op, a))


def draw(strategy, n: int, *, rng_seed: int = 0) -> list:
    """Up to ``n`` distinct examples, deterministic for a seed, on a budget of about n hypothesis
    runs (``cases.base.draw``'s default slack of 10 is too slow for some 500 strategies per plan)."""
    from cases import base

    return base.draw(strategy, n, rng_seed=rng_seed, slack=1)


@dataclass(frozen=True)
class Job:
    op: str
    cls: str
    arg: str
    target: str
    case: str  # cases.base.case_id
    params: tuple[tuple[str, Any], ...]

    def as_dict(self) -> dict:
        return {"op": self.op, "cls": self.cls, "arg": self.arg, "target": self.target, "case": self.case,
                "params": [list(kv) for kv in self.params]}

    @staticmethod
    def from_dict(d: dict) -> "Job":
        return Job(d["op"], d["cls"], d["arg"], d["target"], d["case"], tuple((k, v) for k, v in d["params"]))


def plan(device, *, classes: list[str] | None = None, ops: tuple[str, ...] = OPS, targets: list[str] | None = None,
         examples: int = 2, seed: int = 0) -> list[Job]:
    """Every (class, op, argument) on ``device`` × ``examples`` drawn bad inputs × every target that takes it."""
    from cases.base import case_id

    jobs = []
    for name in expand_classes(classes):
        c = CLASSES[name]
        if not c.on_device(device):
            continue
        for op in ops:
            tgts = [resolve_target(t) for t in targets] if targets else targets_for(op)
            tgts = [t for t in tgts if t.op == op]
            for a in c.args(op):
                for bi in draw(bad_inputs(op, name, a, device), examples, rng_seed=seed):
                    for t in tgts:
                        if (a == "*" or t.forwards(a)) and t.applies(bi.case):
                            jobs.append(Job(op, name, a, t.name, case_id(op, bi.case), bi.params))
    return jobs
