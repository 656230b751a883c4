"""compare.* return records that describe what went wrong; the policy decides."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from harness import compare, ops, tolerance

TOL = tolerance.floor("test", "out", torch.bfloat16)


def _oracle(n=1000):
    return torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_correct_rounding_passes_and_records():
    o = _oracle()
    r = compare.numeric("numeric:x", o.to(torch.bfloat16), o, o.to(torch.bfloat16), TOL)
    assert r.passed and r.err <= 1.0 and r.mismatch_frac == 0 and r.nan_inf_mismatch == 0
    assert r.worst.count(":") >= 3  # three worst indices with values


def test_two_ulps_off_fails_with_worst_index():
    """(One ulp off can be the other honest neighbour of a value near a midpoint; two cannot.)"""
    o = _oracle()
    x = o.to(torch.bfloat16)
    x.view(torch.int16)[123] += 2
    r = compare.numeric("numeric:x", x, o, o.to(torch.bfloat16), TOL)
    assert not r.passed and r.worst.startswith("(123,)")


def test_nan_is_a_finite_failure_never_a_precision_failure():
    """A planted NaN: ``finite`` fails naming its position; ``numeric`` measures the finite rest
    (and passes: the other elements are correctly rounded), counting the NaN for information."""
    o = _oracle()
    x = o.to(torch.bfloat16)
    x[7] = float("nan")
    f = compare.finite("finite:x", x, o)
    assert not f.passed and f.nan_inf_mismatch == 1 and f.worst.startswith("(7,): nan/")
    assert "1 of 1000 elements: 1 non-finite where the oracle is finite" in f.detail
    r = compare.numeric("numeric:x", x, o, o.to(torch.bfloat16), TOL)
    assert r.passed and r.nan_inf_mismatch == 1 and "(7,)" not in r.worst and "finite:" in r.detail
    x.view(torch.int16)[123] += 2  # a precision bug beside the NaN is still a numeric failure
    r = compare.numeric("numeric:x", x, o, o.to(torch.bfloat16), TOL)
    assert not r.passed and r.worst.startswith("(123,)")
    o2 = o.clone()
    o2[7] = float("nan")
    assert compare.finite("finite:x", x, o2).passed


def test_all_nan_output_fails_finite_only():
    o = _oracle()
    x = torch.full((1000,), float("nan"))
    f = compare.finite("finite:x", x, o)
    assert not f.passed and f.nan_inf_mismatch == 1000 and f.worst.count(": nan/") == compare.WORST_K
    r = compare.numeric("numeric:x", x, o, None, TOL)
    assert r.passed and r.nan_inf_mismatch == 1000 and r.worst == ""  # nothing finite to measure


def test_infinities_where_the_oracle_has_them_pass():
    o = _oracle()
    o[3], o[5] = float("inf"), float("-inf")
    x = o.to(torch.bfloat16)  # keeps both infinities
    assert compare.finite("finite:x", x, o).passed
    assert compare.numeric("numeric:x", x, o, None, TOL).passed
    y = x.clone()
    y[3] = 1.0  # finite where the oracle is +inf
    f = compare.finite("finite:x", y, o)
    assert not f.passed and f.worst.startswith("(3,): 1/inf") and "1 finite where it is not" in f.detail
    y = x.clone()
    y[5] = float("inf")  # the wrong infinity
    f = compare.finite("finite:x", y, o)
    assert not f.passed and f.worst.startswith("(5,): inf/-inf") and "1 the wrong non-finite value" in f.detail
    assert not compare.finite("finite:x", None, o).passed and not compare.finite("finite:x", x[:-1], o).passed


def test_finite_lists_the_first_positions_in_order():
    o = _oracle(24).reshape(2, 3, 4)
    x = o.clone()
    for i in ((1, 2, 3), (0, 1, 2), (1, 0, 0), (0, 0, 1)):
        x[i] = float("nan")
    f = compare.finite("finite:x", x, o)
    assert f.nan_inf_mismatch == 4 and f.worst.startswith("(0, 0, 1): nan/")
    assert [p.split(":")[0] for p in f.worst.split("  (")[0].split("; ")] == ["(0, 0, 1)", "(0, 1, 2)", "(1, 0, 0)"]


def test_zeros_fail_and_degenerate_oracles_are_refused():
    o = _oracle()
    assert not compare.numeric("numeric:x", torch.zeros(1000), o, None, TOL).passed
    tiny = o * 1e-9
    r = compare.numeric("numeric:x", torch.zeros(1000), tiny, None, TOL)
    assert not r.passed and "degenerate" in r.detail


def test_reference_chain_error_widens_only_by_factor():
    o = _oracle()
    noisy = o + 0.05  # the chain is this bad: an implementation may be up to factor × as bad
    ref_err = compare.numeric("x", noisy, o, None, TOL).err
    r = compare.numeric("x", o + 0.05 * TOL.factor * 0.99, o, noisy, TOL)
    assert r.passed and r.allowed == TOL.factor * ref_err
    assert not compare.numeric("x", o + 0.05 * TOL.factor * 1.5, o, noisy, TOL).passed
    assert not compare.numeric("x", noisy, o, noisy, TOL, is_reference=True).passed  # the chain meets the floor


def test_missing_output_and_wrong_shape_fail():
    o = _oracle()
    assert not compare.numeric("x", None, o, None, TOL).passed
    assert not compare.numeric("x", o[:-1], o, None, TOL).passed


def test_exact_and_untouched():
    a = torch.arange(24, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(6, 4)
    assert compare.exact("exact:a", a.clone(), a).passed
    b = a.clone()
    b.view(torch.uint8)[2, 1] ^= 1
    r = compare.exact("exact:a", b, a)
    assert not r.passed and "(2, 1)" in r.worst
    assert compare.untouched("untouched:a", b, a, torch.tensor([2])).passed
    r = compare.untouched("untouched:a", b, a, torch.tensor([3]))
    assert not r.passed and "rows [2]" in r.worst


def test_empty_tensors_compare_by_shape_and_dtype():
    """0 elements (no tokens, an empty pool): exact, untouched, unchanged and bitwise_equal answer
    instead of failing to reshape no bytes; a shape or dtype difference still fails."""
    for dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.int64):
        a = torch.zeros(0, 3, 5, dtype=dtype)
        assert compare.exact("exact:a", a.clone(), a).passed
        assert not compare.exact("exact:a", torch.zeros(0, 3, 4, dtype=dtype), a).passed
        assert compare.untouched("untouched:a", a.clone(), a, torch.tensor([], dtype=torch.int64)).passed
        assert compare.unchanged("unchanged:a", a.clone(), a).passed
        assert compare.bitwise_equal("determinism", {"x": a}, {"x": a.clone()}).passed
    assert not compare.exact("exact:a", torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.float64)).passed


def test_bitwise_equal():
    a = {"x": torch.ones(3), "y": None}
    assert compare.bitwise_equal("determinism", a, {"x": torch.ones(3), "y": None}).passed
    assert not compare.bitwise_equal("determinism", a, {"x": torch.ones(3) + 1e-7, "y": None}).passed
    assert not compare.bitwise_equal("determinism", a, {"x": torch.ones(3), "y": torch.ones(1)}).passed


def test_every_override_has_a_rationale():
    for key, tol in ops.tolerance_overrides().items():
        assert len(tol.rationale) > 20, key
        assert tol.floor < 2.0, f"{key}: a floor near 2 would let truncation through"


def test_precision_classes_are_data_with_rationales():
    """Every class says why it is honest and what the chain emulates; exact-fp32 is the empty set."""
    assert tolerance.EXACT in tolerance.PRECISION_CLASSES
    for name, cls in tolerance.PRECISION_CLASSES.items():
        assert len(cls.rationale) > 20 and cls.emulation, name
    assert tolerance.parse_precision("exact-fp32") == frozenset()
    assert tolerance.parse_precision("bf16-p+fp8-q") == {"bf16-p", "fp8-q"}
    assert tolerance.canonical_precision("fp8-q+bf16-p") == tolerance.canonical_precision("bf16-p+fp8-q") == \
        "bf16-p+fp8-q"
    assert tolerance.canonical_precision("exact-fp32") == "exact-fp32"


def test_unknown_precision_names_are_named():
    import pytest

    for bad, words in (("bf16-p+bf16-v", "['bf16-v']"), ("", "['']"), ("bf16-p+exact-fp32", "['exact-fp32']"),
                       ("fp8-q+fp8-q", "named twice")):
        with pytest.raises(ValueError) as info:
            tolerance.parse_precision(bad)
        assert words in str(info.value), (bad, str(info.value))


def test_topk_unique_only_answers_when_every_algorithm_agrees():
    """``compare._topk_unique`` (the worst elements off the CPU): when it answers, a stable sort
    gives the same indices in the same order; with a tie at or above the k-th value it defers
    (None) to the CPU's own tie order."""
    g = torch.Generator().manual_seed(1)
    answered = deferred = 0
    for n, k, levels in ((50, 3, 1000), (50, 3, 4), (8, 3, 2), (200, 1, 3), (5, 3, 10 ** 6)):
        for _ in range(40):
            flat = torch.randint(0, levels, (n,), generator=g).double()
            got = compare._topk_unique(flat, k)
            v = torch.sort(flat, descending=True, stable=True)
            tied = (flat >= v.values[k - 1]).sum() > k or (v.values[:k - 1] == v.values[1:k]).any()
            if got is None:
                assert tied
                deferred += 1
            else:
                assert not tied and got == v.indices[:k].tolist()
                answered += 1
    assert answered and deferred
    zeros = torch.zeros(10, dtype=torch.float64)  # an exact output: every scaled error 0
    assert compare._topk_unique(zeros, 3) is None


