"""``checked="device"`` of every fused op with host value checks (``fused.device_checks``): the call
reads no device value (no host sync), valid input gives bitwise the host-checked call's outputs, and
every bad value the host check refuses is recorded by the kernel and raised by ``raise_pending`` as
the host check's error type naming the same argument. The bad values come from each op's own
typed-error table (``tests/test_<op>.py::BAD``) and from the bad-input fuzzer's error classes
(``cases/<op>/bad_inputs.py``, ``harness.fuzz``). qk_norm_rope's own tests: tests/test_device_checks.py."""
from __future__ import annotations

import contextlib
import copy
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reference import checks

# ----------------------------------------------------------------------------- counting host syncs

# the aten ops that read a device value on the host (a sync on a GPU): scalars, data-dependent shapes
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
            "equal", "is_nonzero", "_assert_async")


class _Syncs(TorchDispatchMode):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self.seen.append(name)
        elif name in ("_to_copy", "copy_") and any(
                isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args) and (
                kwargs or {}).get("device", None) == torch.device("cpu"):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting_syncs(monkeypatch):
    """Every host read of a device value made while the block runs, by name: ``tolist`` (which
    bypasses the dispatcher on the CPU) and the aten ops of ``SYNC_OPS`` (``item``, ``bool``,
    ``int``, boolean masks, ``unique``, ``torch.equal`` ...), a device-to-host copy on a GPU."""
    seen: list[str] = []
    real = torch.Tensor.tolist

    def tolist(self):
        seen.append("tolist")
        return real(self)

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "tolist", tolist)
        with _Syncs(seen):
            yield seen


def test_the_counter_sees_the_host_checks(device, monkeypatch):
    """The counter is not blind: the default (host) call of each op syncs, and a no-op does not."""
    for op in OPS:
        kw, call = OPS[op]["valid"](device), OPS[op]["call"]
        with counting_syncs(monkeypatch) as seen:
            call(copy.deepcopy(kw), True)
        assert seen, op
    with counting_syncs(monkeypatch) as seen:
        torch.zeros(3, device=device.torch_device) + 1
    assert not seen


# ----------------------------------------------------------------------------- the ops

def _mla_call(kw, checked):
    from fused.mla_fp8_prepare import wrapper as f

    q8 = f.mla_fp8_prepare(**kw, checked=checked)
    return {"q8": q8, "kv_buffer": kw["kv_buffer"]}


def _mla_valid(device, seed=1, T=5):
    from cases.mla_fp8_prepare import catalog as c

    kw = c.build_inputs(c.MlaFp8PrepareCase(T=T, H=2, Dn=32, R=8, pool="identity", seed=seed), device)
    return {k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "kv_descale", "fp8_policy")} | \
        {"loc": kw["out_cache_loc"]}


def _mla_bad():
    from tests.test_mla_fp8_prepare import BAD

    return BAD


def _step_call(kw, checked):
    from fused.mla_fp8_prepare import wrapper as f

    return dict(f.mla_fp8_prepare_step(**kw, checked=checked)) | {"kv_buffer": kw["kv_buffer"]}


def _step_valid(device, seed=2, **over):
    """tests/test_mla_fp8_prepare.py's step case (its STEP_BAD table's): a translated pool, decode_kernel_loc."""
    from cases.mla_fp8_prepare import catalog as c

    return c.build_inputs(c.MlaFp8PrepareCase(**{**dict(T=3, H=2, Dn=32, R=8, seed=seed), **over}), device)


def _step_fused(kw) -> bool:
    """Whether the step takes the fused path on ``kw`` (writes on, the switch on, a write location, covered)."""
    from fused.mla_fp8_prepare import wrapper as f

    return kw["save_kv_cache"] and kw["fused_switch"] is not False and kw["decode_kernel_loc"] is not None and not \
        f.covered(**{k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "fp8_policy")})


def _step_cases(device):
    """The catalog's small cases the fused path takes (both pools, padding, both index dtypes, kv_descale)."""
    from harness.fuzz.targets import op_spec

    spec = op_spec("mla_fp8_prepare")
    n = 0
    for case in spec.catalog(big=False):
        kw = spec.build_inputs(case, device)
        if _step_fused(kw) and n < 8:
            n += 1
            yield kw
    assert n >= 4


def _step_bad():
    from tests.test_mla_fp8_prepare import STEP_BAD

    return STEP_BAD


def _va_call(kw, checked):
    from fused.verify_accept import wrapper as f

    return dict(f.verify_accept(**kw, checked=checked))


