"""qk_norm_rope: parity, the gate's truth table, typed errors, and the planted bugs."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from hypothesis import given

from cases.qk_norm_rope import catalog as cases
from fused.qk_norm_rope import wrapper as fused
from harness.parity import runners
from harness.registry import Impl
from reference import checks
from reference.qk_norm_rope import chain as ref
from reference.qk_norm_rope import swa
from tests.helpers import assert_bad_input_named, assert_passes, bad_inputs, failed_checks

OP = "qk_norm_rope"
CATALOG = {c.name: c for c in cases.catalog()}


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
@bad_inputs(BAD)
def test_bad_input_is_a_typed_error_naming_the_argument(device, impl, arg, make, err):
    fn = ref.qk_norm_rope if impl == "reference" else fused.qk_norm_rope
    assert_bad_input_named(fn, _kw(device), arg, make, err, kept="ring")


def _paged_kw(device, **over):
    c = cases.QkNormRopeCase(T=3, H=2, D=128, R=64, mode="decode", unified=False, page_size=4, seed=1)
    kw = cases.build_inputs(c, device)
    kw.pop("forward_mode")
    kw.update(over)
    return kw


def _rope_dim_32(kw):
    """rope_dim 32 on D = 128 (its tables too): 96 nope values, not whole 64-value tiles."""
    kw["cos"], kw["sin"] = kw["cos"][:, :16].contiguous(), kw["sin"][:, :16].contiguous()
    return 32


BAD_PAGED = [
    ("swa_cache", lambda kw: kw["swa_cache"].view(torch.int8), checks.DTypeError),
    ("swa_cache", lambda kw: kw["swa_cache"][:, : 4 * 194 - 1].contiguous(), checks.ShapeError),
    ("swa_cache", lambda kw: kw["swa_cache"].view(-1), checks.RankError),
    ("swa_cache", lambda kw: kw["swa_cache"].t(), checks.LayoutError),
    ("swa_page_size", lambda kw: 0, checks.RangeError),
    ("swa_page_size", lambda kw: 4.0, checks.DTypeError),
    ("swa_page_size", lambda kw: None, checks.VerifyParityInputError),
    ("loc", lambda kw: torch.full_like(kw["loc"], kw["swa_cache"].shape[0] * 4), checks.RangeError),
    ("loc", lambda kw: torch.zeros_like(kw["loc"]), checks.RangeError),
    ("rope_dim", _rope_dim_32, checks.RangeError),
]


@pytest.mark.parametrize("impl", ["reference", "fused"])
@bad_inputs(BAD_PAGED)
def test_bad_paged_store_input_is_a_typed_error(device, impl, arg, make, err):
    fn = ref.qk_norm_rope if impl == "reference" else fused.qk_norm_rope
    assert_bad_input_named(fn, _paged_kw(device), arg, make, err, kept="swa_cache")


def test_ring_and_paged_cache_together_are_rejected(device):
    kw = _paged_kw(device)
    kw["ring"] = torch.zeros(9, 128, dtype=torch.bfloat16, device=kw["q"].device)
    with pytest.raises(checks.VerifyParityInputError) as info:
        fused.qk_norm_rope(**kw)
    assert info.value.arg == "swa_cache"


def test_ring_without_loc_is_rejected(device):
    kw = _kw(device, loc=None)
    with pytest.raises(checks.VerifyParityInputError) as info:
        fused.qk_norm_rope(**kw)
    assert info.value.arg == "loc"


# ----------------------------------------------------------------------------- non-unified: the paged fp8 store

def _branch(case) -> str:
    d = fused.gate(unified=case.unified, forward_mode=case.mode, verify_switch=True)
    return ("unified-decode" if d.in_kernel_store else "unified-verify") if case.unified else \
        ("non-unified" if d.in_kernel_store and not d.return_kv else "?")


def test_catalog_exercises_the_gates_three_branches():
    """Every branch of the store gate has catalog cases (and the non-unified one in both modes)."""
    seen = {(_branch(c), c.mode) for c in CATALOG.values()}
    assert {"unified-decode", "unified-verify", "non-unified"} == {b for b, _ in seen}
    assert {("non-unified", "decode"), ("non-unified", "target_verify")} <= seen


def test_swa_layout_is_deepseek_v4():
    """D = 512, R = 64: 448 fp8 + 128 bf16 value bytes, 7 scales + 1 pad; pages padded to whole
    576-byte records (SGLang's KVLayout.V4.page_bytes(64) = 37,440)."""
    lay = swa.SwaLayout(512, 64, 64)
    assert (lay.value_bytes, lay.scale_bytes, lay.tiles, lay.page_bytes) == (576, 8, 7, 37440)
    assert int(lay.scale_offset(torch.tensor(0))) == 64 * 576


def _fp8_table():
    """Every finite e4m3fn code's value (from its bits: sign, 4 exponent bits bias 7, 3 mantissa bits)."""
    vals = {}
    for code in range(256):
        sign, exp, man = code >> 7, (code >> 3) & 0xF, code & 7
        if exp == 0xF and man == 7:
            continue  # NaN
        v = (man / 8) * 2.0 ** -6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        vals[code] = -v if sign else v
    return vals


def _encode_by_search(row: list[float], lay) -> list[int]:
    """Independent of the reference: the exponent from Python's float math on the fp32 quotient,
    each code the nearest table value to x · 2**-e (ties to the even code), bf16 bytes by struct."""
    import math
    import struct

    table = _fp8_table()
    out_codes, out_scales = [], []
    for t in range(lay.tiles):
        tile = row[t * 64:(t + 1) * 64]
        amax = max(max(abs(v) for v in tile), struct.unpack("f", struct.pack("f", 1e-8))[0])
        quot = struct.unpack("f", struct.pack("f", amax / 448.0))[0]
        e = math.ceil(math.log2(quot))
        out_scales.append(e + 127)
        for v in tile:
            x = max(-448.0, min(448.0, v * 2.0 ** -e))
            best = min(table, key=lambda c: (abs(table[c] - x), c & 1, c))
            out_codes.append(0x80 if best == 0 and math.copysign(1, x) < 0 else best)
    rope = b"".join(struct.pack("<f", v)[2:] for v in row[lay.nope:])
    return out_codes + list(rope) + out_scales


def test_swa_encode_is_byte_exact():
    """The quantiser against a brute-force one: random rows, an all-zero tile (the 1e-8 floor), a
    tile whose |max| is exactly 448·2^-5 (the quotient a power of two: e = -5, not -4), fp8
    rounding ties, fp8 subnormals, negative zeros."""
    lay = swa.SwaLayout(192, 64, 1)
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 192, generator=g) * torch.tensor([1.0, 1e-3, 30.0, 1.0, 1.0, 1.0])[:, None]
    rows[3, :64] = 0.0
    rows[3, 64:128] = torch.linspace(-14.0, 14.0, 64)  # |max| = 448·2^-5, values on the fp8 grid and between
    rows[4, :64] = torch.tensor([14.0] + [0.875 * 2 ** -5 * (1 + k / 16) for k in range(63)])  # ties, e = -5
    rows[5, :64] = torch.tensor([448.0 * 2 ** -6] + [2.0 ** -16 * k for k in range(63)])  # subnormals
    rows[5, 64:80] = -0.0
    kv = rows.bfloat16()
    codes, scales, rope = swa.swa_encode(kv, lay)
    got = torch.cat((codes, rope, scales), dim=-1)
    for t in range(kv.shape[0]):
        assert got[t].tolist() == _encode_by_search(kv[t].float().tolist(), lay), t


