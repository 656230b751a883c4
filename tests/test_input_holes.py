"""Bad inputs that used to pass the shared validators, one family per test: each public entry point
of ``reference/*`` and ``fused/*`` either refuses the input with a typed error naming the argument
(``reference.checks``) or computes exactly what it computes on the well-formed input.

Shapes are tiny (every fused call is one or two interpreted launches); the whole file is a few
seconds of kernels on the CPU.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cases.mla_fp8_prepare import catalog as cm
from cases.qk_norm_rope import catalog as cq
from cases.verify_attention import catalog as cv
from fused.mla_fp8_prepare import wrapper as fm
from fused.qk_norm_rope import wrapper as fq
from fused.verify_attention import wrapper as fv
from reference import checks
from reference.mla_fp8_prepare import chain as rm
from reference.qk_norm_rope import chain as rq
from reference.verify_attention import chain as rv
from reference.verify_attention import sdpa as rvs
from reference.verify_attention.oracle import verify_attention_oracle

# ----------------------------------------------------------------------------- inputs


def qk_step_kw(device, **over):
    """qk_norm_rope_step keywords (decode: the ring store runs), every optional tensor given."""
    case = cq.QkNormRopeCase(T=5, H=3, D=64, R=32, q_weight=True, mode="decode", q_out="provided", seed=3)
    return {**cq.build_inputs(case, device), **over}


def qk_kw(device, **over):
    kw = qk_step_kw(device, **over)
    kw.pop("forward_mode")
    return kw


def mla_step_kw(device, **over):
    case = cm.MlaFp8PrepareCase(T=4, H=2, Dn=64, R=16, kv_descale=0.5, seed=4)
    return {**cm.build_inputs(case, device), **over}


def mla_kw(device, **over):
    kw = mla_step_kw(device)
    kw["loc"] = kw.pop("decode_kernel_loc")
    for k in ("out_cache_loc", "slot_map", "save_kv_cache", "fused_switch"):
        kw.pop(k)
    return {**kw, **over}


def va_kw(device, **over):
    """GQA, two KV heads (the shared-KV kernel takes it), two requests of unequal prefixes
    (the batched reference pads the shorter one), a caller-provided ``o``."""
    case = cv.VerifyAttentionCase(B=2, L=2, H=4, Hkv=2, D=64, Dv=64, prefix="list:3-8", splits=2, seed=5)
    kw = cv.build_inputs(case, device)
    kw["o"] = torch.full(kw["q"].shape[:2] + (64,), float("nan"), dtype=torch.bfloat16, device=kw["q"].device)
    return {**kw, **over}


QK_FNS = {"ref.qk_norm_rope": (rq.qk_norm_rope, qk_kw), "fused.qk_norm_rope.wrapper": (fq.qk_norm_rope, qk_kw),
          "ref.qk_norm_rope_step": (rq.qk_norm_rope_step, qk_step_kw),
          "fused.qk_norm_rope_step": (fq.qk_norm_rope_step, qk_step_kw)}
MLA_FNS = {"ref.mla_fp8_prepare": (rm.mla_fp8_prepare, mla_kw), "fused.mla_fp8_prepare.wrapper": (fm.mla_fp8_prepare, mla_kw),
           "ref.mla_fp8_prepare_step": (rm.mla_fp8_prepare_step, mla_step_kw),
           "fused.mla_fp8_prepare_step": (fm.mla_fp8_prepare_step, mla_step_kw)}
VA_FNS = {"ref.verify_attention": (rv.verify_attention, va_kw),
          "ref.verify_attention_sdpa": (rvs.verify_attention_sdpa, va_kw),
          "fused.verify_split_kv": (fv.verify_split_kv, va_kw), "fused.verify_shared_kv": (fv.verify_shared_kv, va_kw),
          "fused.verify_attention.wrapper": (fv.verify_attention, va_kw)}
ALL_FNS = {**QK_FNS, **MLA_FNS, **VA_FNS}


def _tensors(x) -> list[torch.Tensor]:
    """Every tensor of a result (tensor, tuple or dict), in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    return []


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.to(torch.uint8) if t.dtype == torch.bool else t.view(torch.uint8)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y))
                                    for x, y in zip(a, b))