def _va_valid(device, seed=1):
    from cases.verify_accept import catalog as c

    return c.build_inputs(c.VerifyAcceptCase(B=3, L=2, V=50, padding=1, seed=seed), device)


def _va_bad():
    from tests.test_verify_accept import BAD

    return BAD


def _vta_call(kw, checked):
    from fused.verify_tree_accept import wrapper as f

    return dict(f.verify_tree_accept(**kw, checked=checked))


def _vta_valid(device, seed=1):
    from cases.verify_tree_accept import catalog as c

    return c.build_inputs(c.VerifyTreeAcceptCase(B=3, topk=2, depth=3, N=6, V=50, padding=1, seed=seed), device)


def _vta_bad():
    from tests.test_verify_tree_accept import BAD

    return BAD


def _ss_call(kw, checked):
    from fused.spec_sampling import wrapper as f

    return dict(f.spec_sampling(**kw, checked=checked))


def _ss_valid(device, seed=1):
    from cases.spec_sampling import catalog as c

    return c.build_inputs(c.SpecSamplingCase(B=3, L=2, V=50, seed=seed), device)


def _ss_bad():
    from tests.test_spec_sampling import BAD

    return BAD


def _vat_width(kw) -> dict:
    """What an engine passes with a chain verify in device mode: its draft width, T / B (shapes only)."""
    B, T = kw["qo_indptr"].shape[0] - 1, kw["q"].shape[0]
    return {"verify_width": T // B} if B > 0 and T % B == 0 else {}


def _vat_call(kw, checked):
    from fused.verify_attention import wrapper as f

    return dict(f.verify_attention(**kw, checked=checked, **(_vat_width(kw) if checked == "device" else {})))


def _vat_case(device, seed=1, **over):
    from cases.verify_attention import catalog as c

    return c.build_inputs(c.VerifyAttentionCase(**{**dict(H=4, Hkv=2, D=64, Dv=64, B=2, L=3, prefix="const:9",
                                                          seed=seed), **over}), device)


def _vat_valid(device, seed=1):
    """tests/test_verify_attention.py's small case (its BAD table's), at ``seed``."""
    return _vat_case(device, seed=seed + 2)


def _vat_cases(device):
    """A few catalog cases (each kernel path, MLA with fp8, several KV heads non-causal, empty prefixes,
    a group the shared-KV kernel refuses, several splits) and a few drawn from the op's strategy, narrowed
    to what the kernels take (``cases/verify_attention/bad_inputs.base_cases``)."""
    from cases import base
    from cases.verify_attention import bad_inputs
    from harness.fuzz.targets import op_spec

    spec = op_spec("verify_attention")
    names = ("qwen35-h16-l4-b3", "k3-mla-h4-l2-e4m3fnuz", "dspark-hkv2-h8-noncausal", "empty-prefix-one-request",
             "many-splits-short-prefix", "group-6-odd")
    picked = [c for c in spec.catalog(big=False) if c.name in names]
    assert len(picked) == len(names)
    picked += base.draw(bad_inputs.base_cases(device), 3, rng_seed=7)
    for case in picked:
        yield spec.build_inputs(case, device)


def _vat_bad():
    from tests.test_verify_attention import BAD

    return BAD


# op -> its fused call (outputs and written buffers by name), a small valid input, its typed-error table,
# and its fuzz target
OPS = {
    "mla_fp8_prepare": dict(call=_mla_call, valid=_mla_valid, bad=_mla_bad,
                            target="fused.mla_fp8_prepare.wrapper:mla_fp8_prepare"),
    # the fused path's values (the chain's fallback checks on the host: tests/test_mla_fp8_prepare.py)
    "mla_fp8_prepare_step": dict(call=_step_call, valid=_step_valid, bad=_step_bad, cases=_step_cases, target=None),
    "verify_accept": dict(call=_va_call, valid=_va_valid, bad=_va_bad,
                          target="fused.verify_accept.wrapper:verify_accept"),
    "verify_tree_accept": dict(call=_vta_call, valid=_vta_valid, bad=_vta_bad,
                               target="fused.verify_tree_accept.wrapper:verify_tree_accept"),
    "spec_sampling": dict(call=_ss_call, valid=_ss_valid, bad=_ss_bad, target=None),  # not in the fuzzer
    # its value rows: the RangeError ones, and the indptr / mask rules the host check raises as the base class
    "verify_attention": dict(call=_vat_call, valid=_vat_valid, bad=_vat_bad, cases=_vat_cases, device_kw=_vat_width,
                             value_args=("qo_indptr", "kv_indptr", "kv_indices", "custom_mask"),
                             target="fused.verify_attention.wrapper:verify_attention"),
}


@pytest.fixture(autouse=True)
def _clean_record():
    from fused import device_checks as dc

    dc.pending()
    yield
    dc.pending()


def _bytes(out: dict) -> dict:
    return {k: (v.view(torch.uint8) if v.dtype.is_floating_point else v).cpu() for k, v in out.items()}


def _same(a: dict, b: dict) -> bool:
    a, b = _bytes(a), _bytes(b)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- valid input

def _valid_inputs(op, device):
    """The op's small valid input at a few seeds, and its catalog's small cases (the fused target's)."""
    from harness.fuzz.targets import op_spec

    yield from (OPS[op]["valid"](device, seed=s) for s in (1, 2, 3))
    if "cases" in OPS[op]:
        yield from OPS[op]["cases"](device)
        return
    spec = op_spec(op)
    for case in spec.catalog(big=False)[:12]:
        kw = spec.build_inputs(case, device)
        if op == "mla_fp8_prepare":
            from fused.mla_fp8_prepare import wrapper as f

            if f.covered(**{k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "fp8_policy")}):
                continue
            kw = {k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "kv_descale",
                                     "fp8_policy")} | {"loc": kw["decode_kernel_loc"] if kw.get(
                                         "decode_kernel_loc") is not None else kw["out_cache_loc"]}
            if kw["loc"].numel() and int(kw["loc"].max()) >= kw["kv_buffer"].shape[0]:
                continue  # a logical loc of a translated pool: not the kernel's rows
        yield kw


