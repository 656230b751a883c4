"""Index-value checks in one host sync (``reference.checks.check_index_values``) and the fused
wrappers' ``checked`` switch (``reference.checks.values_checked``)."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import checks


def _sequential(specs) -> tuple | None:
    """What check_index_range then check_unique raise, spec after spec: (class, arg, message) or None."""
    try:
        for arg, idx, low, high, allow_neg, unique in specs:
            checks.check_index_range(arg, idx, low=low, high=high, allow_negative_padding=allow_neg)
            if unique:
                checks.check_unique(arg, idx, ignore_negative=allow_neg)
    except checks.VerifyParityInputError as e:
        return type(e), e.arg, str(e)
    return None


def _fused(specs) -> tuple | None:
    try:
        checks.check_index_values(*specs)
    except checks.VerifyParityInputError as e:
        return type(e), e.arg, str(e)
    return None


@st.composite
def _specs(draw):
    out = []
    for k in range(draw(st.integers(1, 3))):
        high = draw(st.integers(1, 12))
        vals = draw(st.lists(st.integers(-3, high + 1), max_size=10))
        dtype = draw(st.sampled_from((torch.int32, torch.int64)))
        out.append((f"idx{k}", torch.tensor(vals, dtype=dtype), 0, high, draw(st.booleans()), draw(st.booleans())))
    return out


@settings(max_examples=300, deadline=None)
@given(_specs())
def test_one_sync_check_raises_what_the_sequential_checks_raise(specs):
    assert _fused(specs) == _sequential(specs)


def test_duplicates_far_apart_and_padding_twice():
    far = torch.tensor([3, 0, 1, 2, 3])  # the twins are not neighbours: only a sorted scan finds them
    assert _fused([("loc", far, 0, 8, True, True)])[1] == "loc"
    pads = torch.tensor([-1, 2, -1, -5, 4])  # padding may repeat
    assert _fused([("loc", pads, 0, 8, True, True)]) is None
    assert _fused([("slot_map", pads, 0, 8, False, True)])[0] is checks.RangeError  # no padding: -1 is out of range


@pytest.mark.parametrize("env, checked, expected", [
    (None, None, True), ("0", None, False), ("off", None, False), ("1", None, True),
    ("0", True, True), (None, False, False)])
def test_values_checked_switch(monkeypatch, env, checked, expected):
    if env is None:
        monkeypatch.delenv(checks.CHECK_VALUES_ENV, raising=False)
    else:
        monkeypatch.setenv(checks.CHECK_VALUES_ENV, env)
    assert checks.values_checked(checked) is expected


def test_values_unchecked_reads_no_values_and_ends_with_its_block():
    """Inside ``values_unchecked`` (what ``harness.gpu.runners.capture_safe`` uses: a call as a CUDA graph
    replays it) an out-of-range or duplicate index passes every value check; before and after, each
    raises. Planted: a check that ignores the switch raises inside the block."""
    idx = torch.tensor([0, 7, 7])
    calls = (lambda: checks.check_index_range("loc", idx, low=0, high=4),
             lambda: checks.check_unique("loc", idx),
             lambda: checks.check_index_values(("loc", idx, 0, 4, False, True)))
    for call in calls:
        with pytest.raises(checks.RangeError):
            call()
    with checks.values_unchecked():
        assert not checks.values_read()
        for call in calls:
            call()
    assert checks.values_read()
    for call in calls:
        with pytest.raises(checks.RangeError):
            call()


def test_checked_must_be_a_bool():
    with pytest.raises(checks.DTypeError, match="checked"):
        checks.values_checked("False")


def _qk_decode_inputs(device):
    from cases.qk_norm_rope import catalog as c

    kw = c.build_inputs(c.QkNormRopeCase(T=4, H=2, D=64, R=32, mode="decode", seed=3), device)
    kw.pop("forward_mode")
    return kw


def test_qk_wrapper_checks_values_by_default_and_skips_them_when_told(device, monkeypatch):
    """A duplicate slot (memory-safe to launch): refused, naming loc, with the ring untouched, by
    default; launched when the caller vouches for the values (``checked=False`` or the env)."""
    from fused.qk_norm_rope import wrapper as f

    kw = _qk_decode_inputs(device)
    kw["loc"][1] = kw["loc"][0]
    before = kw["ring"].clone()
    monkeypatch.delenv(checks.CHECK_VALUES_ENV, raising=False)
    with pytest.raises(checks.RangeError, match="loc: duplicate"):
        f.qk_norm_rope(**kw)
    assert torch.equal(kw["ring"], before)
    f.qk_norm_rope(**copy.deepcopy(kw), checked=False)
    monkeypatch.setenv(checks.CHECK_VALUES_ENV, "0")
    f.qk_norm_rope(**copy.deepcopy(kw))
    with pytest.raises(checks.RangeError, match="loc"):
        f.qk_norm_rope(**kw, checked=True)
    bad_shape = {**kw, "positions": kw["positions"][:-1]}
    with pytest.raises(checks.ShapeError, match="positions"):  # shapes stay checked without the values
        f.qk_norm_rope(**bad_shape, checked=False)


def test_verify_accept_wrapper_takes_checked(device):
    from cases.verify_accept import catalog as vc
    from fused.verify_accept import wrapper as fv

    spec_case = vc.catalog()[0]
    kw = vc.build_inputs(spec_case, device)
    a = fv.verify_accept(**kw)
    b = fv.verify_accept(**kw, checked=False)
    assert all(torch.equal(a[k], b[k]) for k in a)
    bad = {**kw, "draft_tokens": kw["draft_tokens"].clone()}
    bad["draft_tokens"][0] = kw["target_logits"].shape[1]
    with pytest.raises(checks.RangeError, match="draft_tokens"):
        fv.verify_accept(**bad)


def test_unchecked_bad_indices_stay_inside_their_tensors(device):
    """checked=False with a slot past the ring and a position past the table: nothing is written
    past the ring (it is a view of a larger buffer whose tail must keep its bytes), the bad
    position reads row 0 of the table, every other token is as the checked call makes it."""
    from fused.qk_norm_rope import wrapper as f

    kw = _qk_decode_inputs(device)
    S, D = kw["ring"].shape
    big = torch.randn(S + 4, D, dtype=kw["ring"].dtype, device=kw["ring"].device)
    tail = big[S:].clone()
    good = copy.deepcopy(kw)
    good["positions"][2] = 0  # what the bad position must read
    q_good, kv_good = f.qk_norm_rope(**good)
    kw["ring"] = big[:S]
    kw["loc"][1] = S + 1  # past the ring, inside big
    kw["positions"][2] = kw["cos"].shape[0] + 3
    q_bad, kv_bad = f.qk_norm_rope(**kw, checked=False)
    assert torch.equal(big[S:], tail)
    assert torch.equal(q_bad.view(torch.uint8), q_good.view(torch.uint8))
    assert torch.equal(kv_bad.view(torch.uint8), kv_good.view(torch.uint8))


def test_unchecked_slot_past_the_paged_pool_is_skipped(device):
    from cases.qk_norm_rope import catalog as c
    from fused.qk_norm_rope import wrapper as f

    kw = c.build_inputs(c.QkNormRopeCase(T=4, H=2, D=128, R=64, unified=False, page_size=2, mode="decode", seed=5),
                        device)
    kw.pop("forward_mode")
    pool = kw["swa_cache"]
    big = torch.randint(0, 256, (pool.shape[0] + 2, pool.shape[1]), dtype=torch.uint8, device=pool.device)
    big[: pool.shape[0]] = pool
    tail = big[pool.shape[0]:].clone()
    kw["swa_cache"] = big[: pool.shape[0]]
    kw["loc"][0] = pool.shape[0] * kw["swa_page_size"] + 1  # a slot of the first page past the pool
    f.qk_norm_rope(**kw, checked=False)
    assert torch.equal(big[pool.shape[0]:], tail)
