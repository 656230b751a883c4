"""``checked="device"``: the qk_norm_rope kernel checks positions and slots itself, without a host
sync (``fused.device_checks``). Valid input: bitwise the host-checked call. Bad input: the tokens
with bad values are not stored, every other token is as the host-checked call makes it once those
tokens are padding, and ``raise_pending`` raises the host check's RangeError naming the argument."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import checks

def _inputs(device, *, unified=True, T=6, H=2, mode="decode", seed=3):
    from cases.qk_norm_rope import catalog as c

    case = (c.QkNormRopeCase(T=T, H=H, D=64, R=32, mode=mode, seed=seed) if unified else
            c.QkNormRopeCase(T=T, H=H, D=128, R=64, unified=False, page_size=2, mode=mode, seed=seed))
    kw = c.build_inputs(case, device)
    kw.pop("forward_mode")
    if mode != "decode" and unified:  # verify: no store in the kernel
        kw.pop("ring"), kw.pop("loc")
    return kw


def _store(kw):
    return kw.get("ring", kw.get("swa_cache"))


def _call(kw, checked):
    from fused.qk_norm_rope import wrapper as f

    kw = copy.deepcopy(kw)
    q, k = f.qk_norm_rope(**kw, checked=checked)
    store = _store(kw)
    return [t.view(torch.uint8) if t.dtype != torch.uint8 else t for t in (q, k) + ((store,) if store is not None else ())]


@pytest.fixture(autouse=True)
def _clean_record():
    from fused import device_checks as dc

    dc.pending()
    yield
    dc.pending()


@pytest.mark.parametrize("unified, mode", [(True, "decode"), (True, "target_verify"), (False, "decode")])
def test_valid_input_is_bitwise_the_host_checked_call(device, unified, mode):
    """Plant: a check that flags or drops a valid token (padding, a slot of its own) fails here."""
    from fused import device_checks as dc

    kw = _inputs(device, unified=unified, mode=mode)
    host, dev = _call(kw, True), _call(kw, "device")
    assert all(torch.equal(a, b) for a, b in zip(host, dev))
    assert dc.pending() == []


KINDS = ("pos-high", "pos-negative", "slot-past", "slot-twice")


@st.composite
def _faults(draw, T):
    """{token: kind}: a position past the table (or negative), a slot past the store, or a slot of
    another token's (that token becomes bad too)."""
    tokens = draw(st.lists(st.integers(0, T - 1), min_size=1, max_size=3, unique=True))
    return {t: draw(st.sampled_from(KINDS)) for t in tokens}


@pytest.mark.parametrize("unified", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_bad_token_is_not_stored_and_raised_later(device, unified, kind):
    """Plants: a repeated slot still stored (2 fail), bad positions stored (3 fail), the position or
    the duplicate bit never set (2 / 4 fail, with the two tests below)."""
    _check_faults(device, unified, {1: kind})


@settings(max_examples=25, deadline=None)
@given(unified=st.booleans(), data=st.data())
def test_bad_tokens_are_not_stored_and_the_error_is_raised_later(device, unified, data):
    _check_faults(device, unified, data.draw(_faults(6)))


def _check_faults(device, unified, faults):
    from fused import device_checks as dc

    kw = _inputs(device, unified=unified)
    T = kw["q"].shape[0]
    n_pos = kw["cos"].shape[0]
    n_slots = kw["ring"].shape[0] if unified else kw["swa_cache"].shape[0] * kw["swa_page_size"]
    bad = copy.deepcopy(kw)
    padded = copy.deepcopy(kw)  # what the device-checked call must equal: the bad tokens as padding
    twins = set()
    for t, kind in faults.items():
        if kind.startswith("pos"):
            bad["positions"][t] = n_pos + 5 if kind == "pos-high" else -2
            padded["positions"][t] = 0
        elif kind == "slot-past":
            bad["loc"][t] = n_slots + 1
        else:
            other = (t + 1) % T
            bad["loc"][t] = bad["loc"][other]
            twins |= {t, other}
    for t in set(faults) | twins:
        padded["loc"][t] = -1
    want = _call(padded, True)
    got = _call(bad, "device")
    # kv_out and q_out: every token the padded call computes (a bad position reads row 0 in both)
    assert all(torch.equal(a, b) for a, b in zip(want, got)), faults
    errors = dc.pending()
    kinds = set(faults.values())
    expect = [a for k, a in (("pos", "positions"), ("slot", "loc")) if any(v.startswith(k) for v in kinds)]
    assert sorted({e.arg for e in errors}) == sorted(expect), (faults, errors)
    assert all(isinstance(e, checks.RangeError) for e in errors)
    assert dc.pending() == []  # raised once, then cleared


def test_raise_pending_raises_the_host_checks_error(device):
    from fused import device_checks as dc
    from fused.qk_norm_rope import wrapper as f

    kw = _inputs(device)
    kw["positions"][0] = kw["cos"].shape[0]
    f.qk_norm_rope(**copy.deepcopy(kw), checked="device")  # returns: nothing waited for
    with pytest.raises(checks.RangeError, match=rf"positions: entry {kw['cos'].shape[0]} outside \[0, "):
        dc.raise_pending()
    dc.raise_pending()  # cleared
    kw["positions"][0] = 0
    kw["loc"][3] = kw["loc"][1]
    f.qk_norm_rope(**copy.deepcopy(kw), checked="device")
    with pytest.raises(checks.RangeError, match="loc: duplicate entries"):
        dc.raise_pending(kw["q"].device)


def test_shapes_stay_checked_on_the_host(device):
    from fused.qk_norm_rope import wrapper as f

    kw = _inputs(device)
    with pytest.raises(checks.ShapeError, match="positions"):
        f.qk_norm_rope(**{**kw, "positions": kw["positions"][:-1]}, checked="device")


@pytest.mark.parametrize("env, checked, mode", [
    (None, None, "host"), ("device", None, "device"), ("0", None, "off"), ("device", True, "host"),
    (None, "device", "device"), (None, False, "off")])
def test_value_check_mode(monkeypatch, env, checked, mode):
    if env is None:
        monkeypatch.delenv(checks.CHECK_VALUES_ENV, raising=False)
    else:
        monkeypatch.setenv(checks.CHECK_VALUES_ENV, env)
    assert checks.value_check_mode(checked) == mode
    assert checks.values_checked(checked) is (mode != "off")  # wrappers without device checks: on the host


def test_checked_refuses_other_strings():
    with pytest.raises(checks.DTypeError, match="checked: must be a bool or 'device'"):
        checks.value_check_mode("Device")


def test_pending_reads_nothing_during_a_graph_capture(device, monkeypatch):
    """While a CUDA graph is captured the record cannot be read (the H200 nightly's graph-replay check
    of fused-device-checked: 'Cannot copy between CPU and CUDA tensors during CUDA graph capture'): the
    errors wait for the next call outside the capture. A record first allocated inside a capture would
    be zeroed by every replay: refused, naming checked."""
    from fused import device_checks as dc
    from fused.qk_norm_rope import wrapper as f

    kw = _inputs(device)
    kw["positions"][0] = kw["cos"].shape[0]
    f.qk_norm_rope(**copy.deepcopy(kw), checked="device")
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        m.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        dc.raise_pending()  # capturing: nothing read, nothing cleared
        m.setattr(dc, "_records", {})
        with pytest.raises(checks.UnsupportedError, match="checked: the first checked='device' call"):
            dc.record(kw["q"].device)
    with pytest.raises(checks.RangeError, match="positions"):
        dc.raise_pending()
