"""Registry entry for ``verify_accept``: its OpSpec and built-in implementations.

Contract: exact. ``output_ids`` (B, L + 1) and ``accept_length`` (B,) int32 equal the reference
chain's element for element (``reference.verify_accept.chain``: the argmax rule, padding requests).
No buffer is written in place, so there are no effects; every input must keep its bytes.
"""
from __future__ import annotations

import functools

from harness.ops import stem_spec
from harness.registry import Deferred, GpuPlan, Impl, KillPlan, OpSpec, OutputSpec, Registry

OP = "verify_accept"

# kill matrix: the targeted catalog subset, one case per mutant's bug (a rejected draft, the bonus row
# after a mismatch at real vocabulary size, planted tied maxima, strided logits rows), and one timeline: its
# accept(n) step runs the op, so an n off by one shows in the KV truth too (the bonus, ties and strides do
# not: the timeline's logits have one maximum per row, contiguous)
KILL = KillPlan(clean=("reference", "fused"),
                cases=("none-accepted", "llama2-b4-l4-v32000", "ties-planted", "strided-rows"),
                timelines=("qwen35-gqa/width-4-reject",))

STAGES = ("row_argmax", "gather_targets", "match", "accept_lengths", "bonus_tokens", "output_ids")


# GPU-only checks (harness.gpu.runners): the fused call's two launches (the split argmax, then the combine
# and the walk), the chain's six. Both are captured: the only syncs are validate's host copies, which
# ``capture_safe`` turns off after the validated eager call (the fused call's workspace is an allocation, the
# chain is gathers, compares and a cumprod on device). No dispatch gate (the fused call always launches its
# kernels): the graph check's gate row is a skip
GPU = GpuPlan(("b8-l3-v8192-mixed",), "b64-l4-v160k", 2, STAGES, lambda c, kw: len(STAGES), "verify_accept")


def _no_effects(case, inputs, oracle):
    return []


def _fused(**kw):
    from fused.verify_accept import wrapper as f

    return f.verify_accept(**kw)


@functools.cache
def _compiled_chain():
    import torch

    from reference.verify_accept import chain as r

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
    from reference.verify_accept import chain as r

    B, L, _ = r.validate(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr)
    out, n = _compiled_chain()(target_logits, draft_tokens.view(B, L), qo_indptr)
    return {"output_ids": out, "accept_length": n}


def _spec() -> OpSpec:
    return stem_spec(
        OP, case_type="VerifyAcceptCase", reference="verify_accept",
        outputs=(OutputSpec("output_ids", "exact"), OutputSpec("accept_length", "exact")),
        effects=_no_effects,
        inputs=("target_logits", "draft_tokens", "qo_indptr"),
        doc="greedy (top-1) chain acceptance after the target forward: vocab argmax (lowest index among "
            "equal maxima; NaN the maximum, or -inf for an implementation declaring nan_policy='ignore'), accept "
            "length, bonus token, ids padded with -1",
        # the argmax's NaN rule an implementation declares (Impl.nan_policy): "max" as torch.argmax (the
        # default), "ignore" as vLLM's greedy sampler (NaN taken as -inf); reference/verify_accept/chain.py
        # (reference/verify_accept/chain.py's NAN_POLICIES, by name: this declaration imports no torch)
        nan_policies={p: {"nan_policy": p} for p in ("max", "ignore")},
        kill=KILL,
        gpu=GPU,
        role="accept",  # the accept(n) step of every timeline: its n is what the backend rolls back to
        nightly=True,  # a parity op: the nightly runs its parity step
        nightly_group="acceptance",  # the light acceptance ops share one parity step
        # per case it is cheap beside the float ops (integer outputs compared exactly: no rounded chains for
        # an allowance, no buffers to canary): half their workers, i.e. 1 of the 16-core host's parity
        # processes (harness.nightly.plan.parity_jobs), which keeps the concurrent steps within 2 x the cores
        parity_weight=0.5,
        # measured on the 2-core CPU: the ci run (31 catalog + 150 generated cases), reference + fused, in 81 s
        interpreter_generated=150,
    )


def register(reg: Registry) -> None:
    reg.add_op(_spec())
    reg.add(Impl(OP, "reference", "reference", Deferred("reference.verify_accept.chain:verify_accept"),
                 doc="six launches: argmax, gather per request, match, cumprod accept length, bonus, ids"))
    reg.add(Impl(OP, "fused", "fused", _fused,
                 doc="two Triton launches: the vocab argmax split over (row, chunk) programs, then per request the "
                     "combine of its chunks and the walk"))
    reg.add(Impl(OP, "compiled", "compiled", _compiled,
                 doc="torch.compile(dynamic=True) of the reference chain's six launches"))
