"""The gate's statistics (scipy): an exact binomial interval for accuracy, the exact McNemar test
on paired outcomes (the same problems under two paths), and at temperature > 0 the distribution
test of the emitted tokens.

McNemar: of the problems where the two paths disagree on correctness, ``worse`` = reference
right / path wrong and ``better`` = the reverse. Under "no difference" each discordant problem is
a fair coin, so the two-sided p-value is ``binomtest(worse, worse + better, 0.5)``; no discordant
problem at all gives p = 1. Concordant problems carry no information about the difference. At
temperature > 0 the two runs are independent samples, paired by problem: under "same
distribution" a problem's two outcomes are independent draws of one coin, so a discordant pair is
still a fair coin and the test stays exact.

Distribution test (``pit``, ``uniformity``). Each traced token x was drawn (if the sampler is
right) from p = softmax(row / T) of the logits row it was sampled from, given everything before it.
Its randomised probability integral transform U = F(x−) + V·p(x), F the cumulative sum of p in a
fixed order and V ~ U(0, 1) an independent draw, is then exactly U(0, 1) given the past, so the U of
a run's traced tokens are independent U(0, 1) (Rosenblatt 1952) — whatever p each step has, and
however the steps depend on each other. The order puts the step's draft first (then the other
tokens by decreasing p; no draft: by decreasing p), so U < p(draft) exactly when the draft was
emitted: a sampler that emits the draft too often (a residual taken from q) piles U near 0. The
order depends only on the past, so the exactness holds. Tests on the N values (N fixed: the
first ``record`` tokens of every request), all exact:

  * ``BINS`` equal-width bins: each count ~ Binomial(N, 1 / BINS), two-sided (scipy's binomial
    tails, p = min(1, 2 · min(P(X' <= x), P(X' >= x))));
  * low: S = Σ −log U ~ Gamma(N, 1), p = P(Gamma >= S) (U too small: the draft, or the most
    probable tokens, emitted too often);
  * high: S' = Σ −log(1 − U) ~ Gamma(N, 1), p = P(Gamma >= S') (the improbable tokens too often).

K = BINS + 2 tests, Bonferroni: the run fails when min K · p <= alpha, so a correct sampler fails
with probability at most alpha whatever the dependence between the K tests. p is computed in fp64
from the fp32 row the sampler was handed; an fp32 sampler's own rounding (~1e-7 relative) moves an
expected count by far less than one token at these N.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats as sps
from scipy.stats import binomtest

BINS = 10


@dataclass(frozen=True)
class Accuracy:
    correct: int
    n: int
    lo: float  # 95 % Clopper-Pearson interval
    hi: float

    @property
    def value(self) -> float:
        return self.correct / self.n if self.n else float("nan")


@dataclass(frozen=True)
class McNemar:
    worse: int  # reference right, path wrong
    better: int  # reference wrong, path right
    p_value: float


def accuracy(outcomes: list[bool], confidence: float = 0.95) -> Accuracy:
    n, k = len(outcomes), sum(bool(x) for x in outcomes)
    if n == 0:
        return Accuracy(0, 0, float("nan"), float("nan"))
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return Accuracy(k, n, float(ci.low), float(ci.high))


def mcnemar(reference: list[bool], path: list[bool]) -> McNemar:
    if len(reference) != len(path):
        raise ValueError(f"paired outcomes: {len(reference)} reference vs {len(path)} path")
    worse = sum(bool(r) and not bool(p) for r, p in zip(reference, path))
    better = sum(bool(p) and not bool(r) for r, p in zip(reference, path))
    if worse + better == 0:
        return McNemar(0, 0, 1.0)
    return McNemar(worse, better, float(binomtest(worse, worse + better, 0.5).pvalue))


@dataclass(frozen=True)
class Uniformity:
    """The distribution test of one run's traced tokens (module docstring)."""
    tokens: int  # N
    tests: int  # K
    log10_p: float  # log10 of the smallest Bonferroni-adjusted p-value min(1, K · p): the verdict's number
    worst: str  # that test, with its count or statistic and its expectation

    def passed(self, alpha: float) -> bool:
        return self.log10_p > math.log10(alpha)


