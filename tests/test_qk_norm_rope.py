"""qk_norm_rope: parity, the gate's truth table, typed errors, and the planted bugs."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from hypothesis import given

from cases import qk_norm_rope as cases
from fused import qk_norm_rope as fused
from harness import runners
from harness.registry import Impl
from reference import checks
from reference import qk_norm_rope as ref
from tests.helpers import assert_passes, failed_checks

OP = "qk_norm_rope"
CATALOG = {c.name: c for c in cases.catalog()}


@pytest.fixture(scope="module")
def spec(registry):
    return registry.ops[OP]


@pytest.mark.parametrize("name", sorted(CATALOG))
@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_catalog_parity(spec, registry, device, impl, name):
    assert_passes(spec, registry.impls[f"{OP}/{impl}"], CATALOG[name], device)


@given(case=cases.cases(max_tokens=24, max_heads=6))
def test_generated_parity_fused(spec, registry, device, case):
    assert_passes(spec, registry.impls[f"{OP}/fused"], case, device)


def test_fused_and_reference_differ_by_at_most_one_ulp_rarely(device):
    """Both round the same fp32 math once: they may differ only where fp32 noise (reduction
    order, the GPU's approximate rsqrt) flips a rounding — by one ulp, on a small fraction.
    Under the interpreter (same numpy fp32 math) they agree to the bit on this batch."""
    c = CATALOG["dsv4-verify-b8-l3-h16"]
    kw = cases.build_inputs(c, device)
    a = fused.qk_norm_rope_step(**{**kw, "ring": kw["ring"].clone()})
    b = ref.qk_norm_rope_step(**{**kw, "ring": kw["ring"].clone()})
    for name in ("q_out", "kv_out"):
        ulps = (a[name].view(torch.int16).int() - b[name].view(torch.int16).int()).abs()
        assert int(ulps.max()) <= 1, name
        assert float((ulps > 0).float().mean()) < (1e-9 if device.interpreted else 0.01), name


# ----------------------------------------------------------------------------- the gate

TRUTH_TABLE = {
    # (unified, forward_mode, verify_switch, fused_non_unified): (use_fused, in_kernel_store, return_kv)
    (True, "decode", True, True): (True, True, False),
    (True, "decode", False, True): (True, True, False),
    (True, "target_verify", True, True): (True, False, True),
    (True, "target_verify", False, True): (False, False, True),
    (True, "extend", True, True): (False, False, True),
    (True, "extend", False, True): (False, False, True),
    (False, "decode", True, True): (True, True, False),
    (False, "target_verify", True, True): (True, True, False),
    (False, "target_verify", True, False): (False, False, True),
    (False, "extend", False, True): (True, True, False),
    (False, "decode", False, False): (False, False, True),
}


@pytest.mark.parametrize("key", sorted(TRUTH_TABLE, key=str))
def test_gate_truth_table(key):
    unified, mode, switch, non_unified = key
    d = fused.gate(unified=unified, forward_mode=mode, verify_switch=switch, fused_non_unified=non_unified)
    assert (d.use_fused, d.in_kernel_store, d.return_kv) == TRUTH_TABLE[key]


def test_unified_verify_never_stores_in_kernel():
    """Seed 000's invariant over the whole input space: a unified target-verify step never
    lets the kernel write the ring, and always hands kv back to attention."""
    for switch, non_unified in itertools.product((False, True), repeat=2):
        d = fused.gate(unified=True, forward_mode="target_verify", verify_switch=switch, fused_non_unified=non_unified)
        assert not d.in_kernel_store and d.return_kv


def test_gate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="forward_mode"):
        fused.gate(unified=True, forward_mode="draft_extend", verify_switch=True)


@pytest.mark.parametrize("value,expected", [(None, True), ("1", True), ("0", False), ("false", False), ("off", False)])
def test_verify_switch_env(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(fused.VERIFY_SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(fused.VERIFY_SWITCH_ENV, value)
    assert fused.verify_switch_from_env() is expected


def test_switch_off_takes_the_chain_and_matches(spec, registry, device, monkeypatch):
    monkeypatch.setenv(fused.VERIFY_SWITCH_ENV, "0")
    assert_passes(spec, registry.impls[f"{OP}/fused"], CATALOG["dsv4-verify-b1-l3-h16"], device)


# ----------------------------------------------------------------------------- bad input

def _kw(device, **over):
    c = cases.QkNormRopeCase(T=3, H=2, D=128, R=64, mode="decode", seed=1)
    kw = cases.build_inputs(c, device)
    kw.pop("forward_mode")
    kw.update(over)
    return kw


BAD = [
    ("q", lambda kw: kw["q"][0], checks.RankError),
    ("q", lambda kw: kw["q"].float(), checks.DTypeError),
    ("kv", lambda kw: kw["kv"][:2], checks.ShapeError),
    ("kv", lambda kw: kw["kv"].t().contiguous().t(), checks.LayoutError),
    ("rope_dim", lambda kw: 48, checks.VerifyParityInputError),
    ("rope_dim", lambda kw: 256, checks.VerifyParityInputError),
    ("positions", lambda kw: torch.full_like(kw["positions"], kw["cos"].shape[0]), checks.RangeError),
    ("positions", lambda kw: kw["positions"].float(), checks.DTypeError),
    ("loc", lambda kw: torch.full_like(kw["loc"], kw["ring"].shape[0]), checks.RangeError),
    ("loc", lambda kw: torch.zeros_like(kw["loc"]), checks.RangeError),
    ("q_out", lambda kw: torch.empty(3, 2, 64, dtype=torch.bfloat16, device=kw["q"].device), checks.ShapeError),
    ("eps", lambda kw: 0.0, checks.VerifyParityInputError),
    ("rope_style", lambda kw: "gptj", checks.VerifyParityInputError),
    ("cos", lambda kw: kw["cos"].double(), checks.DTypeError),
]


@pytest.mark.parametrize("impl", ["reference", "fused"])
@pytest.mark.parametrize("arg,make,err", BAD, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD)])
def test_bad_input_is_a_typed_error_naming_the_argument(device, impl, arg, make, err):
    fn = ref.qk_norm_rope if impl == "reference" else fused.qk_norm_rope
    kw = _kw(device)
    ring_before = kw["ring"].clone()
    kw[arg] = make(kw)
    with pytest.raises(err) as info:
        fn(**kw)
    assert info.value.arg == arg
    assert torch.equal(kw["ring"], ring_before) if arg != "ring" else True  # no partial write


def test_ring_without_loc_is_rejected(device):
    kw = _kw(device, loc=None)
    with pytest.raises(checks.VerifyParityInputError) as info:
        fused.qk_norm_rope(**kw)
    assert info.value.arg == "loc"


# ----------------------------------------------------------------------------- the harness bites

MUTANT_PROOF = {
    # mutant: (a catalog case it must fail on, the check that must flag it)
    "mutant-rope-style-swapped-q": ("dsv4-verify-b1-l3-h16", "numeric:q_out"),
    "mutant-eps-outside-sqrt": ("tiny-rows-eps-visible", "numeric:q_out"),
    "mutant-store-left-on-in-verify": ("dsv4-verify-b1-l3-h16", "untouched:ring"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANT_PROOF))
def test_mutant_is_flagged(spec, registry, device, mutant):
    case_name, check = MUTANT_PROOF[mutant]
    bad = failed_checks(spec, registry.impls[f"{OP}/{mutant}"], CATALOG[case_name], device)
    assert check in bad, f"{mutant} survived {case_name}: failing checks {bad}"


def test_eps_mutant_invisible_at_unit_scale(spec, registry, device):
    """Why the catalog carries tiny rows: at unit scale eps placement is below bf16 resolution."""
    c = dataclasses.replace(CATALOG["tiny-rows-eps-visible"], scale=1.0)
    assert failed_checks(spec, registry.impls[f"{OP}/mutant-eps-outside-sqrt"], c, device) == []


def test_store_mutant_is_harmless_in_decode(spec, registry, device):
    """The store is legal in decode: the mutant only differs in target-verify."""
    assert_passes(spec, registry.impls[f"{OP}/mutant-store-left-on-in-verify"], CATALOG["dsv4-decode-b1-h16"], device)


def _zeros(**kw):
    out = ref.qk_norm_rope_step(**kw)
    return {k: torch.zeros_like(v) for k, v in out.items()}


def _truncating(**kw):
    """Rounds fp32 -> bf16 toward zero, as the raw interpreter does."""
    kw = dict(kw)
    out = kw.pop("q_out")
    q = ref._rope_fp32(ref._rms_norm_fp32(kw["q"], kw["q_norm_weight"], kw["eps"]), kw["cos"][kw["positions"]],
                       kw["sin"][kw["positions"]], kw["rope_dim"], kw["rope_style"])
    q = (q.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    res = ref.qk_norm_rope_step(**kw, q_out=out)
    if out is not None:
        out.copy_(q)
    return {"q_out": out if out is not None else q, "kv_out": res["kv_out"]}


@pytest.mark.parametrize("bug", [_zeros, _truncating], ids=["writes-zeros", "truncates-bf16"])
def test_tolerance_does_not_hide(spec, device, bug):
    """A kernel that writes zeros, or one that truncates like the raw interpreter, must fail."""
    impl = Impl(OP, bug.__name__, "external", bug)
    bad = failed_checks(spec, impl, CATALOG["dsv4-verify-b1-l3-h16"], device)
    assert "numeric:q_out" in bad


@pytest.mark.parametrize("name", ["one-token-one-head", "neox-decode-q-weight"])
def test_compiled_reference_chain_passes(spec, registry, device, name):
    """torch.compile of the chain is a registered implementation and is held to the same suite."""
    assert_passes(spec, registry.impls[f"{OP}/compiled"], CATALOG[name], device)
