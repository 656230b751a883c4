"""``BadClass`` (one way to break one argument, and the outcome it must have), the context a
break runs in, and the helpers the classes of every family share."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from harness.fuzz.args import args_of
from reference.checks import VerifyParityInputError


@dataclass(frozen=True)
class BadClass:
    """One way to break one argument (or the whole call, ``*``), and the one outcome it must have.

    ``apply(kw, arg, p, ctx)`` breaks a fresh copy of the valid keyword arguments in place;
    ``canon`` (answer classes) turns another copy into the legal equivalent (None: the broken
    input is itself legal); ``prepare(op, arg, case, p)`` sets the case fields the break needs to
    bite; ``names(op, arg)`` the arguments a typed error may name; ``value(p)`` a text its message
    must hold."""
    name: str
    doc: str
    expect: str | dict  # "error" | "answer", or {op: one of them} where the ops' contracts differ
    args: Callable[[str], tuple[str, ...]]
    apply: Callable
    params: Callable[[str, str], st.SearchStrategy] = lambda op, a: st.just({})
    prepare: Callable = lambda op, a, case, p: case
    canon: Callable | None = None
    names: Callable[[str, str], tuple[str, ...]] | None = None
    value: Callable[[dict], str] | None = None
    error: type = VerifyParityInputError
    on_device: Callable = lambda device: True  # runs on this device at all (a second GPU, ...)

    @property
    def group(self) -> str:
        return self.name.split("-", 1)[0]

    def expected(self, op: str) -> str:
        return self.expect if isinstance(self.expect, str) else self.expect[op]


@dataclass
class Ctx:
    op: str
    case: Any
    device: Any  # harness.devices.Device

    @property
    def dev(self) -> torch.device:
        return self.device.torch_device


def replace_fields(case, **fields):
    """``dataclasses.replace`` of the ``fields`` the case has (the others, another op's, dropped)."""
    return dataclasses.replace(case, **{k: v for k, v in fields.items() if hasattr(case, k)})


def with_tokens(case, n: int = 2):
    """At least ``n`` tokens (and index entries): qk/mla T, verify B·L and a prefix of n keys."""
    if hasattr(case, "prefix"):
        kind, k = case.prefix.split(":")
        return dataclasses.replace(case, prefix=f"const:{max(n, int(k))}")
    if not hasattr(case, "T"):  # requests without a prefix or a token count: n requests
        return dataclasses.replace(case, B=max(case.B, n))
    return dataclasses.replace(case, T=max(case.T, n))


def two_rows(op, a, case, p):
    """At least two rows in every tensor (a view of one row is contiguous whatever its strides, and
    a value in the only row leaves nothing finite to measure): two tokens, positions, prefix keys."""
    if args_of(op, "indptr"):  # per-request structure: two draft rows per request
        return with_tokens(dataclasses.replace(case, L=max(2, case.L)))
    return replace_fields(with_tokens(case), max_pos=max(2, getattr(case, "max_pos", 2)))


def set_arg(kw, a, fn):
    """Replace argument ``a`` of the keyword arguments ``kw`` by ``fn`` of it (an ``apply``'s one step)."""
    kw[a] = fn(kw[a])


def junk_params(*kinds):
    """A class's ``params``: ``{"junk": kind}``, one of ``kinds`` (nan | huge | negative: ``surgery.junk_value``)."""
    return lambda op, a: st.sampled_from(kinds).map(lambda j: {"junk": j})


def first_real(t: torch.Tensor, k: int = 0) -> int:
    """Position of the k-th non-negative entry (padding entries are negative)."""
    return int(torch.nonzero(t.cpu() >= 0).flatten()[k])


# a class's ``expect``: a typed error, or the answer of the reference chain on the legal input
ERROR = "error"
ANSWER = "answer"


def bad(name, doc, expect, args, apply, **kw):
    """``BadClass(...)`` under a short name, the way the families list their classes."""
    return BadClass(name, doc, expect, args, apply, **kw)