@pytest.mark.parametrize("op", sorted(OPS))
def test_valid_input_is_bitwise_the_host_checked_call_without_a_sync(device, monkeypatch, op):
    """Plant: a check that flags or drops a valid token / request fails here (a different output, or
    an error pending); a device call that checks on the host fails the sync count."""
    from fused import device_checks as dc

    call, n = OPS[op]["call"], 0
    for kw in _valid_inputs(op, device):
        host = call(copy.deepcopy(kw), True)
        with counting_syncs(monkeypatch) as seen:
            got = call(copy.deepcopy(kw), "device")
        assert not seen, (op, seen)
        assert _same(host, got), op
        assert dc.pending() == [], op
        n += 1
    assert n >= 3


# ----------------------------------------------------------------------------- bad values

def _host_error(call, kw):
    try:
        call(copy.deepcopy(kw), True)
    except checks.VerifyParityInputError as e:
        return e
    return None


def _device_error(call, kw, monkeypatch):
    """(the error the device-checked call raised at once or later through raise_pending, host syncs of the call)."""
    from fused import device_checks as dc

    with counting_syncs(monkeypatch) as seen:
        try:
            call(copy.deepcopy(kw), "device")
        except checks.VerifyParityInputError as e:
            return e, list(seen)
    errors = dc.pending()
    return (errors[0] if errors else None), list(seen)


def _value_rows(op):
    value_args = OPS[op].get("value_args", ())
    return [(a, m, e) for a, m, e in OPS[op]["bad"]() if issubclass(e, checks.RangeError) or (
        a in value_args and e is checks.VerifyParityInputError)]


@pytest.mark.parametrize("op, row", [(op, i) for op in sorted(OPS) for i in range(len(_value_rows(op)))])
def test_each_bad_value_of_the_ops_table_is_raised_later_as_the_host_check_raises_it(device, monkeypatch, op, row):
    """The op's typed-error table (its RangeError rows: the value checks): the host check's error,
    type and argument, from ``raise_pending`` after a device-checked call that synced nothing.
    Plant: a kernel that skips one of its checks leaves its rows' errors unraised."""
    arg, make, err = _value_rows(op)[row]
    kw = OPS[op]["valid"](device)
    new = make(kw)
    for name, t in (new if isinstance(new, dict) else {arg: new}).items():
        kw[name] = t.to(device.torch_device) if isinstance(t, torch.Tensor) else t
    host = _host_error(OPS[op]["call"], kw)
    assert isinstance(host, err) and host.arg == arg, host
    got, seen = _device_error(OPS[op]["call"], kw, monkeypatch)
    assert not seen, seen
    assert type(got) is type(host) and got.arg == host.arg, (host, got)


def _fuzz_jobs(op, device):
    from harness.fuzz.strategies import CLASSES, plan

    classes = [n for n, c in CLASSES.items() if c.group in ("index", "value") and c.expected(op) == "error"]
    return plan(device, classes=classes, ops=(op,), targets=[OPS[op]["target"]], examples=2, seed=5)