def _state(kw: dict, result) -> list[torch.Tensor]:
    """What a call leaves behind: its outputs, then every tensor argument (buffers it wrote, inputs it kept)."""
    return _tensors(result) + [kw[k] for k in sorted(kw) if isinstance(kw[k], torch.Tensor)]


# ----------------------------------------------------------------------------- 1. layouts

def _strided(t: torch.Tensor, axis: int) -> torch.Tensor:
    """The same values as a view with stride 2 along ``axis``; the skipped elements duplicate their
    left neighbours, so a kernel that assumes unit strides reads in-range but wrong values."""
    shape = list(t.shape)
    shape[axis] *= 2
    buf = t.new_empty(shape)
    sl = [slice(None)] * t.dim()
    sl[axis] = slice(0, None, 2)
    buf[tuple(sl)] = t
    sl[axis] = slice(1, None, 2)
    buf[tuple(sl)] = t
    sl[axis] = slice(0, None, 2)
    return buf[tuple(sl)]


# Parameters are enumerated from inputs built on the CPU (build_inputs only asks for torch_device).
_CPU = SimpleNamespace(torch_device="cpu")


def _tensor_args(name: str) -> dict[str, torch.Tensor]:
    kw = ALL_FNS[name][1](_CPU)
    return {k: v for k, v in sorted(kw.items()) if isinstance(v, torch.Tensor)}


def _layout_params():
    return [pytest.param(name, arg, axis, id=f"{name}-{arg}-axis{axis}")
            for name in ALL_FNS for arg, t in _tensor_args(name).items()
            for axis in sorted({0, t.dim() - 1}) if t.shape[axis] > 1]


@pytest.mark.parametrize("name,arg,axis", _layout_params())
def test_a_strided_argument_is_refused_or_read_through_its_strides(device, name, arg, axis):
    """Index tensors (``positions``, ``loc``, ``kv_indptr``, …) used to pass every value check
    as strided views, then the kernels read raw memory (``ptr + i``): wrong rows written, or a
    segfault. Every tensor argument of every entry point: a view with stride 2 along the first or
    the last axis is refused with LayoutError naming it, or gives the well-formed call's bytes."""
    fn, build = ALL_FNS[name]
    kw0 = build(device)
    want = _state(kw0, fn(**kw0))
    kw = build(device)
    kw[arg] = _strided(kw[arg], axis)
    try:
        got = fn(**kw)
    except checks.LayoutError as e:
        assert e.arg == arg, str(e)
        return
    assert _same(_state(kw, got), want), f"{name}: {arg} with stride 2 on axis {axis} changed the result"


# ----------------------------------------------------------------------------- 2 and 10. float scalars

SCALARS = [  # (entry points, argument, bad value, error)
    *[(fns, "eps", v, e) for fns in (QK_FNS,) for v, e in (
        (float("inf"), checks.RangeError), (float("nan"), checks.RangeError), (-1e-6, checks.RangeError),
        (0.0, checks.RangeError), (1e-46, checks.RangeError),  # 0 in fp32
        (1e-39, checks.RangeError),  # subnormal in fp32: a GPU may flush it
        ("1e-6", checks.DTypeError), (torch.tensor(1e-6), checks.DTypeError), (True, checks.DTypeError),
        (None, checks.DTypeError))],
    *[(MLA_FNS, "kv_descale", v, e) for v, e in (
        (1e-45, checks.RangeError), (1e-39, checks.RangeError),  # fp32 reciprocal: inf
        (3e38, checks.RangeError),  # reciprocal subnormal in fp32
        (1e39, checks.RangeError), (float("nan"), checks.RangeError), (-0.5, checks.RangeError),
        ("0.5", checks.DTypeError), (torch.tensor(0.5), checks.DTypeError), (np.bool_(True), checks.DTypeError))],
    *[(VA_FNS, a, v, e) for a in ("sm_scale", "k_scale", "v_scale") for v, e in (
        (1e-45, checks.RangeError), (1e-39, checks.RangeError), (float("inf"), checks.RangeError),
        (float("nan"), checks.RangeError), (-1.0, checks.RangeError), ("1.0", checks.DTypeError),
        (torch.tensor(1.0), checks.DTypeError), (False, checks.DTypeError))],
    (VA_FNS, "k_scale", 5e-38, checks.RangeError),  # normal, but sm_scale·k_scale (1/8 here) is subnormal
]