def _same_record(a: compare.Record, b: compare.Record) -> bool:
    nan = lambda v: "nan" if isinstance(v, float) and v != v else v  # noqa: E731
    return [nan(v) for v in dataclasses.astuple(a)] == [nan(v) for v in dataclasses.astuple(b)]


@pytest.mark.gpu
def test_records_on_the_gpu_equal_the_cpus():
    """The checks compute on the checked tensor's device: every field of every record is what the
    CPU gives for the same values, ties among the worst elements (an exact output: every scaled
    error 0), NaN/±Inf placements, degenerate oracles and wrong shapes included."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(2)
    n = 0
    for trial in range(120):
        shape = [(7,), (3, 5), (2, 3, 4), (64,), (16, 8, 64)][trial % 5]
        dt = [torch.bfloat16, torch.float16, torch.float32][trial % 3]
        tol = tolerance.floor("test", "out", dt)
        o = torch.randn(shape, generator=g, dtype=torch.float64)
        if trial % 7 == 0:
            o = o.round()  # exact outputs: all-tied errors
        if trial % 13 == 4:
            o = o * 1e-9  # degenerate
        x = o.to(dt) if trial % 4 != 1 else (o + 0.01 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dt)
        if trial % 5 == 2:
            x.view(-1)[0], x.view(-1)[-1], o.view(-1)[1] = float("nan"), float("-inf"), float("inf")
        if trial % 11 == 3:
            o.view(-1)[2] = float("nan")
        r = None if trial % 3 == 0 else o[..., :1].to(dt) if trial % 9 == 1 else o.to(dt)
        xs = [x, x[..., :1] if x.dim() > 1 else x[:-1]] if trial % 17 == 5 else [x]
        for xx in xs:
            assert _same_record(compare.finite("f", xx.to(dev), o), compare.finite("f", xx, o)), trial
            for ref_chain in (True, False):
                assert _same_record(compare.numeric("n", xx.to(dev), o, r, tol, is_reference=ref_chain),
                                    compare.numeric("n", xx, o, r, tol, is_reference=ref_chain)), trial
            n += 1
        b = torch.randint(0, 255, (10, 4), generator=g, dtype=torch.uint8)
        b2 = b.clone()
        b2[trial % 10, trial % 4] ^= trial % 2
        rows = torch.tensor([trial % 10, (3 * trial) % 10]) if trial % 3 else torch.empty(0, dtype=torch.long)
        assert _same_record(compare.exact("e", b2.to(dev), b), compare.exact("e", b2, b))
        assert _same_record(compare.untouched("u", b2.to(dev), b, rows), compare.untouched("u", b2, b, rows))
        assert _same_record(compare.unchanged("c", b2.to(dev), b.to(dev)), compare.unchanged("c", b2, b))
    assert n >= 120


def test_untouched_checks_the_bytes_a_written_row_does_not_own():
    """``written_bytes``: a listed row may change only its marked bytes (a paged cache's page holds
    other tokens' records and pad bytes). PLANT: one unmarked byte of a written row changed."""
    before = torch.arange(24, dtype=torch.uint8).reshape(3, 8)
    owned = torch.zeros(1, 6, dtype=torch.bool)
    owned[0, 1:4] = True
    after = before.clone()
    after[1, 1:4] = 200  # the owned bytes: fine
    assert compare.untouched("u", after, before, torch.tensor([1]), written_bytes=owned).passed
    for col in (0, 4, 7):  # before, after the marked bytes, and past the mask's width
        bad = after.clone()
        bad[1, col] ^= 1
        rec = compare.untouched("u", bad, before, torch.tensor([1]), written_bytes=owned)
        assert not rec.passed and "do not own" in rec.detail, col
    assert compare.untouched("u", bad, before, torch.tensor([1])).passed  # whole rows: no byte of row 1 checked


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=0, max_size=4), data=st.data())
def test_worst_indices_are_torch_unravel_index(shape, data):
    """The records' worst-element indices name the element ``torch.unravel_index`` names (planted:
    column-major order, or dropping a unit dimension, fails)."""
    n = 1
    for d in shape:
        n *= d
    i = data.draw(st.integers(0, n - 1))
    assert compare._idx(i, shape) == tuple(int(v) for v in torch.unravel_index(torch.tensor(i), shape))