@pytest.mark.parametrize("op", sorted(op for op in OPS if OPS[op]["target"]))
def test_every_bad_input_the_fuzzer_refuses_on_the_host_is_refused_on_the_device(device, monkeypatch, op):
    """Each of the fuzzer's error classes of the values and index groups, on the op's fused target:
    when the host-checked call raises, the device-checked one raises the same type naming the same
    argument, at the call (a scalar, checked on the host without a sync) or from raise_pending, and
    syncs nothing."""
    from harness.fuzz.call import build
    from harness.fuzz.targets import call_target, load_fn, resolve_target

    jobs = _fuzz_jobs(op, device)
    refused = 0
    for job in jobs:
        t = resolve_target(job.target)
        case, _, bad, _, _ = build(job, device)
        fn = load_fn(t.fn_path)

        def call(kw, checked, t=t, fn=fn, case=case):
            extra = OPS[op]["device_kw"](kw) if checked == "device" and "device_kw" in OPS[op] else {}
            return call_target(t, functools.partial(fn, checked=checked, **extra), kw, case)
        host = _host_error(call, bad)
        if host is None:
            continue
        refused += 1
        got, seen = _device_error(call, bad, monkeypatch)
        assert not seen, (job, seen)
        assert type(got) is type(host) and got.arg == host.arg, (job, host, got)
    assert refused >= 3, [j.cls for j in jobs]


# ----------------------------------------------------------------------------- what bad values leave behind

MLA_FAULTS = ("past", "huge", "twice")


@pytest.mark.parametrize("fault", MLA_FAULTS)
@pytest.mark.parametrize("at", [0, 3])
def test_mla_tokens_with_bad_rows_write_nothing(device, fault, at):
    """A token whose row is past kv_buffer, or named by another token too (both of them), writes no
    row; q8 and every other row are the host-checked call's with those tokens as padding.
    Plants: a repeated row still written, a row past the pool's end written (out of bounds)."""
    from fused import device_checks as dc

    kw = _mla_valid(device, T=5)
    S = kw["kv_buffer"].shape[0]
    bad, padded = copy.deepcopy(kw), copy.deepcopy(kw)
    other = (at + 1) % 5
    if fault == "twice":
        bad["loc"][at] = bad["loc"][other]
        padded["loc"][other] = -1
    else:
        bad["loc"][at] = S if fault == "past" else 2 ** 40
    padded["loc"][at] = -1
    want = _mla_call(padded, True)
    got = _mla_call(bad, "device")
    assert _same(want, got), fault
    errors = dc.pending()
    assert [e.arg for e in errors] == ["loc"] and isinstance(errors[0], checks.RangeError), errors
    assert ("duplicate" in str(errors[0])) is (fault == "twice"), errors


def _va_kw(device):
    """Three real requests of L + 1 = 3 rows and V 50, qo_indptr int32."""
    from cases.verify_accept import catalog as c

    return c.build_inputs(c.VerifyAcceptCase(B=3, L=2, V=50, padding=0, seed=4, accept="all"), device)


@pytest.mark.parametrize("qo, bad_requests", [
    ([0, 3, 6, 10], {2}),  # request 2: 4 rows, and past the 9 rows
    ([0, 3, 2, 5], {1}),  # falls: request 1 has -1 rows (request 2's 3 rows are inside: it walks)
    ([1, 4, 7, 10], {2}),  # does not start at 0; request 2 past the rows
    ([0, 3, 6, 6], {2}),  # legal (request 2 padding): nothing recorded
])
def test_va_requests_with_bad_rows_get_the_padding_outputs(device, qo, bad_requests):
    """A request whose qo_indptr entries do not give it L + 1 rows inside target_logits reads nothing
    and gets −1 and length 0; every other request is the host-checked call's on the same rows.
    Plant: a request of the wrong size or out of rows walked anyway (an out-of-bounds read, or its
    outputs not the padding ones)."""
    from fused import device_checks as dc

    kw = _va_kw(device)
    kw["target_logits"] = kw["target_logits"][:9]
    kw["qo_indptr"] = torch.tensor(qo, dtype=kw["qo_indptr"].dtype, device=kw["qo_indptr"].device)
    got = _va_call(copy.deepcopy(kw), "device")
    errors = dc.pending()
    assert [e.arg for e in errors][:1] == (["qo_indptr"] if qo != [0, 3, 6, 6] else []), errors
    for b in range(3):
        if b in bad_requests:
            assert (got["output_ids"][b] == -1).all() and int(got["accept_length"][b]) == 0, b
        else:  # the same rows as a legal layout's request: the host-checked call on those rows
            rows = kw["target_logits"][qo[b]:qo[b] + 3]
            one = _va_call({"target_logits": rows, "draft_tokens": kw["draft_tokens"][2 * b:2 * b + 2],
                            "qo_indptr": torch.tensor([0, 3], dtype=kw["qo_indptr"].dtype,
                                                      device=rows.device)}, True)
            assert torch.equal(got["output_ids"][b], one["output_ids"][0]), b
            assert torch.equal(got["accept_length"][b], one["accept_length"][0]), b