@pytest.mark.parametrize("D,R,P,padding", [(512, 64, 64, 0), (128, 64, 3, 2), (64, 64, 2, 1)])
def test_fused_paged_store_is_an_exact_function_of_its_kv_row(device, D, R, P, padding):
    """The exact half of the contract, on any device: the kernel's pages hold byte for byte what the
    chain's store (launch 3') writes for the kernel's own bf16 rows; the rows themselves are numeric
    (a GPU's rsqrt may move one by an ulp), which is why the suite compares decoded rows."""
    c = cases.QkNormRopeCase(T=7, H=2, D=D, R=R, unified=False, page_size=P, padding=padding, mode="decode", seed=4)
    kw = cases.build_inputs(c, device)
    kw.pop("forward_mode"), kw.pop("ring")
    pool = kw["swa_cache"].clone()
    _, kv_out = fused.qk_norm_rope(**kw)
    swa.swa_paged_store(kv_out, pool, kw["loc"], swa.SwaLayout(D, R, P))
    assert torch.equal(kw["swa_cache"].cpu(), pool.cpu())


def test_nonunified_switch_off_takes_the_chain_and_the_backend_store(spec, registry, device):
    """fused_non_unified=False (the model's switch off): the chain, kv handed back, and the backend's
    paged store writes the same pages as the kernel would."""
    c = CATALOG["dsv4-nonunified-decode-b4-h16"]
    kw = cases.build_inputs(c, device)
    off = fused.qk_norm_rope_step(**{**kw, "swa_cache": kw["swa_cache"].clone()}, fused_non_unified=False)
    a = {**kw, "swa_cache": kw["swa_cache"].clone()}
    on = fused.qk_norm_rope_step(**a)
    assert on["kv_out"] is None and off["kv_out"] is not None
    b = {**kw, "swa_cache": kw["swa_cache"].clone()}
    fused.qk_norm_rope_step(**b, fused_non_unified=False)
    assert torch.equal(a["swa_cache"].cpu(), b["swa_cache"].cpu())