def test_where_a_check_computes(monkeypatch):
    """``VP_COMPARE_ON``: ``device`` keeps a check on the tensor's device, ``cpu`` moves it, ``auto``
    moves only tensors of at most AUTO_CPU_ELEMENTS elements (a meta tensor stands in for a GPU's
    here). Planted: ``auto`` with the threshold's sense inverted, or the variable not read, fails."""
    small = torch.empty(compare.AUTO_CPU_ELEMENTS, device="meta")
    big = torch.empty(compare.AUTO_CPU_ELEMENTS + 1, device="meta")
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert [compare.home(t, "auto") for t in (small, big)] == [cpu, meta]
    assert [compare.home(t, "device") for t in (small, big)] == [meta, meta]
    assert [compare.home(t, "cpu") for t in (small, big)] == [cpu, cpu]
    assert compare.home(torch.empty(3), "device") == cpu
    monkeypatch.setenv("VP_COMPARE_ON", "auto")
    assert compare.home(small) == cpu and compare.home(big) == meta
    monkeypatch.delenv("VP_COMPARE_ON")
    assert compare.home(small) == meta  # the default: the tensor's own device
    with pytest.raises(ValueError, match="VP_COMPARE_ON: expected device, cpu or auto"):
        compare.home(small, "gpu")