STEP_FAULTS = ("dkl-past", "dkl-huge", "dkl-twice", "ocl-past", "ocl-huge", "ocl-twice", "map-past", "map-negative",
               "map-huge", "map-twice")


def _step_fault(kw, fault, at):
    """Break ``kw`` at token ``at`` (or at the slot_map entry it names): the argument named, and the same
    call made valid with what the fused path leaves for it (a bad decode_kernel_loc row: padding)."""
    bad, want = copy.deepcopy(kw), copy.deepcopy(kw)
    S, n_logical, T = kw["kv_buffer"].shape[0], kw["slot_map"].shape[0], kw["out_cache_loc"].shape[0]
    other = (at + 1) % T
    what, how = fault.split("-")
    name = {"dkl": "decode_kernel_loc", "ocl": "out_cache_loc", "map": "slot_map"}[what]
    i = int(kw["out_cache_loc"][at]) if what == "map" else at
    if how == "twice":
        j = int(kw["out_cache_loc"][other]) if what == "map" else other
        bad[name][i] = bad[name][j]
        if what == "dkl":
            want[name][other] = -1
    else:
        bad[name][i] = {"past": {"dkl": S, "ocl": n_logical, "map": S}[what], "huge": 2 ** 40, "negative": -1}[how]
    if what == "dkl":
        want[name][at] = -1
    return name, bad, want


@pytest.mark.parametrize("fault", STEP_FAULTS)
@pytest.mark.parametrize("at", [0, 2])
def test_step_a_bad_index_leaves_the_valid_call_and_is_raised_later(device, monkeypatch, fault, at):
    """The fused step, checked on the device, on one bad index: nothing synced; a token whose
    decode_kernel_loc row is past kv_buffer or named twice (both tokens) writes no row and counts no
    write: q8, kv_buffer and kv_writes are the host-checked call's with those tokens as padding; a bad
    slot_map or out_cache_loc entry (the kernel reads neither) leaves the valid call's outputs; and
    raise_pending names the argument as the host check does. Plants: a check dropped from the check
    launch or the kernel, the step's kinds named loc, a repeated row counted in kv_writes."""
    from fused import device_checks as dc

    kw = _step_valid(device, T=5)
    name, bad, want = _step_fault(kw, fault, at)
    host = _host_error(_step_call, bad)
    assert isinstance(host, checks.RangeError) and host.arg == name, host
    expected = _step_call(want, True)
    with counting_syncs(monkeypatch) as seen:
        got = _step_call(bad, "device")
    assert not seen, seen
    assert _same(expected, got), fault
    errors = dc.pending()
    assert errors and type(errors[0]) is type(host) and errors[0].arg == name, errors
    assert [e.arg for e in errors] == [name], errors  # the others' checks see nothing


def test_step_reports_slot_map_then_out_cache_loc_then_decode_kernel_loc(device):
    """All three bad at once: raise_pending raises slot_map's, as the host check does (its order)."""
    from fused import device_checks as dc

    kw = _step_valid(device, T=5)
    for name in ("decode_kernel_loc", "out_cache_loc", "slot_map"):
        kw[name][0] = kw[name][1]
    assert _host_error(_step_call, kw).arg == "slot_map"
    _step_call(copy.deepcopy(kw), "device")
    assert [e.arg for e in dc.pending()] == ["slot_map", "out_cache_loc", "decode_kernel_loc"]


def test_step_unchecked_syncs_nothing_and_the_default_is_the_host_check(device, monkeypatch):
    """checked=False on the fused path reads no value and gives the host-checked outputs on valid input;
    the default (checked None, VP_CHECK_VALUES unset) still refuses a bad value at the call."""
    kw = _step_valid(device, T=5)
    want = _step_call(copy.deepcopy(kw), True)
    with counting_syncs(monkeypatch) as seen:
        got = _step_call(copy.deepcopy(kw), False)
    assert not seen and _same(want, got)
    from fused.mla_fp8_prepare import wrapper as f

    monkeypatch.delenv(checks.CHECK_VALUES_ENV, raising=False)
    kw["slot_map"][0] = kw["slot_map"][1]
    with pytest.raises(checks.RangeError) as info:
        f.mla_fp8_prepare_step(**kw)
    assert info.value.arg == "slot_map"