def _entry_params(table):
    return [pytest.param(name, arg, val, err, id=f"{name}-{arg}-{i}")
            for i, (fns, arg, val, err) in enumerate(table) for name in fns]


def _assert_refused(device, name, arg, err, **over):
    """``name`` called with ``over`` raises ``err`` naming ``arg`` and leaves every other tensor as it was."""
    fn, build = ALL_FNS[name]
    kw = build(device)
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor) and k not in over}
    kw.update(over)
    with pytest.raises(err) as info:
        fn(**kw)
    assert info.value.arg == arg, str(info.value)
    assert _same([kw[k] for k in before], list(before.values())), "a refused call wrote"
    return info.value


@pytest.mark.parametrize("name,arg,val,err", _entry_params(SCALARS))
def test_float_scalars_are_finite_normal_fp32_numbers(device, name, arg, val, err):
    """Scales and eps are checked in the dtype the op computes in (fp32): a kv_descale of 1e-45
    passed the float64 check and its fp32 reciprocal was inf (±448 and NaN rows); eps = inf went
    through. Python and numpy real numbers only: no str, bool or tensor."""
    _assert_refused(device, name, arg, err, **{arg: val})


@pytest.mark.parametrize("name", list(VA_FNS))
def test_the_score_scale_is_a_normal_fp32_number(device, name):
    """The kernels get sm_scale·k_scale as one fp32 argument: 1e20·1e20 overflows it."""
    _assert_refused(device, name, "k_scale", checks.RangeError, sm_scale=1e20, k_scale=1e20)


NUMPY_OK = [(QK_FNS, "eps", np.float32(1e-5), float(np.float32(1e-5))),
            (QK_FNS, "rope_dim", np.int64(32), 32),
            (MLA_FNS, "kv_descale", np.float32(0.5), 0.5), (MLA_FNS, "kv_descale", 2, 2.0),
            (VA_FNS, "sm_scale", np.float32(0.125), 0.125), (VA_FNS, "k_scale", 1, 1.0),
            (VA_FNS, "num_kv_splits", np.int32(3), 3), (VA_FNS, "is_causal", np.bool_(False), False)]


@pytest.mark.parametrize("name,arg,val,plain", [pytest.param(n, a, v, p, id=f"{n}-{a}-{type(v).__name__}")
                                                for fns, a, v, p in NUMPY_OK for n in fns])
def test_numpy_and_int_scalars_mean_their_value(device, name, arg, val, plain):
    fn, build = ALL_FNS[name]
    kw_a, kw_b = build(device, **{arg: val}), build(device, **{arg: plain})
    assert _same(_state(kw_a, fn(**kw_a)), _state(kw_b, fn(**kw_b)))


# ----------------------------------------------------------------------------- 3. the batched reference

def _poison_unread(kw, value):
    """Every pool row no request reads, slot 0 among them (the batched reference pads with 0), := value."""
    idx = kw["kv_indices"][: int(kw["kv_indptr"][-1])].long()
    unread = torch.ones(kw["k_buffer"].shape[0], dtype=torch.bool, device=idx.device)
    unread[idx] = False
    if not unread[0]:
        spare = int(torch.nonzero(unread)[0])
        kw["kv_indices"][kw["kv_indices"] == 0] = spare
        unread[spare], unread[0] = False, True
    for buf in ("k_buffer", "v_buffer"):
        kw[buf][unread] = value
    return kw


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_batched_reference_is_immune_to_rows_it_does_not_read(device, value):
    """The batched chain padded short prefixes with slot 0 and masked only the scores: 0·NaN
    leaked (every output of the short request NaN with v_buffer[0] = NaN, slot 0 unread). The
    fp64 oracle, the per-request loop and the kernels never read those rows; nor may the reference."""
    clean = va_kw(device, o=None)
    _poison_unread(clean, 0.0)
    dirty = _poison_unread(va_kw(device, o=None), value)
    dirty["kv_indices"].copy_(clean["kv_indices"])
    assert rv.batchable(dirty["qo_indptr"].tolist(), dirty["kv_indptr"].tolist(), 4, 64)  # the batched path runs
    want = rv.verify_attention(**clean)["o"]
    got = rv.verify_attention(**dirty)["o"]
    assert not got.isnan().any() and torch.equal(_bits(got), _bits(want))


