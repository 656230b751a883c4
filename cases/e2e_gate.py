"""End-to-end gate data: profiles and thresholds, with the reason for each number.

A path passes when every applicable threshold holds:
  * ``min_agreement``: its speculative output equals the reference path's plain greedy output on
    at least this fraction of problems (bf16 verify vs decode rounding may flip a near-tie argmax
    on a GPU; the CPU reference path agrees on every problem, tested);
  * ``alpha``: the paired exact McNemar test against the reference path does not show it worse at
    this level (seed 000: 0.950 vs 0.949 / 0.945 must pass, 0.950 vs 0.027 must fail);
  * ``min_accuracy`` and ``min_accept_len``: only for trained models (a random-weight model's
    answers are all wrong and its acceptance is whatever prompt lookup gets).

At temperature > 0 (a profile with ``temperature`` > 0: ``sampled``) speculative and plain sampling
cannot agree token for token, only in distribution; a path passes when
  * ``dist_alpha``: the distribution test of its emitted tokens (``harness.e2e.stats.uniformity``:
    every traced token against softmax(logits / T) of the row it was drawn from, exact tests,
    Bonferroni) does not reject at this level — a correct sampler fails with probability <= 1e-6;
  * ``alpha``: the exact McNemar test against plain sampling on the reference path (independent
    samples, paired by problem) does not show it worse;
  * ``min_accuracy`` and ``min_accept_len`` (trained models), the sampled profile's own values.
``min_agreement`` and ``tie_margin`` do not apply (sampled rows write -1 for agreement and ties).
"""
from __future__ import annotations

from dataclasses import dataclass

# the micro-models' layouts (harness.e2e.model: each is the timeline family of that name), by name here so
# that the commands' choices (gate, serve, nightly --layout) import no torch
LAYOUTS = ("dsv4-mqa-ring", "k3-mla-fp8", "qwen35-gqa")


@dataclass(frozen=True)
class Thresholds:
    min_agreement: float = 0.99  # applied to agreement after excusing near-tie divergences (below)
    # A divergence whose first differing token had a top-2 logit margin below this on the reference
    # greedy path is rounding, not a bug: the reference chain's fp32 partials are grouped differently
    # in decode (1 token) and verify (L + 1 tokens), and its one bf16 rounding can flip an argmax
    # whose margin is ~1e-3 (measured on random weights: margins 0.0009-0.0033 at every divergence).
    tie_margin: float = 0.01
    alpha: float = 1e-3  # p below this with the path worse than the reference = regression
    min_accuracy: float = 0.95  # trained models only
    min_accept_len: float = 2.0  # trained models only
    dist_alpha: float = 1e-6  # temperature > 0: the distribution test's level (false alarms per path and layout)


@dataclass(frozen=True)
class GateProfile:
    name: str
    problems: int  # held-out test problems
    max_new: int  # solution tokens generated per problem
    paths: tuple[str, ...]  # "prepare+attn" implementation names, besides the reference path
    path_mutants: tuple[str, ...]  # cases.mutants.timelines path mutants run through the gate
    batch: int  # requests per engine batch
    mutant_kernels: str = "fused+fused"  # prepare+attn implementations the path mutants run on
    thresholds: Thresholds = Thresholds()
    num_kv_splits: int | None = None  # every attention launch's split count (None: the layout family's)
    # op-level mutants ("op/name" registry keys) plugged into the clean fused path of every layout
    # whose path runs that op: the kill matrix's e2e column (``harness.mutants.killmatrix.e2e_column``)
    impl_mutants: tuple[str, ...] = ()
    # problems (the first N of the same list) decoded by the runs that launch Triton kernels (a path whose
    # prepare or attention is not the reference chain); such a row is judged on exactly those problems and
    # says so in its detail. None: every run on every problem
    kernel_problems: int | None = None
    # "module:attr" of the backend (harness.backend.Backend) the paths run through ("": the clean one);
    # the reference path keeps the clean backend. ``gate --backend`` sets it
    backend: str = ""
    # > 0: the sampled gate (module docstring): plain sampling on the reference path is the baseline, every
    # path runs speculative sampling and names its implementation of the sampler op (the op with role
    # "sampler") as "prepare+attn+sampler"
    temperature: float = 0.0
    # temperature > 0: mutants of the sampler op (implementation names) run on mutant_kernels as the sampler
    sampler_mutants: tuple[str, ...] = ()
    # temperature > 0: tokens per request in the distribution test (the first ``record``; a request runs at
    # least this many, past EOS: a fixed count keeps the test exact)
    record: int = 0

    def __post_init__(self):
        if self.kernel_problems is not None and self.kernel_problems < 1:
            raise ValueError(f"kernel_problems: expected None or >= 1, got {self.kernel_problems}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature: expected >= 0, got {self.temperature}")
        parts = 3 if self.temperature > 0 else 2
        for spec in self.paths:
            if len(spec.split("+")) != parts:
                raise ValueError(f"paths: {spec!r} is not {'prepare+attn+sampler' if parts == 3 else 'prepare+attn'} "
                                 f"(temperature {self.temperature})")
        if self.sampler_mutants and not self.temperature > 0:
            raise ValueError(f"sampler_mutants: a greedy profile never samples, got {self.sampler_mutants}")
        if not (0 <= self.record <= self.max_new) or (self.record > 0) != (self.temperature > 0):
            raise ValueError(f"record: expected in [1, max_new = {self.max_new}] at temperature > 0, else 0; "
                             f"got {self.record} at temperature {self.temperature}")


