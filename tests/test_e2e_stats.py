"""The gate's statistics on constructed paired outcomes."""
from __future__ import annotations

import pytest

from harness.e2e import stats


def _pairs(n, ref_correct, path_correct, both):
    """n problems: the first ``both`` right on both; then reference-only and path-only right ones."""
    ref = [True] * both + [True] * (ref_correct - both) + [False] * (n - ref_correct)
    path = [True] * both + [False] * (ref_correct - both) + [True] * (path_correct - both) \
        + [False] * (n - ref_correct - (path_correct - both))
    assert len(ref) == len(path) == n and sum(ref) == ref_correct and sum(path) == path_correct
    return ref, path


def test_seed_000_collapse_is_significant():
    ref, path = _pairs(1000, 950, 27, 27)  # 0.950 -> 0.027
    m = stats.mcnemar(ref, path)
    assert m.worse == 923 and m.better == 0 and m.p_value < 1e-6


def test_seed_000_noise_is_not():
    ref, path = _pairs(1000, 950, 949, 940)  # 0.950 vs 0.949: 10 worse, 9 better
    m = stats.mcnemar(ref, path)
    assert (m.worse, m.better) == (10, 9) and m.p_value > 0.5
    ref, path = _pairs(1000, 950, 945, 930)  # 0.950 vs 0.945
    assert stats.mcnemar(ref, path).p_value > 0.05


def test_identical_outcomes_p_is_one():
    ref = [True, False, True, True]
    assert stats.mcnemar(ref, list(ref)) == stats.McNemar(0, 0, 1.0)


def test_small_difference_is_exact_binomial():
    ref, path = _pairs(20, 10, 5, 5)  # five discordant, all one way: p = 2 / 2^5
    assert stats.mcnemar(ref, path).p_value == pytest.approx(2 / 32)
    with pytest.raises(ValueError):
        stats.mcnemar([True], [True, False])


def test_accuracy_interval():
    a = stats.accuracy([True] * 95 + [False] * 5)
    assert a.value == 0.95 and a.lo < 0.95 < a.hi and 0.88 < a.lo and a.hi < 0.99
    assert stats.accuracy([True] * 10).hi == 1.0
    wide, narrow = stats.accuracy([True, False] * 10), stats.accuracy([True, False] * 500)
    assert wide.hi - wide.lo > narrow.hi - narrow.lo