def test_batched_reference_keeps_an_inf_of_another_split_out_of_this_one(device):
    """An Inf in a row a request reads (split 1 of 2) is Inf in its output, as in the per-request
    loop and the oracle; masking only the scores made it 0·Inf = NaN in split 0's partial."""
    kw = va_kw(device, o=None, num_kv_splits=2)
    kw["v_buffer"][int(kw["kv_indices"][kw["kv_indptr"][2] - 1])] = float("inf")  # last key of request 1
    batched = rv.verify_attention(**kw)["o"]
    loop = rv.verify_attention(**kw, _stages=(rv.prefix_split_partials, rv.draft_partial, rv.combine))["o"]
    oracle = verify_attention_oracle(**kw)["o"]
    assert oracle.isinf().any()
    for got in (batched.cpu(), loop.cpu()):  # the oracle is on the CPU
        assert torch.equal(got.isnan(), oracle.isnan()) and torch.equal(got.isinf(), oracle.isinf())


# ----------------------------------------------------------------------------- 3b. not a tensor at all

OPTIONAL_TENSORS = ("slot_map", "decode_kernel_loc", "q_norm_weight", "q_out", "o", "custom_mask")
QK_PAIRED = ("ring", "loc")  # qk: None for both is legal (no store), for one a pairing error of its own
NOT_TENSORS = {"None": (lambda t: None, checks.DTypeError), "list": (lambda t: t.tolist(), checks.DTypeError),
               "0-d": (lambda t: t.reshape(-1)[0].clone(), checks.RankError)}


@pytest.mark.parametrize("name,arg,what", [
    pytest.param(n, a, w, id=f"{n}-{a}-{w}") for n in ALL_FNS for a in _tensor_args(n) for w in NOT_TENSORS
    if not (w == "None" and (a in OPTIONAL_TENSORS or (n in QK_FNS and a in QK_PAIRED)))])
def test_a_tensor_argument_that_is_not_a_tensor_is_refused_naming_it(device, name, arg, what):
    """None, a Python list or a 0-d tensor for a tensor argument: a typed error naming it, before
    anything reads the argument. The fused MLA step asked ``covered`` (the kernel's layout limits)
    for q_nope's strides before any check ran: AttributeError ('NoneType' / 'list' object has no
    attribute 'numel') and IndexError (stride(-1) of a 0-d tensor) instead."""
    make, err = NOT_TENSORS[what]
    _assert_refused(device, name, arg, err, **{arg: make(_tensor_args(name)[arg])})