def test_exact_prints_integer_outputs_as_integers():
    """An int32 output (ids, lengths) that differs is reported by its values, ``got != want`` per element, not
    by its bytes; fp8 and float outputs keep their bytes (the bytes are their contract). Planted: before, the
    int32 detail read ``(0, 2): [7, 0, 0, 0] != [255, 255, 255, 255]``."""
    want = torch.tensor([[1, 2, -1], [3, 4, 5]], dtype=torch.int32)
    got = want.clone()
    got[0, 2], got[1, 0] = 7, -300
    r = compare.exact("exact:output_ids", got, want)
    assert not r.passed and r.worst == "(0, 2): 7 != -1; (1, 0): -300 != 3  (got/want)", r.worst
    assert r.detail == "2 of 6 elements differ"
    q = torch.tensor([1.0, 2.0], dtype=torch.float8_e4m3fn)
    r = compare.exact("exact:q8", torch.tensor([2.0, 1.0], dtype=torch.float8_e4m3fn), q)
    assert r.worst.startswith("(0,): [") and r.detail == "2 bytes differ", r


def test_same_each_answers_per_group_with_small_tensors_together_and_large_ones_alone():
    """``compare.same_each``: a byte that differs anywhere (a small tensor among several compared as one byte
    vector, a tensor past ``SAME_TOGETHER_BYTES`` compared alone, NaN payloads and -0.0 by their bytes), a shape,
    dtype or presence that differs, or unequal non-tensors make only its own group differ; a memo keeps the b
    side's bytes and still sees a changed a side."""
    big = torch.zeros(compare.SAME_TOGETHER_BYTES // 4 + 1)
    small = [torch.arange(5.0), torch.tensor([1, 2], dtype=torch.int64), torch.ones(3, dtype=torch.bool)]
    pairs = [(t, t.clone()) for t in small] + [(big, big.clone()), (None, None), (3, 3)]
    assert compare.same(pairs)

    def changed(k, fn):
        out = [(a, b.clone() if isinstance(b, torch.Tensor) else b) for a, b in pairs]
        fn(out[k][1])
        return out

    groups = [pairs, changed(0, lambda b: b.__setitem__(4, -1.0)), changed(3, lambda b: b.__setitem__(-1, 1.0)),
              changed(1, lambda b: b.__setitem__(0, 7)), [(torch.tensor([0.0]), torch.tensor([-0.0]))],
              [(torch.tensor([float("nan")]), torch.tensor([float("nan")]).view(torch.int32).add(1).view(torch.float32))],
              [(torch.zeros(2), torch.zeros(3))], [(torch.zeros(2), torch.zeros(2, dtype=torch.float64))],
              [(torch.zeros(2), None)], [(3, 4)], []]
    assert compare.same_each(groups) == [True, False, False, False, False, False, False, False, False, False, True]
    memo: dict = {}
    assert compare.same(pairs, memo=memo) and memo
    a0 = pairs[0][0].clone()
    a0[2] = 9.0
    assert not compare.same([(a0, pairs[0][1])] + pairs[1:], memo=memo)


def test_the_numeric_checks_nan_inf_placement_equals_the_finite_checks():
    """``finite_numeric_check`` counts the NaN/±Inf placement from its masks (``special_mismatch`` with
    ``both``); every pair of value classes gives what the three-way NaN, +Inf, -Inf comparison gives."""
    import itertools

    vals = [0.0, -0.0, 1.5, -2.0, float("inf"), float("-inf"), float("nan")]
    x, o = (torch.tensor(v, dtype=torch.float64) for v in zip(*itertools.product(vals, vals)))
    both = (x.abs() < float("inf")) & (o.abs() < float("inf"))
    assert torch.equal(compare.special_mismatch(x, o, both), compare.special_mismatch(x, o))
    assert int(compare.special_mismatch(x, o).sum()) == 49 - 16 - 3  # all but finite pairs and equal specials