@pytest.mark.parametrize("off", ["decode_kernel_loc", "fused_switch", "save_kv_cache"])
def test_step_a_call_the_gate_sends_to_the_chain_is_checked_there(device, off):
    """The fallback (no write location, the switch off, writes off) indexes slot_map by out_cache_loc:
    checked on the host whatever checked says, a bad value refused at the call."""
    kw = _step_valid(device, T=5)
    kw[off] = None if off == "decode_kernel_loc" else False
    kw["out_cache_loc"][0] = kw["slot_map"].shape[0]
    with pytest.raises(checks.RangeError) as info:
        _step_call(kw, "device")
    assert info.value.arg == "out_cache_loc"


@pytest.mark.parametrize("value", [-1, 50, 2 ** 40])
def test_va_a_draft_outside_the_vocabulary_stops_the_walk(device, value):
    """A real request's draft outside [0, V) matches no token: the walk stops at it (the bonus token
    there, −1 after), and raise_pending names draft_tokens. Plant: the draft check dropped."""
    from fused import device_checks as dc

    kw = _va_kw(device)  # accept="all": every draft is its row's token
    kw["draft_tokens"] = kw["draft_tokens"].long()
    kw["draft_tokens"][4] = value  # request 2, draft 0
    got = _va_call(copy.deepcopy(kw), "device")
    with pytest.raises(checks.RangeError, match=rf"draft_tokens: entry {value} outside \[0, 50\)"):
        dc.raise_pending()
    assert got["accept_length"].tolist() == [2, 2, 0]
    assert (got["output_ids"][2, 1:] == -1).all() and 0 <= int(got["output_ids"][2, 0]) < 50


@pytest.mark.parametrize("row", [i for i, (a, _, _) in enumerate(_value_rows("verify_tree_accept"))
                                 if a != "num_speculative_tokens"])  # a scalar: refused at the call
def test_vta_a_request_that_breaks_a_layout_rule_gets_the_padding_outputs(device, row):
    """Each value row of the op's typed-error table breaks one real request: checked on the device,
    that request reads no row and gets the padding outputs, and the whole call equals the
    host-checked call on the same input with that request made padding (retrive_index[b, 0] = -1).
    Plant: a breaking request walked anyway (its outputs differ, or it reads out of bounds)."""
    from fused import device_checks as dc

    arg, make, _ = _value_rows("verify_tree_accept")[row]
    kw = _vta_valid(device)
    b = int(torch.nonzero(kw["retrive_index"][:, 0].cpu() >= 0)[0])  # the request the table's rows break
    new = make(kw)
    for name, t in (new if isinstance(new, dict) else {arg: new}).items():
        kw[name] = t.to(device.torch_device)
    got = _vta_call(copy.deepcopy(kw), "device")
    assert [e.arg for e in dc.pending()][:1] == [arg]
    padded = copy.deepcopy(kw)
    padded["retrive_index"][b, 0] = -1
    assert _same(_vta_call(padded, True), got)


