"""Registry entry for ``verify_accept``: its OpSpec and built-in implementations.

Contract: exact. ``output_ids`` (B, L + 1) and ``accept_length`` (B,) int32 equal the reference
chain's element for element (``reference.verify_accept``: the argmax rule, padding requests).
No buffer is written in place, so there are no effects; every input must keep its bytes.
"""
from __future__ import annotations

import functools

import torch

from harness.registry import Impl, OpSpec, OutputSpec, Registry

OP = "verify_accept"


def _no_effects(case, inputs, oracle):
    return []


def _fused(**kw):
    from fused import verify_accept as f

    return f.verify_accept(**kw)


@functools.cache
def _compiled_chain():
    from reference import verify_accept as r

    def chain(target_logits, drafts, qo_indptr):
        rows, real = r.request_rows(qo_indptr, drafts.shape[1])
        target = r.gather_targets(r.row_argmax(target_logits), rows, real)
        n = r.accept_lengths(r.match(target, drafts), real)
        return r.output_ids(drafts, r.bonus_tokens(target, n), n, real), n

    # one graph per (index dtypes, contiguous or strided rows) x dynamic shapes: past dynamo's default of 8
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(chain, dynamic=True)


def _compiled(*, target_logits, draft_tokens, qo_indptr):
    """torch.compile of the reference chain's six launches (validation outside: it reads values)."""
    from reference import verify_accept as r

    B, L, _ = r.validate(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr)
    out, n = _compiled_chain()(target_logits, draft_tokens.view(B, L), qo_indptr)
    return {"output_ids": out, "accept_length": n}


def _spec() -> OpSpec:
    from cases import verify_accept as c
    from reference import verify_accept as r

    return OpSpec(
        name=OP,
        case_type=c.VerifyAcceptCase,
        catalog=c.catalog,
        strategy=c.cases,
        build_inputs=c.build_inputs,
        reference=r.verify_accept,
        oracle=r.verify_accept_oracle,
        outputs=(OutputSpec("output_ids", "exact"), OutputSpec("accept_length", "exact")),
        effects=_no_effects,
        inputs=("target_logits", "draft_tokens", "qo_indptr"),
        doc="greedy (top-1) chain acceptance after the target forward: vocab argmax (lowest index among "
            "equal maxima, NaN the maximum), accept length, bonus token, ids padded with -1",
        # measured on the 2-core CPU: the ci run (31 catalog + 150 generated cases), reference + fused, in 81 s
        interpreter_generated=150,
    )


def register(reg: Registry) -> None:
    from reference import verify_accept as r

    reg.add_op(_spec())
    reg.add(Impl(OP, "reference", "reference", r.verify_accept,
                 doc="six launches: argmax, gather per request, match, cumprod accept length, bonus, ids"))
    reg.add(Impl(OP, "fused", "fused", _fused,
                 doc="one Triton launch: a program per request, vocab argmax per row in chunks, then the walk"))
    reg.add(Impl(OP, "compiled", "compiled", _compiled,
                 doc="torch.compile(dynamic=True) of the reference chain's six launches"))