def _truncating_fp8_store(**kw):
    """The chain, its paged store rounding each fp8 code toward zero (one code down in magnitude
    wherever RNE rounded away from zero)."""
    from cases.qk_norm_rope import mutants as m

    from reference.mla_fp8_prepare import chain as mla_chain

    def store(kv_out, swa_cache, loc, lay):
        orig = mla_chain.cast_fp8

        def rtz(x, dt, policy, scale_mul=None):
            codes = orig(x, dt, policy, scale_mul)
            up = codes.float().abs() > x.float().abs()
            return torch.where(up, (codes.view(torch.uint8) - 1).view(dt), codes)

        mla_chain.cast_fp8 = rtz
        try:
            swa.swa_paged_store(kv_out, swa_cache, loc, lay)
        finally:
            mla_chain.cast_fp8 = orig

    return m._chain_with_store(kw, store)


def test_swa_tolerance_does_not_hide_truncation(spec, device):
    """An fp8 cast that truncates (up to a whole fp8 ulp, e ≈ 2) fails the floor of 1.25."""
    bad = failed_checks(spec, Impl(OP, "rtz", "external", _truncating_fp8_store),
                        CATALOG["dsv4-nonunified-decode-b4-h16"], device)
    assert "effect:swa_cache" in bad


# ----------------------------------------------------------------------------- the harness bites

MUTANT_PROOF = {
    # mutant: (a catalog case it must fail on, the check that must flag it)
    "mutant-rope-style-swapped-q": ("dsv4-verify-b1-l3-h16", "numeric:q_out"),
    "mutant-eps-outside-sqrt": ("tiny-rows-eps-visible", "numeric:q_out"),
    "mutant-store-left-on-in-verify": ("dsv4-verify-b1-l3-h16", "untouched:ring"),
    "mutant-nonunified-skips-paged-store": ("dsv4-nonunified-verify-b2-l3-h16", "effect:swa_cache"),
    "mutant-bf16-row-in-fp8-cache": ("nonunified-short-pages-padding", "effect:swa_cache"),
    "mutant-scale-exponent-floored": ("nonunified-odd-pages-q-out", "effect:swa_cache"),
    "mutant-pad-byte-written": ("nonunified-short-pages-padding", "untouched:swa_cache"),
}


def test_nonunified_store_mutant_needs_a_verify_case(spec, registry, device):
    """Dropping ``unified and`` from the verify branch changes nothing in non-unified decode."""
    assert_passes(spec, registry.impls[f"{OP}/mutant-nonunified-skips-paged-store"],
                  CATALOG["dsv4-nonunified-decode-b4-h16"], device)


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
    q = ref.rope_fp32(ref.rms_norm_fp32(kw["q"], kw["q_norm_weight"], kw["eps"]), kw["cos"][kw["positions"]],
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