def _ss_fault(kw, fault):
    """One bad element (or row) at the last row of the last request, a row no walk needs to read."""
    B, Lp1, V = kw["target_logits"].shape
    b, L = B - 1, Lp1 - 1
    name, what = fault.split(":")
    t = kw[name].clone()
    if name == "target_logits":
        if what == "row":
            t[b, L] = float("-inf")
        else:
            t[b, L, V - 1] = float(what)
    elif name == "draft_probs":
        t[b, L - 1, V // 2] = float(what)
    elif name == "temperature":
        t[b] = float(what)
    elif name == "uniforms":
        t[b, L] = float(what)
    else:  # draft_tokens
        t[b, L - 1] = V if what == "past" else -1
    kw[name] = t
    return name


SS_FAULTS = ("target_logits:nan", "target_logits:inf", "target_logits:row", "draft_probs:nan", "draft_probs:-0.25",
             "draft_probs:inf", "temperature:nan", "temperature:inf", "temperature:-1", "temperature:0",
             "uniforms:1", "uniforms:-0.5", "uniforms:nan", "draft_tokens:past", "draft_tokens:negative")


@pytest.mark.parametrize("fault", SS_FAULTS)
def test_ss_each_kind_of_bad_value_is_recorded_wherever_it_is(device, monkeypatch, fault):
    """One bad element in the last row of the last request (past where a walk may stop): the check
    launch reads every row, so the device call records what the host check refuses, with no sync.
    Plants: the check launch skipping row L, or one of its rules dropped."""
    kw = _ss_valid(device)
    arg = _ss_fault(kw, fault)
    host = _host_error(_ss_call, kw)
    assert isinstance(host, checks.RangeError) and host.arg == arg, host
    got, seen = _device_error(_ss_call, kw, monkeypatch)
    assert not seen, seen
    assert type(got) is type(host) and got.arg == arg, (host, got)
    if arg != "draft_tokens" and ":" in fault and fault.split(":")[1] not in ("row",):
        assert "at [" in str(got) or "at request" in str(got), got  # where it is



def _vat_kernels():
    from fused.verify_attention import wrapper as f

    return {"split_kv": f.verify_split_kv, "shared_kv": f.verify_shared_kv, "dispatch": f.verify_attention}


def _vat_bytes(o):
    return o.view(torch.uint16).cpu()


def _vat_three(device):
    """Three requests of width 2, prefixes of 5, 7 and 6 slots (18), one split: the last request's last
    key dropped leaves every other key where it was."""
    kw = _vat_case(device, B=3, L=2, prefix="list:5-7-6", seed=9)
    kw["num_kv_splits"] = 1
    return kw


@pytest.mark.parametrize("path", ["split_kv", "shared_kv", "dispatch"])
@pytest.mark.parametrize("fault", ["end-past", "end-huge", "falls", "slot-past", "slot-negative", "slot-huge"])
def test_vat_a_request_with_bad_slots_reads_none_of_them(device, monkeypatch, path, fault):
    """The last request's kv_indptr end past kv_indices (or before its start) reads no slot: its o rows
    are the host-checked call's with that request's prefix empty; a slot outside the pool is no key: the
    host-checked call without it. The other requests are that call's too, bitwise; nothing synced, and
    raise_pending names the argument. Plants: the indptr or the slot bound dropped (an out-of-bounds read,
    or other rows)."""
    from fused import device_checks as dc

    fn = _vat_kernels()[path]
    kw = _vat_three(device)
    bad, legal = copy.deepcopy(kw), copy.deepcopy(kw)
    n, pool = kw["kv_indices"].shape[0], kw["k_buffer"].shape[0]
    if fault.startswith("slot"):
        bad["kv_indices"][17] = {"slot-past": pool, "slot-negative": -1, "slot-huge": 2 ** 31 - 1}[fault]
        legal["kv_indptr"][3] = 17
        arg = "kv_indices"
    else:
        bad["kv_indptr"][3] = {"end-past": n + 1, "end-huge": 2 ** 31 - 1, "falls": 11}[fault]
        legal["kv_indptr"][3] = 12
        arg = "kv_indptr"
    want = fn(**legal)["o"]
    with counting_syncs(monkeypatch) as seen:
        got = fn(**bad, checked="device", verify_width=2)["o"]
    assert not seen, seen
    assert torch.equal(_vat_bytes(got), _vat_bytes(want)), fault
    errors = dc.pending()
    assert [e.arg for e in errors] == [arg], errors
    host = _host_error(lambda k, c: fn(**k, checked=c), bad)
    assert type(errors[0]) is type(host) and host.arg == arg, (host, errors)


@pytest.mark.parametrize("qo, arg_type", [
    ([0, 1, 4, 6], checks.RangeError),  # legal, ragged: not the width the call was given
    ([0, 2, 2, 6], checks.VerifyParityInputError),  # request 1 without a draft
    ([0, 4, 2, 6], checks.VerifyParityInputError),  # falls
    ([2, 2, 4, 6], checks.VerifyParityInputError),  # does not start at 0 (request 0 empty too: the rise first)
    ([0, 2, 4, 5], checks.VerifyParityInputError),  # does not end at T
])
@pytest.mark.parametrize("path", ["split_kv", "dispatch"])
def test_vat_bad_qo_rows_are_recorded_and_each_request_keeps_its_width_rows(device, monkeypatch, qo, arg_type, path):
    """A qo_indptr that is not arange(B + 1)·verify_width: recorded (the host check's type, naming
    qo_indptr, in its order), and o is the host-checked call's on the uniform qo_indptr (the kernels
    never index through qo_indptr: no read outside q / k / v). checked=True with the same verify_width
    raises the same. Plant: a qo rule dropped from the combine programs."""
    from fused import device_checks as dc

    fn = _vat_kernels()[path]
    kw = _vat_three(device)
    want = fn(**kw)["o"]
    bad = copy.deepcopy(kw)
    bad["qo_indptr"] = torch.tensor(qo, dtype=kw["qo_indptr"].dtype, device=kw["qo_indptr"].device)
    with counting_syncs(monkeypatch) as seen:
        got = fn(**bad, checked="device", verify_width=2)["o"]
    assert not seen, seen
    assert torch.equal(_vat_bytes(got), _vat_bytes(want))
    errors = dc.pending()
    assert errors and type(errors[0]) is arg_type and errors[0].arg == "qo_indptr", errors
    host = _host_error(lambda k, c: fn(**k, checked=c, verify_width=2), bad)
    assert type(host) is arg_type and host.arg == "qo_indptr", host


def test_vat_device_routing_needs_a_width_or_a_plan_and_never_syncs(device, monkeypatch):
    """checked="device" reads no value to route: without verify_width or a batch_planned plan it is an
    UnsupportedError naming verify_width (no silent sync); with a plan (made outside, where it reads
    qo_indptr once) the call syncs nothing; a width that B requests cannot make T is refused, naming it.
    The default call still reads the widths itself. Plant: a device call that reads qo_indptr to route."""
    from fused.verify_attention import wrapper as f

    kw = _vat_valid(device)
    with counting_syncs(monkeypatch) as seen, pytest.raises(checks.UnsupportedError) as info:
        f.verify_attention(**kw, checked="device")
    assert info.value.arg == "verify_width" and not seen
    want = f.verify_attention(**kw)["o"]
    with f.batch_planned(**kw, checked="device"):
        with counting_syncs(monkeypatch) as seen:
            got = f.verify_attention(**kw, checked="device")["o"]
    assert not seen and torch.equal(_vat_bytes(got), _vat_bytes(want))
    for width, err in ((4, checks.RangeError), (0, checks.RangeError), (3.0, checks.DTypeError)):
        with pytest.raises(err) as info:
            f.verify_attention(**kw, checked="device", verify_width=width)
        assert info.value.arg == "verify_width"
    with counting_syncs(monkeypatch) as seen:
        f.verify_attention(**kw)
    assert "tolist" in seen


def test_vat_a_call_the_gate_sends_to_the_reference_is_checked_there(device):
    """The reference chain (a tree, or the kernels switched off) checks on the host whatever checked says:
    a bad slot is refused at the call, as by default."""
    from fused.verify_attention import wrapper as f

    kw = _vat_valid(device)
    kw["kv_indices"][0] = kw["k_buffer"].shape[0]
    kw["splitkv_switch"] = False
    with pytest.raises(checks.RangeError, match="kv_indices"):
        f.verify_attention(**kw, checked="device", verify_width=3)



# ----------------------------------------------------------------------------- CUDA graphs

def _break(op, kw):
    """Break one value of ``kw`` in place (a captured graph replays on the same tensors): the arg named."""
    if op == "mla_fp8_prepare":
        kw["loc"][0] = kw["kv_buffer"].shape[0]
        return "loc"
    if op == "mla_fp8_prepare_step":
        kw["slot_map"][0] = kw["slot_map"][1]
        return "slot_map"
    if op == "verify_accept":
        qo = kw["qo_indptr"].tolist()
        b = next(b for b in range(len(qo) - 1) if qo[b + 1] > qo[b])  # a real request's draft
        kw["draft_tokens"][b * (kw["draft_tokens"].shape[0] // (len(qo) - 1))] = kw["target_logits"].shape[1]
        return "draft_tokens"
    if op == "verify_tree_accept":
        b = int(torch.nonzero(kw["retrive_index"][:, 0].cpu() >= 0)[0])
        kw["candidates"][b, 1] = kw["target_logits"].shape[1]
        return "candidates"
    if op == "verify_attention":
        kw["kv_indices"][0] = kw["k_buffer"].shape[0]
        return "kv_indices"
    kw["temperature"][0] = float("nan")
    return "temperature"


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(OPS))
def test_a_device_checked_call_is_captured_and_its_replays_check_the_new_values(device, op):
    """checked="device" under a CUDA graph: captured after an eager call (the record exists), each
    replay checks the values the tensors hold then: a valid replay records nothing, and one after a
    value is broken in place records the host check's error. Plant: a wrapper that reads a value on
    the host fails the capture."""
    from fused import device_checks as dc

    kw = OPS[op]["valid"](device)
    call = OPS[op]["call"]
    call(copy.deepcopy(kw), "device")
    assert dc.pending() == []
    static = copy.deepcopy(kw)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(static, "device")  # warm: compiled, allocator ready
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(static, "device")
    graph.replay()
    want = call(copy.deepcopy(kw), True)
    assert _same({k: out[k] for k in want}, want) and dc.pending() == []
    arg = _break(op, static)
    graph.replay()
    errors = dc.pending()
    assert errors and errors[0].arg == arg, errors