def _placement(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return t.isnan(), t.isposinf(), t.isneginf()


def _assert_like_the_oracle(kw):
    """SDPA's NaN/±Inf placement is the oracle's (and the chain's), and its finite outputs are
    within the chain's allowance."""
    from harness import compare, ops

    oracle = verify_attention_oracle(**kw)["o"]
    chain = rv.verify_attention(**kw)["o"]
    got = rvs.verify_attention_sdpa(**kw)["o"]
    same = zip(_placement(chain.double().cpu()), _placement(oracle.cpu()))  # the oracle is on the CPU
    assert all(torch.equal(a, b) for a, b in same)  # the contract
    fin = compare.finite("finite:o", got, oracle)
    assert fin.passed, (fin.detail, fin.worst)
    num = compare.numeric("o", got, oracle, chain, ops.lookup_tolerance("verify_attention", "o", torch.bfloat16))
    assert num.passed, (num.err, num.allowed, num.worst)
    return oracle


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("mask", ["causal", "tree"])
def test_sdpa_is_immune_to_draft_keys_its_mask_hides(device, mask, value):
    """A non-finite k of the last draft of request 0, whose score the causal mask (or a tree
    mask in which each draft sees only itself) hides from the other drafts: the oracle, the chain
    and the kernels give those drafts finite outputs; SDPA added its -inf mask to the NaN / ±Inf
    score (NaN) and leaked it to every draft of the request (64 of 128 outputs NaN in the fuzzer's
    case). Only the hidden key's own draft may see it."""
    kw = va_kw(device, o=None)
    last = int(kw["qo_indptr"][1]) - 1
    kw["k"][last, 0, 3] = value
    if mask == "tree":
        qo = kw["qo_indptr"].tolist()
        kw.update(topk=2, custom_mask=torch.cat([torch.eye(qo[b + 1] - qo[b], dtype=torch.bool).flatten()
                                                 for b in range(len(qo) - 1)]).to(kw["q"].device))
    oracle = _assert_like_the_oracle(kw)
    assert oracle[:last].isfinite().all()  # the drafts the key is hidden from


@pytest.mark.parametrize("is_causal", [True, False])
def test_sdpa_gives_nan_where_every_score_of_a_row_is_minus_inf(device, is_causal):
    """q = +Inf in a dim where every key of its request is negative: every score of that row is
    -Inf, softmax is 0/0 = NaN in the oracle, the chain and the kernels. SDPA's math backend
    returns 0 for such a row (its safe softmax treats it as fully masked)."""
    kw = va_kw(device, o=None, is_causal=is_causal)
    t0, t1 = (int(x) for x in kw["qo_indptr"][:2])
    idx = kw["kv_indices"][int(kw["kv_indptr"][0]): int(kw["kv_indptr"][1])].long()
    kw["k_buffer"][idx, :, 5] = -kw["k_buffer"][idx, :, 5].abs() - 0.25
    kw["k"][t0:t1, :, 5] = -kw["k"][t0:t1, :, 5].abs() - 0.25
    kw["q"][t0, 1, 5] = float("inf")
    oracle = _assert_like_the_oracle(kw)
    assert oracle[t0, 1].isnan().all() and oracle[t0 + 1:].isfinite().all()


# ----------------------------------------------------------------------------- 4. meta tensors

@pytest.mark.parametrize("name,arg", [pytest.param(n, a, id=f"{n}-{a}") for n in ALL_FNS for a in _tensor_args(n)])
def test_a_meta_tensor_is_a_device_error_naming_it(device, name, arg):
    """A meta tensor has no values: index checks crashed deep inside torch (``.item()`` of meta)."""
    fn, build = ALL_FNS[name]
    kw = build(device)
    kw[arg] = kw[arg].to("meta")
    with pytest.raises(checks.DeviceError) as info:
        fn(**kw)
    assert info.value.arg == arg, str(info.value)


@pytest.mark.parametrize("name", list(ALL_FNS))
def test_every_tensor_on_meta_is_a_device_error(device, name):
    fn, build = ALL_FNS[name]
    kw = build(device)
    kw = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    with pytest.raises(checks.DeviceError):
        fn(**kw)


# ----------------------------------------------------------------------------- 5. empty batches

def _empty_qk(kw):
    for k in ("q", "kv", "positions", "loc", "q_out"):
        kw[k] = kw[k][:0]
    return kw


def _empty_mla(kw):
    for k in ("q_nope", "q_rope", "k_nope", "k_rope", "loc", "out_cache_loc", "decode_kernel_loc"):
        if k in kw:
            kw[k] = kw[k][:0]
    return kw


def _no_heads(kw, names):
    for k in names:
        if k in kw:
            kw[k] = kw[k][:, :0]
    return kw


EMPTY = {"qk": (QK_FNS, _empty_qk), "mla": (MLA_FNS, _empty_mla)}


@pytest.mark.parametrize("what", list(EMPTY))
def test_empty_batches_are_legal_everywhere_and_write_nothing(device, what):
    """T = 0 crashed the qk reference (a view of 0 elements) while the kernel returned empty
    outputs (and ``repro`` blamed the kernel). Now every entry point returns the same empty
    outputs and leaves every buffer as it was."""
    fns, shrink = EMPTY[what]
    shapes = {}
    for name, (fn, build) in fns.items():
        kw = shrink(build(device))
        before = [t.clone() for t in _state(kw, None)]
        res = _tensors(fn(**kw))
        assert _same(_state(kw, None), before), f"{name} wrote a buffer on an empty batch"
        assert res[0].numel() == 0, name
        shapes[name] = [tuple(t.shape) for t in res]
    wrappers = [s for n, s in shapes.items() if not n.endswith("_step")]
    steps = [s[0] for n, s in shapes.items() if n.endswith("_step")]  # q_out / q8 (the fused decode step keeps kv)
    assert all(s == wrappers[0] for s in wrappers) and all(s == steps[0] for s in steps), shapes


NO_HEADS = {"qk": (QK_FNS, ("q", "q_out"), "ring"), "mla": (MLA_FNS, ("q_nope", "q_rope"), "kv_buffer")}


@pytest.mark.parametrize("what", list(NO_HEADS))
def test_no_query_heads_is_legal_everywhere(device, what):
    """H = 0: empty q outputs, and the k side still computed and stored, the same rows by every entry point."""
    fns, names, buf = NO_HEADS[what]
    seen = {}
    for name, (fn, build) in fns.items():
        kw = _no_heads(build(device), names)
        before = kw[buf].clone()
        res = _tensors(fn(**kw))
        assert res[0].shape[1] == 0, name
        seen[name] = torch.nonzero((_bits(kw[buf]) != _bits(before)).any(-1)).flatten().tolist()
    assert all(rows == seen[next(iter(seen))] and rows for rows in seen.values()), seen


VA_EMPTY = {"B=0": dict(qo_indptr=[0], kv_indptr=[0]), "T=0": dict(qo_indptr=[0, 0], kv_indptr=[0, 3])}


@pytest.mark.parametrize("what", list(VA_EMPTY))
@pytest.mark.parametrize("name", list(VA_FNS))
def test_verify_attention_refuses_empty_batches_everywhere(device, name, what):
    """verify_attention: every request has at least one draft, so T = 0 or B = 0 is a typed
    error naming qo_indptr in every implementation (the same one)."""
    fn, build = ALL_FNS[name]
    kw = build(device)
    dev = kw["q"].device
    kw.update({k: torch.tensor(v, dtype=torch.int32, device=dev) for k, v in VA_EMPTY[what].items()})
    for k in ("q", "k", "v", "o"):
        kw[k] = kw[k][:0]
    with pytest.raises(checks.VerifyParityInputError) as info:
        fn(**kw)
    assert info.value.arg == "qo_indptr"


@pytest.mark.parametrize("indices", ["kept", "empty"])
@pytest.mark.parametrize("name", list(VA_FNS))
def test_an_empty_prefix_is_answered_everywhere(device, name, indices):
    """No request has a prefix (kv_indptr all zero; kv_indices kept, or empty): the drafts attend
    only to each other. Legal input: the split-KV and shared-KV kernels refused it with a plain
    ValueError ("empty kv_indices") where the reference chain answers; every entry point now
    answers, within the chain's allowance of the fp64 oracle."""
    from harness import compare, ops

    fn, build = ALL_FNS[name]
    kw = build(device, o=None)
    kw["kv_indptr"] = torch.zeros_like(kw["kv_indptr"])
    if indices == "empty":
        kw["kv_indices"] = kw["kv_indices"][:0]
    got = fn(**kw)["o"]
    oracle = verify_attention_oracle(**kw)["o"]
    rec = compare.numeric("o", got, oracle, rv.verify_attention(**kw)["o"],
                          ops.lookup_tolerance("verify_attention", "o", torch.bfloat16))
    assert rec.passed and got.isfinite().all(), (rec.err, rec.allowed, rec.worst)


# ----------------------------------------------------------------------------- 6, 7. modes and bools

@pytest.mark.parametrize("mode", ["bogus", "DECODE", None, "", 1])
@pytest.mark.parametrize("name", ["ref.qk_norm_rope_step", "fused.qk_norm_rope_step"])
def test_forward_mode_is_one_of_the_legal_values(device, name, mode):
    """The reference step treated any mode but 'decode' as target-verify; the fused one raised."""
    err = _assert_refused(device, name, "forward_mode", checks.ChoiceError, forward_mode=mode)
    assert all(m in str(err) for m in rq.FORWARD_MODES)


BOOLS = [(VA_FNS, "is_causal"), (VA_FNS, "splitkv_switch"), (MLA_STEPS := {k: v for k, v in MLA_FNS.items()
                                                                         if k.endswith("_step")}, "save_kv_cache"),
         (MLA_STEPS, "fused_switch"), ({"fused.qk_norm_rope_step": QK_FNS["fused.qk_norm_rope_step"]}, "verify_switch")]
NOT_BOOLS = ["False", "", 0, 1, 1.0, torch.tensor(True), None]


@pytest.mark.parametrize("val", NOT_BOOLS, ids=repr)
@pytest.mark.parametrize("name,arg", [pytest.param(n, a, id=f"{n}-{a}") for fns, a in BOOLS for n in fns])
def test_bool_arguments_are_bools(device, name, arg, val):
    """``is_causal='False'`` was causal, ``save_kv_cache='False'`` wrote: a flag is a bool (or
    numpy.bool_), never a truthy string, number or tensor. None means "from the environment"
    for the switches (``fused_switch`` of both MLA steps, ``verify_switch`` of the fused qk step)."""
    if val is None and arg in ("fused_switch", "verify_switch"):
        return
    _assert_refused(device, name, arg, checks.DTypeError, **{arg: val})


@pytest.mark.parametrize("name", ["ref.mla_fp8_prepare_step", "fused.mla_fp8_prepare_step"])
def test_mla_step_checks_its_inputs_with_writes_off(device, name):
    """The fused step validated inside the kernel's wrapper or before launch 5; with writes off
    neither ran, and the chain quantized inputs nobody had checked (an fp32 q_nope, a bad scale)."""
    kw = mla_step_kw(device)
    for arg, val, err in (("q_nope", kw["q_nope"].float(), checks.DTypeError), ("kv_descale", 1e-45, checks.RangeError),
                          ("fp8_policy", "clip", checks.ChoiceError)):
        _assert_refused(device, name, arg, err, save_kv_cache=False, **{arg: val})


GATES = [(fq.gate, dict(unified=True, forward_mode="decode", verify_switch=True, fused_non_unified=True)),
         (fm.gate, dict(save_kv_cache=True, fused_switch=True, write_loc_resolved=True, layout_covered=True)),
         (fv.gate, dict(model_family="generic", topk=1, use_mla=False, splitkv_switch=True, num_local_kv_heads=1))]


@pytest.mark.parametrize("gate,kw", GATES, ids=lambda x: getattr(x, "__module__", ""))
def test_gate_flags_are_bools(gate, kw):
    for arg, val in kw.items():
        if isinstance(val, bool):
            with pytest.raises(checks.DTypeError) as info:
                gate(**{**kw, arg: "False"})
            assert info.value.arg == arg


# ----------------------------------------------------------------------------- 8. integer knobs

INTS = [
    *[(VA_FNS, "num_kv_splits", v, e) for v, e in (
        (rv.MAX_KV_SPLITS + 1, checks.RangeError), (10 ** 4, checks.RangeError), (0, checks.RangeError),
        (2.0, checks.DTypeError), ("2", checks.DTypeError), (torch.tensor(2), checks.DTypeError),
        (True, checks.DTypeError))],
    *[(VA_FNS, "topk", v, e) for v, e in ((0, checks.RangeError), (1.0, checks.DTypeError), (True, checks.DTypeError))],
    *[(QK_FNS, "rope_dim", v, e) for v, e in ((32.0, checks.DTypeError), ("32", checks.DTypeError),
                                              (torch.tensor(32), checks.DTypeError), (0, checks.RangeError),
                                              (48, checks.RangeError))],
]


@pytest.mark.parametrize("name,arg,val,err", _entry_params(INTS))
def test_integer_knobs_are_bounded_ints(device, name, arg, val, err):
    """``num_kv_splits = 10**4`` ran for minutes (a grid and scratch of that many splits); now it
    is bounded by ``MAX_KV_SPLITS``. Integers are ints (Python or numpy), never float, str,
    bool or tensor."""
    _assert_refused(device, name, arg, err, **{arg: val})


def test_max_kv_splits_is_legal(device):
    rv.validate(**{**va_kw(device), "num_kv_splits": rv.MAX_KV_SPLITS})


@pytest.mark.parametrize("name", ["fused.verify_split_kv", "fused.verify_shared_kv"])
@pytest.mark.parametrize("arg,val,err", [("block_h", 3, checks.RangeError), ("block_h", 2.0, checks.DTypeError),
                                         ("block_h", 0, checks.RangeError), ("block_h", 512, checks.RangeError),
                                         ("combine_block_h", 2.0, checks.DTypeError),
                                         ("combine_block_h", 0, checks.RangeError)])
def test_block_sizes_are_powers_of_two(device, name, arg, val, err):
    _assert_refused(device, name, arg, err, **{arg: val})


def test_split_kv_refuses_a_head_block(device):
    """The split-KV kernel runs one query head per program: a ``block_h`` it would ignore is an error."""
    _assert_refused(device, "fused.verify_split_kv", "block_h", checks.UnsupportedError, block_h=2)


# ----------------------------------------------------------------------------- 9. tree masks

@pytest.mark.parametrize("name", ["fused.verify_split_kv", "fused.verify_shared_kv"])
def test_kernels_refuse_tree_masks(device, name):
    """Both kernels ignore custom masks: handed topk > 1 and a tree they computed the causal
    chain instead. The dispatcher never routes a tree to them; called directly they refuse it."""
    case = cv.VerifyAttentionCase(B=2, L=3, H=4, Hkv=2, D=64, Dv=64, prefix="list:3-8", topk=2, seed=6)
    kw = cv.build_inputs(case, device)
    with pytest.raises(checks.UnsupportedError) as info:
        ALL_FNS[name][0](**kw)
    assert info.value.arg == "custom_mask"
    out = fv.verify_attention(**kw)["o"]  # the dispatcher takes it to the reference
    assert torch.equal(_bits(out), _bits(rv.verify_attention(**kw)["o"]))


# ----------------------------------------------------------------------------- strings

@pytest.mark.parametrize("name,arg,val", [
    *[(n, "rope_style", v) for n in QK_FNS for v in ("gptj", None, 0)],
    *[(n, "fp8_policy", v) for n in MLA_FNS for v in ("clip", None)],
    *[(n, "model_family", v) for n in VA_FNS for v in ("llama", None)],
])
def test_named_options_are_choice_errors(device, name, arg, val):
    err = _assert_refused(device, name, arg, checks.ChoiceError, **{arg: val})
    assert isinstance(err, checks.VerifyParityInputError)


def test_scale_bounds_are_those_of_fp32():
    """What the scale check accepts: fp32's normal range, for a value and (kv_descale) its fp32 reciprocal."""
    tiny, big = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max
    assert checks.check_fp32_scale("s", tiny) == tiny and checks.check_fp32_scale("s", big) == big
    for bad in (tiny / 2, big * 2, math.inf):
        with pytest.raises(checks.RangeError):
            checks.check_fp32_scale("s", bad)
    assert rm.inv_descale(1.0 / big) is not None


MLA_POOL_ARGS = ("out_cache_loc", "slot_map", "decode_kernel_loc")


@pytest.mark.parametrize("name", [n for n in MLA_FNS if n.endswith("_step")])
@pytest.mark.parametrize("arg", MLA_POOL_ARGS)
def test_a_pool_index_on_another_device_is_refused_by_name(device, name, arg):
    """Found by the fuzzer on the H200 (device-cpu-among-gpu): a CPU ``out_cache_loc`` among CUDA
    tensors crashed the reference step inside torch and was taken by the fused step. Needs a second
    device: on a CPU-only machine there is none."""
    if device.torch_device.type == "cpu":
        pytest.skip("needs a device other than the CPU (GPU runners run it)")
    kw = ALL_FNS[name][1](device)
    if kw.get(arg) is None:
        pytest.skip(f"{arg} is not given in this case")
    _assert_refused(device, name, arg, checks.DeviceError, **{arg: kw[arg].cpu()})
