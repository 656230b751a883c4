"""The gate's statistics (scipy): an exact binomial interval for accuracy and the exact
McNemar test on paired outcomes (the same problems under two paths).

McNemar: of the problems where the two paths disagree on correctness, ``worse`` = reference
right / path wrong and ``better`` = the reverse. Under "no difference" each discordant problem is
a fair coin, so the two-sided p-value is ``binomtest(worse, worse + better, 0.5)``; no discordant
problem at all gives p = 1. Concordant problems carry no information about the difference.
"""
from __future__ import annotations

from dataclasses import dataclass

from scipy.stats import binomtest


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
