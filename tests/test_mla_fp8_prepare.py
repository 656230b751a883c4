"""mla_fp8_prepare: byte parity, the reference against an independent fp8 encoder, the gate's
truth table, exactly-once KV writes, typed errors, the strategies, and the planted bugs."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from hypothesis import Phase, assume, find, given, settings

from cases import base
from cases.mla_fp8_prepare import catalog as cases
from fused.mla_fp8_prepare import wrapper as fused
from harness.parity import runners
from harness.devices import Device
from reference import checks
from reference.mla_fp8_prepare import chain as ref
from reference.mla_fp8_prepare.encoder import encode_fp8_oracle, fp8_code_values
from tests.helpers import assert_bad_input_named, assert_passes, bad_inputs, failed_checks

OP = "mla_fp8_prepare"
CATALOG = {c.name: c for c in cases.catalog()}
ALL_BF16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


# ----------------------------------------------------------------------------- parity

@pytest.mark.parametrize("name", sorted(CATALOG))
@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_catalog_parity(spec, registry, device, impl, name):
    case = CATALOG[name]
    if impl == "fused" and case.policy != fused.KERNEL_FP8_POLICY:
        res = runners.run_case(spec, registry.impls[f"{OP}/fused"], case, device)
        assert res.refused and "kernel implements 'saturate'" in res.refused, "a nan-policy case must be refused"
        return
    if impl == "fused" and case.fp8_format not in fused.kernel_fp8_formats(device):
        pytest.skip(f"{case.fp8_format} does not compile for {device.arch} (test_fnuz_is_refused_on_nvidia...)")
    assert_passes(spec, registry.impls[f"{OP}/{impl}"], case, device)



@pytest.mark.parametrize("name", ["k3-verify-b1-l3-h8", "edge-values-only-fnuz", "nan-policy-overflow",
                                  "translated-pool-no-capture-loc"])
def test_compiled_chain_parity(spec, registry, device, name):
    case = CATALOG[name]
    if case.fp8_format not in fused.kernel_fp8_formats(device):  # inductor emits Triton: same targets
        pytest.skip(f"{case.fp8_format} does not compile for {device.arch} (test_fnuz_is_refused_on_nvidia...)")
    assert_passes(spec, registry.impls[f"{OP}/compiled"], case, device)


@given(case=cases.cases(max_tokens=8, max_heads=4))
def test_generated_parity_fused(spec, registry, device, case):
    impl = registry.impls[f"{OP}/fused"]
    assume(impl.can_handle(case, device) is True)  # nan policy; fnuz on NVIDIA (tested on their own)
    assert_passes(spec, impl, case, device)


def test_kernel_alone_matches_chain_on_edge_values(device):
    """The wrapper, without the dispatch around it: every edge value, both formats, with and
    without a power-of-two descale (ties survive it), strided inputs."""
    for fmt, descale in itertools.product(fused.kernel_fp8_formats(device), (0.0, 0.5)):
        c = dataclasses.replace(CATALOG["edge-values-only"], fp8_format=fmt, kv_descale=descale)
        kw = cases.build_inputs(c, device)
        args = dict(q_nope=kw["q_nope"], q_rope=kw["q_rope"], k_nope=kw["k_nope"], k_rope=kw["k_rope"],
                    loc=kw["decode_kernel_loc"], kv_descale=kw["kv_descale"])
        buf_f, buf_r = kw["kv_buffer"].clone(), kw["kv_buffer"].clone()
        q8_f = fused.mla_fp8_prepare(kv_buffer=buf_f, **args)
        q8_r = ref.mla_fp8_prepare(kv_buffer=buf_r, **args)
        assert torch.equal(q8_f.view(torch.uint8), q8_r.view(torch.uint8)), (fmt, descale)
        assert torch.equal(buf_f.view(torch.uint8), buf_r.view(torch.uint8)), (fmt, descale)


# ----------------------------------------------------------------------------- the reference vs the fp64 encoder

@pytest.mark.parametrize("fmt", cases.FP8_FORMATS)
@pytest.mark.parametrize("policy", ref.POLICIES)
@pytest.mark.parametrize("descale", [None, 0.5, 0.37, 3.3, 1 / 448])
def test_cast_matches_independent_encoder_on_every_bf16(fmt, policy, descale):
    """All 65,536 bf16 inputs (every tie, boundary, subnormal, overflow, ±inf, NaN payload)."""
    got = ref.cast_fp8(ALL_BF16, ref.FP8_DTYPES[fmt], policy, ref.inv_descale(descale)).view(torch.uint8)
    want = encode_fp8_oracle(ref.scaled_k_fp32(ALL_BF16, descale), fmt, policy)
    bad = torch.nonzero(got != want).flatten()
    assert bad.numel() == 0, f"x={ALL_BF16[bad[:5]].tolist()} got={got[bad[:5]].tolist()} want={want[bad[:5]].tolist()}"


@pytest.mark.parametrize("fmt", cases.FP8_FORMATS)
def test_decode_table_agrees_with_torch(fmt):
    dt = ref.FP8_DTYPES[fmt]
    mine = fp8_code_values(fmt)
    theirs = torch.arange(256, dtype=torch.uint8).view(dt).double()
    assert torch.equal(torch.isnan(mine), torch.isnan(theirs))
    ok = ~torch.isnan(mine)
    assert torch.equal(mine[ok], theirs[ok])


ENCODER_FACTS = [
    # (fmt, policy, x, code): the hand-checkable corners of the format definitions
    ("e4m3fn", "saturate", 464.0, 0x7E), ("e4m3fn", "nan", 464.0, 0x7E), ("e4m3fn", "nan", 466.0, 0x7F),
    ("e4m3fn", "saturate", float("inf"), 0x7E), ("e4m3fn", "saturate", float("-inf"), 0xFE),
    ("e4m3fn", "nan", float("-inf"), 0x7F), ("e4m3fn", "saturate", float("-nan"), 0x7F),
    ("e4m3fn", "saturate", 7.9, 0x50), ("e4m3fn", "saturate", 2.0 ** -10, 0x00), ("e4m3fn", "saturate", -2.0 ** -10, 0x80),
    ("e4m3fn", "saturate", 3 * 2.0 ** -10, 0x02), ("e4m3fn", "saturate", 1.0625, 0x38), ("e4m3fn", "saturate", 1.1875, 0x3A),
    ("e4m3fnuz", "saturate", 247.0, 0x7F), ("e4m3fnuz", "nan", 247.0, 0x7F), ("e4m3fnuz", "nan", 248.0, 0x80),
    ("e4m3fnuz", "saturate", 248.0, 0x7F), ("e4m3fnuz", "saturate", float("-inf"), 0xFF),
    ("e4m3fnuz", "saturate", -0.0, 0x00), ("e4m3fnuz", "saturate", -2.0 ** -11, 0x00), ("e4m3fnuz", "nan", float("nan"), 0x80),
]


@pytest.mark.parametrize("fmt,policy,x,code", ENCODER_FACTS)
def test_encoder_and_chain_on_hand_checked_values(fmt, policy, x, code):
    xt = torch.tensor([x], dtype=torch.float64)
    assert int(encode_fp8_oracle(xt, fmt, policy)) == code
    assert int(ref.cast_fp8(xt.float(), ref.FP8_DTYPES[fmt], policy).view(torch.uint8)) == code


@pytest.mark.parametrize("name", ["edge-values-only", "edge-values-only-fnuz", "descale-0.37", "nan-policy-edges-fnuz",
                                  "overflow-heavy", "subnormal-heavy-fnuz"])
def test_reference_step_matches_oracle(device, name):
    kw = cases.build_inputs(CATALOG[name], device)
    out = ref.mla_fp8_prepare_step(**kw)
    orc = ref.mla_fp8_prepare_oracle(**kw)
    assert torch.equal(out["q8"].cpu().view(torch.uint8), orc["q8"].view(torch.uint8))
    loc = kw["out_cache_loc"].cpu()
    rows = cases.written_rows(CATALOG[name], kw)
    assert torch.equal(kw["kv_buffer"].cpu().view(torch.uint8)[rows], orc["k_row8"].view(torch.uint8)[loc >= 0])


# ----------------------------------------------------------------------------- the gate

@pytest.mark.parametrize("key", list(itertools.product((False, True), repeat=4)), ids=str)
def test_gate_truth_table(key):
    save, switch, resolved, covered = key
    d = fused.gate(save_kv_cache=save, fused_switch=switch, write_loc_resolved=resolved, layout_covered=covered)
    assert d.use_fused == all(key)
    first_off = next((why for on, why in zip(key, ("writes off", "static switch off", "no resolvable write location",
                                                   "layout not covered")) if not on), "fused")
    assert d.reason == first_off


def test_covered_names_the_reason(device):
    kw = cases.build_inputs(CATALOG["q-inner-strided-not-covered"], device)
    args = {k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer")}
    assert "q_nope innermost stride 2" in fused.covered(**args, fp8_policy="saturate")
    kw = cases.build_inputs(CATALOG["k3-verify-b1-l3-h8"], device)
    args = {k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer")}
    assert fused.covered(**args, fp8_policy="saturate") == ""
    assert "policy 'nan'" in fused.covered(**args, fp8_policy="nan")


def test_resolve_never_returns_the_logical_loc(device):
    kw = cases.build_inputs(CATALOG["translated-pool"], device)
    got = fused.resolve_fused_write_loc(out_cache_loc=kw["out_cache_loc"], decode_kernel_loc=kw["decode_kernel_loc"])
    assert got is kw["decode_kernel_loc"]
    assert fused.resolve_fused_write_loc(out_cache_loc=kw["out_cache_loc"], decode_kernel_loc=None) is None


@pytest.mark.parametrize("value,expected", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_fused_switch_env(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(fused.FUSED_SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(fused.FUSED_SWITCH_ENV, value)
    assert fused.fused_switch_from_env() is expected


# ----------------------------------------------------------------------------- exactly-once writes

BRANCHES = {
    # branch: (case overrides, the kernel runs)
    "fused": ({}, True),
    "writes-off": ({"save_kv_cache": False}, False),
    "switch-off": ({"switch": False}, False),
    "no-capture-loc": ({"capture_loc": False}, False),
    "inner-strided": ({"q_layout": "inner_strided"}, False),
    "nan-policy": ({"policy": "nan"}, False),
}


@pytest.mark.parametrize("pool", cases.POOLS)
@pytest.mark.parametrize("branch", sorted(BRANCHES))
def test_every_path_writes_each_row_once_at_the_physical_slot(device, branch, pool):
    over, kernel_runs = BRANCHES[branch]
    c = cases.MlaFp8PrepareCase(T=7, H=2, Dn=64, R=16, padding=2, extra_slots=9, pool=pool, scale=300.0,
                                kv_descale=0.37, seed=3, **over)
    kw = cases.build_inputs(c, device)
    calls = []

    def spy(**a):
        calls.append(a["loc"])
        return fused.mla_fp8_prepare(**a)

    before = kw["kv_buffer"].cpu().clone()
    out = fused.mla_fp8_prepare_step(**kw, kernel_fn=spy)
    assert bool(calls) == kernel_runs == (cases.expected_path(c) == "kernel")
    if kernel_runs:  # the sentinel: the kernel's q8 is the one handed on
        assert calls[0] is kw["decode_kernel_loc"]
    rows = cases.written_rows(c, kw)
    want = torch.zeros(kw["kv_buffer"].shape[0], dtype=torch.int32)
    want[rows] = 1
    assert torch.equal(out["kv_writes"].cpu(), want)
    ref_kw = cases.build_inputs(c, device)
    ref_out = ref.mla_fp8_prepare_step(**ref_kw)
    after = kw["kv_buffer"].cpu().view(torch.uint8)
    assert torch.equal(after, ref_kw["kv_buffer"].cpu().view(torch.uint8))
    assert torch.equal(out["q8"].cpu().view(torch.uint8), ref_out["q8"].cpu().view(torch.uint8))
    keep = torch.ones(after.shape[0], dtype=torch.bool)
    keep[rows] = False
    assert torch.equal(after[keep], before.view(torch.uint8)[keep])
    if pool == "translated" and c.save_kv_cache:  # the logical slots themselves were not the target
        logical = kw["out_cache_loc"].cpu().long()
        logical = logical[logical >= 0]
        moved = logical[~torch.isin(logical, rows)]
        assert torch.equal(after[moved], before.view(torch.uint8)[moved])


# ----------------------------------------------------------------------------- bad input

def _kw(device, **over):
    kw = cases.build_inputs(cases.MlaFp8PrepareCase(T=3, H=2, Dn=32, R=8, pool="identity", seed=1), device)
    kw = {k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "kv_descale", "fp8_policy")} | \
        {"loc": kw["out_cache_loc"]}
    kw.update(over)
    return kw


BAD = [
    ("q_nope", lambda kw: kw["q_nope"][0], checks.RankError),
    ("q_nope", lambda kw: kw["q_nope"].float(), checks.DTypeError),
    ("q_rope", lambda kw: kw["q_rope"][:2], checks.ShapeError),
    ("k_nope", lambda kw: kw["k_nope"][:, :16], checks.ShapeError),
    ("k_rope", lambda kw: kw["k_rope"].half(), checks.DTypeError),
    ("kv_buffer", lambda kw: kw["kv_buffer"][:, :30], checks.ShapeError),
    ("kv_buffer", lambda kw: kw["kv_buffer"].view(torch.uint8), checks.DTypeError),
    ("loc", lambda kw: torch.full_like(kw["loc"], kw["kv_buffer"].shape[0]), checks.RangeError),
    ("loc", lambda kw: torch.ones_like(kw["loc"]), checks.RangeError),  # duplicates
    ("loc", lambda kw: kw["loc"].float(), checks.DTypeError),
    ("loc", lambda kw: kw["loc"][:2], checks.ShapeError),
    ("kv_descale", lambda kw: 0.0, checks.VerifyParityInputError),
    ("kv_descale", lambda kw: float("inf"), checks.VerifyParityInputError),
    ("kv_descale", lambda kw: torch.tensor(0.5), checks.DTypeError),
    ("fp8_policy", lambda kw: "clip", checks.VerifyParityInputError),
]


@pytest.mark.parametrize("impl", ["reference", "fused"])
@bad_inputs(BAD)
def test_bad_input_is_a_typed_error_naming_the_argument(device, impl, arg, make, err):
    fn = ref.mla_fp8_prepare if impl == "reference" else fused.mla_fp8_prepare
    assert_bad_input_named(fn, _kw(device), arg, make, err, kept="kv_buffer")


def test_kernel_refuses_inner_strides_and_the_chain_takes_them(device):
    kw = _kw(device)
    wide = torch.zeros(*kw["q_nope"].shape[:2], 2 * kw["q_nope"].shape[2], dtype=torch.bfloat16,
                       device=kw["q_nope"].device)
    wide[..., ::2] = kw["q_nope"]
    kw["q_nope"] = wide[..., ::2]
    with pytest.raises(checks.LayoutError) as info:
        fused.mla_fp8_prepare(**kw)
    assert info.value.arg == "q_nope"
    ref.mla_fp8_prepare(**kw)  # the contract takes any strides


def test_kernel_refuses_the_nan_policy(device):
    with pytest.raises(checks.VerifyParityInputError) as info:
        fused.mla_fp8_prepare(**_kw(device, fp8_policy="nan"))
    assert info.value.arg == "fp8_policy"


STEP_BAD = [
    ("out_cache_loc", lambda kw: kw["out_cache_loc"] + kw["slot_map"].shape[0], checks.RangeError),
    ("out_cache_loc", lambda kw: torch.ones_like(kw["out_cache_loc"]), checks.RangeError),
    ("slot_map", lambda kw: torch.zeros_like(kw["slot_map"]), checks.RangeError),
    ("slot_map", lambda kw: kw["slot_map"] + kw["kv_buffer"].shape[0], checks.RangeError),
    ("slot_map", lambda kw: -1 - kw["slot_map"], checks.RangeError),  # no padding in the map
    ("decode_kernel_loc", lambda kw: kw["decode_kernel_loc"][:1], checks.ShapeError),
    ("decode_kernel_loc", lambda kw: kw["decode_kernel_loc"] + kw["kv_buffer"].shape[0], checks.RangeError),
    ("decode_kernel_loc", lambda kw: torch.ones_like(kw["decode_kernel_loc"]), checks.RangeError),  # duplicates
]


@pytest.mark.parametrize("impl", ["reference", "fused"])
@bad_inputs(STEP_BAD)
def test_step_rejects_bad_pool_arguments(device, impl, arg, make, err):
    fn = ref.mla_fp8_prepare_step if impl == "reference" else fused.mla_fp8_prepare_step
    kw = cases.build_inputs(cases.MlaFp8PrepareCase(T=3, H=2, Dn=32, R=8, seed=2), device)
    kw[arg] = make(kw)
    with pytest.raises(err) as info:
        fn(**kw)
    assert info.value.arg == arg


def test_fnuz_is_refused_on_nvidia_and_runs_on_amd(registry):
    impl = registry.impls[f"{OP}/fused"]
    c = CATALOG["k3-verify-b1-l3-h8-fnuz"]
    h200 = Device("cuda", "NVIDIA H200", "sm90", "e4m3fn", "")
    mi300 = Device("rocm", "MI300X", "gfx942", "e4m3fnuz", "")
    assert "e4m3fnuz on cuda" in impl.can_handle(c, h200)
    assert impl.can_handle(c, mi300) is True
    assert impl.can_handle(CATALOG["k3-verify-b1-l3-h8"], h200) is True
    # MI355's native format is OCP e4m3fn; fnuz there is refused, not compiled (triton 3.6 fails to lower it)
    mi355 = Device("rocm", "MI355X", "gfx950", "e4m3fn", "")
    assert "e4m3fnuz on rocm gfx950" in impl.can_handle(c, mi355)
    assert impl.can_handle(CATALOG["k3-verify-b1-l3-h8"], mi355) is True


# ----------------------------------------------------------------------------- strategies and values

REACH = {
    "e4m3fnuz": lambda c: c.fp8_format == "e4m3fnuz",
    "nan-policy": lambda c: c.policy == "nan",
    "identity-pool": lambda c: c.pool == "identity",
    "translated-pool": lambda c: c.pool == "translated",
    "inner-strided": lambda c: c.q_layout == "inner_strided",
    "contiguous-q": lambda c: c.q_layout == "contiguous",
    "contiguous-k": lambda c: c.k_layout == "contiguous",
    "writes-off": lambda c: not c.save_kv_cache,
    "switch-off": lambda c: not c.switch,
    "no-capture-loc": lambda c: not c.capture_loc,
    "all-padding": lambda c: c.padding == c.T > 1,
    "some-padding": lambda c: 0 < c.padding < c.T,
    "one-token": lambda c: c.T == 1,
    "non-pow2-dims": lambda c: c.Dn == 100,
    "int32-loc": lambda c: c.loc_dtype == "int32",
    "full-pool": lambda c: c.extra_slots == 0 and c.T > 2,
    **{f"descale-{d}": (lambda d: lambda c: c.kv_descale == d)(d) for d in cases.DESCALES},
}


@pytest.mark.parametrize("what", sorted(REACH))
def test_strategy_reaches(what):
    """Hypothesis-style reachability: the strategy can produce every axis value the contract needs."""
    found = find(cases.cases(), REACH[what], settings=settings(max_examples=2000, database=None,
                                                               phases=[Phase.generate]))
    assert REACH[what](found)


def test_strategy_runs_the_kernel_on_most_cases():
    drawn = base.draw(cases.cases(), 150, rng_seed=1)
    kernel = sum(cases.expected_path(c) == "kernel" for c in drawn)
    assert kernel > len(drawn) / 2, f"the kernel runs on only {kernel} of {len(drawn)} generated cases"


@pytest.mark.parametrize("fmt", cases.FP8_FORMATS)
def test_edge_values_reach_every_class(device, fmt):
    c = cases.MlaFp8PrepareCase(T=16, H=8, fp8_format=fmt, specials=1.0, seed=5)
    kw = cases.build_inputs(c, device)
    x = kw["q_nope"].cpu().double().flatten()
    vals = fp8_code_values(fmt)
    pos = vals[:0x80][~torch.isnan(vals[:0x80])].sort().values
    fmax, tie = float(pos[-1]), float(pos[-1] + (pos[-1] - pos[-2]) / 2)
    mids = (pos[1:] + pos[:-1]) / 2
    a = x.abs()
    assert torch.isnan(x).any() and torch.isposinf(x).any() and torch.isneginf(x).any()
    assert (a == tie).any() and ((a > fmax) & torch.isfinite(a)).any()
    assert ((a > 0) & (a < float(pos[8]))).any(), "fp8 subnormals"
    assert torch.isin(a, mids[:7]).any(), "subnormal ties"
    assert torch.isin(a, mids[mids > 1]).any(), "normal ties"
    assert (x.view(torch.int64) == (-0.0 * torch.ones(1, dtype=torch.float64)).view(torch.int64)).any(), "-0"
    signs = torch.signbit(kw["q_nope"].cpu().float()[torch.isnan(kw["q_nope"].cpu().float())])
    assert signs.any() and (~signs).any(), "NaN of both signs"


def test_pool_is_duplicate_free_with_reserved_slot(device):
    for c in list(CATALOG.values()) + base.draw(cases.cases(), 40, rng_seed=2):
        kw = cases.build_inputs(c, device)
        loc = kw["out_cache_loc"].cpu()
        assert int((loc < 0).sum()) == c.padding
        real = loc[loc >= 0]
        assert real.unique().numel() == real.numel() and not (real == 0).any(), c
        rows = cases.written_rows(c, kw)
        assert not (rows == 0).any() and rows.unique().numel() == rows.numel()


# ----------------------------------------------------------------------------- the harness bites

MUTANT_PROOF = {
    # mutant: (a catalog case it must fail on, the checks that must flag it there)
    "mutant-fallback-write-skipped": ("translated-pool-no-capture-loc", {"effect:kv_buffer", "exact:kv_writes"}),
    "mutant-double-write-truncating": ("k3-verify-b1-l3-h8", {"effect:kv_buffer", "exact:kv_writes"}),
    "mutant-untranslated-out-cache-loc": ("translated-pool", {"effect:kv_buffer", "untouched:kv_buffer",
                                                              "exact:kv_writes"}),
    "mutant-policy-flip-saturate": ("nan-policy-overflow", {"exact:q8", "effect:kv_buffer"}),
    "mutant-descale-multiplied": ("descale-0.37", {"effect:kv_buffer"}),
}


def test_every_mutant_has_a_proof(registry):
    assert {i.name for i in registry.for_op(OP, ("mutant",))} == set(MUTANT_PROOF)


@pytest.mark.parametrize("mutant", sorted(MUTANT_PROOF))
def test_mutant_is_flagged(spec, registry, device, mutant):
    case_name, checks_ = MUTANT_PROOF[mutant]
    impl = registry.impls[f"{OP}/{mutant}"]
    bad = set(failed_checks(spec, impl, CATALOG[case_name], device))
    assert checks_ <= bad, f"{mutant} on {case_name}: failing checks {sorted(bad)}"
    assert set(impl.catches) <= bad


@pytest.mark.parametrize("mutant,case_name", [
    ("mutant-fallback-write-skipped", "k3-verify-b1-l3-h8"),  # the kernel wrote: nothing to skip
    ("mutant-policy-flip-saturate", "overflow-heavy"),  # saturate is the contract there
    ("mutant-descale-multiplied", "k3-verify-b1-l3-h8"),  # no kv_descale
    ("mutant-untranslated-out-cache-loc", "identity-pool-permuted-slots"),  # logical == physical
])
def test_mutants_hide_where_the_catalog_would_miss_them(spec, registry, device, mutant, case_name):
    """Why the catalog carries translated pools, unresolved write locations, nan-policy
    overflow and non-unit descales: without them these bugs pass."""
    assert_passes(spec, registry.impls[f"{OP}/{mutant}"], CATALOG[case_name], device)


def test_a_format_the_gpu_cannot_compile_is_a_typed_refusal(device, monkeypatch):
    """On sm90 Triton has no e4m3fnuz conversion: the wrapper refuses with UnsupportedError naming kv_buffer
    (before: Triton's compile error, untyped; the fuzzer's dtype-fp8-foreign-format on an H200)."""
    from reference import checks

    kw = cases.build_inputs(CATALOG["k3-verify-b1-l3-h8"], device)
    args = {k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope")}
    monkeypatch.setattr(fused, "kernel_arch", lambda: "sm90")
    with pytest.raises(checks.UnsupportedError, match="e4m3fnuz does not compile for sm90") as e:
        fused.mla_fp8_prepare(**args, kv_buffer=kw["kv_buffer"].view(torch.float8_e4m3fnuz), loc=kw["out_cache_loc"])
    assert e.value.arg == "kv_buffer"


def test_the_step_sends_a_format_the_gpu_cannot_compile_to_the_chain(device, monkeypatch):
    """An e4m3fnuz pool on NVIDIA is legal input the kernel cannot run: the step's ``covered`` says so and the
    chain (aten's casts) answers, with the reference's bytes. Before, the step raised the kernel's
    UnsupportedError for a legal input (the fuzzer's dtype-fp8-foreign-format on an H100, 2026-12-07)."""
    kw = cases.build_inputs(CATALOG["k3-verify-b1-l3-h8-fnuz"], device)
    monkeypatch.setattr(fused, "kernel_arch", lambda: "sm90")
    assert "e4m3fnuz does not compile for sm90" in fused.covered(
        **{k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer")}, fp8_policy="saturate")

    def kernel(**_):
        raise AssertionError("the kernel was called for a format it cannot compile")

    mine, theirs = ({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()} for _ in range(2))
    got = fused.mla_fp8_prepare_step(**mine, kernel_fn=kernel)
    want = ref.mla_fp8_prepare_step(**theirs)
    assert torch.equal(got["q8"].view(torch.uint8), want["q8"].view(torch.uint8))
    assert torch.equal(mine["kv_buffer"].view(torch.uint8), theirs["kv_buffer"].view(torch.uint8))
    assert torch.equal(got["kv_writes"], want["kv_writes"])


def test_the_catalog_names_the_chains_fp8_formats():
    """The catalog names the fp8 formats without importing the chain (``list`` imports no torch): the
    chain's dtypes, and the device helper's, by the same names in the same order."""
    from harness.devices import FP8_FORMATS, fp8_dtype

    assert cases.FP8_FORMATS == tuple(ref.FP8_DTYPES) == FP8_FORMATS
    assert all(fp8_dtype(f) is ref.FP8_DTYPES[f] for f in FP8_FORMATS)
