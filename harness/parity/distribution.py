"""The distributional check of sampling ops (``OpSpec.distribution``): an implementation that draws its
own randomness cannot be compared token for token, only in distribution.

``run`` calls the implementation on each batch of trials the op's plan builds (its requests
repeated, fresh draws, a seed per call), once, and hands every (inputs, outputs) pair to the plan's
``verdict``; ``distribution:<output>`` records come back. It never reruns: a failure is a failure.

The statistics (``binomial_tests``) are exact, not asymptotic: each tested count X of m trials with
the known probability π is one two-sided binomial test, rejected when P(X' <= X) or P(X' >= X)
(X' ~ Binomial(m, π), scipy's exact tails) is at most alpha / (2K), K the number of tests in the
record's family. By Bonferroni's inequality a correct implementation fails a record with
probability at most alpha, whatever the dependence between the tests, with no large-sample
approximation — conditional on m, which may itself be random (a token's count among the trials
that reached its position), because the test is exact for every m.
"""
from __future__ import annotations

import math
import traceback
from dataclasses import dataclass

import numpy as np
import torch

from harness import compare
from harness.devices import Device, synchronize
from harness.registry import Impl, OpSpec

# the probabilities a kernel computes in fp32 are known to about this much: a tested π is kept in
# [PI_FLOOR, 1 - PI_FLOOR], so a token of probability 0 in fp64 that fp32 rounding makes possible
# (or an acceptance certain in fp64 that rounding makes almost certain) is no false alarm
PI_FLOOR = 1e-6


@dataclass(frozen=True)
class Test:
    """One count to test: ``count`` of ``trials`` against probability ``prob``; ``label`` says which."""
    label: str
    count: int
    trials: int
    prob: float


def p_values(tests: list[Test]) -> np.ndarray:
    """Two-sided exact binomial p-values, min(1, 2 · min(P(X' <= x), P(X' >= x))), one per test."""
    # imported here: scipy.stats costs 0.7 s of every CLI start (list, each run worker's) otherwise
    from scipy import stats

    if not tests:
        return np.zeros(0)
    x = np.array([t.count for t in tests], dtype=np.int64)
    m = np.array([t.trials for t in tests], dtype=np.int64)
    pi = np.clip(np.array([t.prob for t in tests], dtype=np.float64), PI_FLOOR, 1 - PI_FLOOR)
    lower = stats.binom.cdf(x, m, pi)
    upper = stats.binom.sf(x - 1, m, pi)
    return np.minimum(1.0, 2 * np.minimum(lower, upper))


def binomial_tests(check: str, tests: list[Test], alpha: float, *, detail: str = "") -> compare.Record:
    """One record for a family of tests, Bonferroni over them: passed iff every p-value > alpha / K.
    ``err`` = −log10 of the smallest adjusted p-value (K · p), ``allowed`` = −log10(alpha); ``worst``
    the three smallest, each 'label: count/trials, expected E'."""
    K = len(tests)
    if K == 0:
        return compare.Record(check, True, err=0.0, allowed=-math.log10(alpha), detail=f"no tests; {detail}")
    pv = p_values(tests)
    adj = np.minimum(1.0, pv * K)
    order = np.argsort(adj)[:3]
    worst = "; ".join(f"{tests[i].label}: {tests[i].count}/{tests[i].trials}, expected "
                      f"{tests[i].trials * tests[i].prob:.1f} (adjusted p {adj[i]:.2g})" for i in order)
    smallest = float(adj[order[0]])
    return compare.Record(check, bool(smallest > alpha), err=-math.log10(max(smallest, 1e-300)),
                          allowed=-math.log10(alpha), mismatch_frac=float((pv * K <= alpha).mean()),
                          worst=worst, detail=f"{K} exact binomial tests, Bonferroni at alpha {alpha:g}; {detail}",
                          extra={"tests": K, "min_adjusted_p": smallest})


def _host(d: dict) -> dict:
    return {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def run(spec: OpSpec, impl: Impl, case, dev: Device) -> list[compare.Record]:
    """The distributional records of ``impl`` on ``case`` (empty when the op has no plan or the case
    is not one of its distributional cases). A crash is a failed ``distribution`` record."""
    plan = spec.distribution
    if plan is None or not plan.applies(case):
        return []
    try:
        pairs = []
        for inputs in plan.batches(case, dev):
            out = impl.fn(**inputs)
            synchronize(dev)
            pairs.append((_host(inputs), _host(dict(out))))
        return list(plan.verdict(case, pairs, plan.alpha))
    except Exception as exc:
        return [compare.Record("distribution", False,
                               detail=traceback.format_exception_only(type(exc), exc)[-1].strip())]
