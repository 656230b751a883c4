"""Registry entry for ``spec_sampling``: its OpSpec and built-in implementations.

Contract: exact where the uniforms are inputs (``exact`` cases): ``output_ids`` (B, L + 1) and
``accept_length`` (B,) int32 equal the reference chain's element for element
(``reference.spec_sampling.chain``: how each uniform is consumed). Distributional where the
implementation draws its own randomness (``distribution`` cases): ``distribution:output_ids`` and
``distribution:accept_length`` (``cases/spec_sampling/distribution.py``), each failing a correct
implementation with probability at most 1e-6. No buffer is written; every input keeps its bytes.
"""
from __future__ import annotations

from harness.ops import stem_spec
from harness.registry import (
    Deferred,
    DistributionPlan,
    Impl,
    KillPlan,
    OpSpec,
    OutputSpec,
    Registry,
)

OP = "spec_sampling"

# kill matrix: one exact case with rejections at every position (far drafts), one whose chains are all
# accepted (the bonus row), and two distributional cases (the mutants' own randomness)
KILL = KillPlan(clean=("reference", "fused"),
                cases=("far-drafts", "equal-drafts-all-accepted", "dist-far-v8", "dist-near-v16"))


def _exact(case) -> bool:
    return case.mode == "exact"


def _no_effects(case, inputs, oracle):
    return []


def _fused(**kw):
    from fused.spec_sampling import wrapper as f

    return f.spec_sampling(**kw)


def _spec() -> OpSpec:
    return stem_spec(
        OP, case_type="SpecSamplingCase", reference="spec_sampling",
        outputs=(OutputSpec("output_ids", "exact", when=_exact), OutputSpec("accept_length", "exact", when=_exact)),
        effects=_no_effects,
        inputs=("target_logits", "temperature", "draft_probs", "draft_tokens", "uniforms", "seed"),
        doc="chain speculative sampling at temperature > 0: accept draft x with probability min(1, p(x)/q(x)), "
            "else a token from the normalised max(p - q, 0); a bonus from p after a full chain; ids padded with -1",
        kill=KILL,
        distribution=DistributionPlan(applies=Deferred("cases.spec_sampling.distribution:applies"),
                                      batches=Deferred("cases.spec_sampling.distribution:batches"),
                                      verdict=Deferred("cases.spec_sampling.distribution:verdict")),
        role="sampler",  # the sampled gate's speculative sampler (harness.e2e.gate)
        nightly_group="acceptance",  # a light acceptance op: one parity step for the group
        parity_weight=0.5,
        interpreter_generated=60,
    )


def register(reg: Registry) -> None:
    reg.add_op(_spec())
    reg.add(Impl(OP, "reference", "reference", Deferred("reference.spec_sampling.chain:spec_sampling"),
                 doc="seven launches: softmax, gather, accept test, cumprod length, residual, inverse CDF, ids"))
    reg.add(Impl(OP, "fused", "fused", _fused,
                 doc="one Triton launch: per request the online softmax, the walk, the residual and its inverse CDF"))