def pit(traces, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """Randomised PIT of every traced token (``harness.e2e.engine.Trace``), in trace order: (N,) float64
    in [0, 1]. p = softmax(row / T) in fp64; order: the draft first (where there is one), then by
    decreasing p (ties by id)."""
    if not traces:
        return np.zeros(0)
    x = torch.cat([t.tokens for t in traces]).long()
    d = torch.cat([t.drafts for t in traces]).long()
    rows = torch.cat([t.logits for t in traces]).double()
    p = torch.softmax(rows / temperature, dim=-1)  # (N, V) fp64
    key = -p
    has = d >= 0
    key[has, d[has]] = -2.0  # below every -p: the draft sorts first
    order = torch.sort(key, dim=-1, stable=True).indices
    ranked = p.gather(-1, order)
    rank = torch.argsort(order, dim=-1).gather(-1, x[:, None])[:, 0]  # x's place in the order
    before = (ranked.cumsum(-1) - ranked).gather(-1, rank[:, None])[:, 0]  # F(x-)
    px = p.gather(-1, x[:, None])[:, 0]
    v = torch.from_numpy(rng.random(len(x)))
    return (before + v * px).clamp(0.0, 1.0).numpy()


def _log_binom_tail(c: int, n: int, pi: float) -> float:
    """log of the smaller one-sided tail of Binomial(n, pi) at c, exact (scipy); where that underflows
    (p below ~1e-308) the Chernoff bound exp(−n · KL(c/n ‖ pi)), an upper bound: finite and never
    smaller than the true tail, so never a stronger verdict."""
    lp = min(float(sps.binom.logcdf(c, n, pi)), float(sps.binom.logsf(c - 1, n, pi)))
    if lp > -math.inf:
        return lp
    a = c / n
    kl = sum(x * math.log(x / y) for x, y in ((a, pi), (1 - a, 1 - pi)) if x > 0)
    return -n * kl


def _log_gamma_sf(s: float, n: int) -> float:
    """log P(Gamma(n, 1) >= s), exact (scipy); where that underflows, the Chernoff bound
    exp(−(s − n)) · (s / n)^n (an upper bound, as above)."""
    lp = float(sps.gamma.logsf(s, n))
    return lp if lp > -math.inf else -(s - n) + n * math.log(s / n)


def uniformity(u: np.ndarray, bins: int = BINS) -> Uniformity:
    """The K = bins + 2 exact tests of ``u`` against independent U(0, 1) (module docstring), Bonferroni."""
    n = len(u)
    K = bins + 2
    if n == 0:
        return Uniformity(0, K, 0.0, "no tokens")
    counts = np.bincount(np.minimum((u * bins).astype(np.int64), bins - 1), minlength=bins)
    ln2 = math.log(2.0)
    logp, labels = [], []
    for b, c in enumerate(counts):
        logp.append(min(0.0, ln2 + _log_binom_tail(int(c), n, 1 / bins)))
        labels.append(f"bin [{b / bins:.1f}, {(b + 1) / bins:.1f}): {c} of {n}, expected {n / bins:.1f}")
    tiny = np.finfo(np.float64).tiny  # U = 0 only for a token of probability 0: -log U stays finite
    for name, s in (("low: sum -log U", float(-np.log(np.maximum(u, tiny)).sum())),
                    ("high: sum -log(1 - U)", float(-np.log(np.maximum(1 - u, tiny)).sum()))):
        logp.append(_log_gamma_sf(s, n))
        labels.append(f"{name} = {s:.1f}, expected {n} (sd {math.sqrt(n):.1f})")
    adj = np.minimum(0.0, np.array(logp) + math.log(K))
    i = int(np.argmin(adj))
    return Uniformity(n, K, float(adj[i] / math.log(10)), labels[i])