PROFILES = {
    # CPU, Triton interpreter: a fused verify-attention launch costs ~40 ms per program (one per request, layer
    # and step: ~0.3 ms per tl op), so the fused+fused runs decode only the first kernel_problems problems (100
    # would take ~1 h per layout; 3: the whole gate in 4 min 24 s wall with --jobs 2 on 2 idle cores, measured,
    # dsv4's 3 problems 143 s of it; each more problem adds ~40 s); the reference runs and the path mutant take
    # all 100. max_new 200: the longest solution of the first 100 test problems is 188 tokens with EOS (160
    # cut 23 of them, and a cut answer is a wrong one). The path mutant's bug is the backend's store timing,
    # not a kernel's: it runs on the reference kernels (every fused launch goes to the fused+fused path). One
    # KV split: one prefix program per (request, head block) instead of two (the split merge is the parity
    # catalog's to check).
    "cpu-lite": GateProfile("cpu-lite", problems=100, max_new=200, paths=("fused+fused",),
                            path_mutants=("path-store-before-attention",), batch=50,
                            mutant_kernels="reference+reference", num_kv_splits=1,
                            kernel_problems=3),
    # the H200: the numbers (>= 500 problems), one batch per run: a step costs about the same for 100
    # requests as for 600 (launch- and host-bound; the nightly's gate with batches of 100 ran out of its 384 s)
    "full": GateProfile("full", problems=600, max_new=200, paths=("fused+fused",),
                        path_mutants=("path-store-before-attention", "path-stale-rejected-kv"), batch=600),
    # temperature > 0 (docs/gate.md, "The sampled gate"): plain sampling on the reference path is the baseline;
    # speculative sampling through the reference chain and the fused spec_sampling kernel must match it (McNemar)
    # and emit tokens that follow softmax(logits / T) (the distribution test); the residual-from-q sampler must
    # fail. T = 0.8: inside the 0.7-1.0 range engines sample at, and not 1.0, where a temperature applied twice
    # or not at all is no bug (the shipped models are near-deterministic at any of these: ~2e-5-2e-4 nats a
    # token, their sampled text is almost their greedy text). 24 problems, 64 traced tokens each
    # (N = 1,536): on the 2-core CPU ~40-60 s per layout for the four runs (plain, reference, fused sampler,
    # mutant; the sampler is one interpreted program per step at V = 89, the prepare and attention reference
    # kernels); the mutant fails with adjusted p ~1e-3000 (McNemar ~1e-7). No accuracy floor: at 24 problems
    # 0.95 would fail a model of 0.97 one run in twenty; the floor is the greedy gate's (100-600 problems), and
    # McNemar against plain sampling is this gate's accuracy check. Acceptance >= 2.0: the models' sampled
    # acceptance is their greedy one (2.29-2.30 at T = 0.8, measured; the mutant's 1.5-1.7)
    "sampled": GateProfile("sampled", problems=24, max_new=200, paths=("reference+reference+fused",),
                           path_mutants=(), batch=24, mutant_kernels="reference+reference",
                           sampler_mutants=("mutant-residual-from-q",), temperature=0.8, record=64,
                           thresholds=Thresholds(min_accuracy=0.0)),
    # the same on a GPU: every launch fused (prepare, attention, sampler), the problem count
    "sampled-full": GateProfile("sampled-full", problems=600, max_new=200, paths=("fused+fused+fused",),
                                path_mutants=(), batch=600, sampler_mutants=("mutant-residual-from-q",),
                                temperature=0.8, record=64, thresholds=Thresholds(min_accuracy=0.0)),
    # tests
    # tests: a path mutant on the reference kernels (its bug is the backend's, not a kernel's)
    # the kill matrix's e2e column (GPU): every mutant through the gate on a slice of the test split
    "killmatrix": GateProfile("killmatrix", problems=60, max_new=200, paths=(), path_mutants=(), batch=60),
    "smoke": GateProfile("smoke", problems=4, max_new=24, paths=(), path_mutants=("path-store-before-attention",),
                         batch=4, mutant_kernels="reference+reference"),
    # tests: one path under test that ``gate --backend`` runs through (on qwen35-gqa the reference kernels:
    # its prepare is plain projections)
    "smoke-path": GateProfile("smoke-path", problems=4, max_new=24, paths=("fused+reference",), path_mutants=(),
                              batch=4),
    # tests: the sampled gate on random weights (~4 nats a token: real sampling)
    "smoke-sampled": GateProfile("smoke-sampled", problems=4, max_new=24, paths=("reference+reference+fused",),
                                 path_mutants=(), batch=4, mutant_kernels="reference+reference",
                                 sampler_mutants=("mutant-residual-from-q",), temperature=0.8, record=24),
}

MODEL_DIR = "cases/models"  # <layout>.safetensors + .json, written by python -m harness.e2e.train
