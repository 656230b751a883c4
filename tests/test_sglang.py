"""SGLang 0.5.23's own kernels through their adapters (harness/adapters/sglang.py) and ledger
(cases/ledgers/sglang.py). Needs ``pip install --no-deps sglang==0.5.23`` (``nox -s tests`` installs it and
sets VP_REQUIRE_SGLANG=1, so there a missing sglang fails instead of skipping)."""
from __future__ import annotations

import dataclasses
import os
import sys

import pytest
import torch

from harness.parity import runners
from harness.parity import suite
from harness.adapters import sglang

try:
    sglang.load()
except sglang.SGLangUnavailable:
    if os.environ.get("VP_REQUIRE_SGLANG") == "1":
        raise
    pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23)", allow_module_level=True)

IMPLS = {i.name: i for i in sglang.IMPLS()}


def _case(registry, op, name):
    return {c.name: c for c in registry.ops[op].catalog()}[name]


def _run(registry, device, op, impl, name):
    spec = registry.ops[op]
    res = runners.run_case(spec, impl, _case(registry, op, name), device)
    return res, {r.check: r for r in res.records}


def test_the_kernel_files_load_without_the_serving_stack():
    """Only the packages on the path to the three files are registered (their __init__ not run); the
    runtime's host-side helpers are the adapter's one-line stand-ins."""
    mods = sglang.load()
    assert set(mods) == {"verify_splitkv", "verify_mla", "fused_qk_norm_rope_store"}
    assert all(m.__file__.endswith(f"sglang/kernels/ops/attention/{k}.py") for k, m in mods.items())
    if getattr(sys.modules["sglang"], "__file__", None) is None:  # our namespace, not a fully imported sglang
        assert "sglang.lang" not in sys.modules and "sglang.srt.server_args" not in sys.modules
        utils = sys.modules["sglang.srt.utils"]
        assert "stand-in" in utils.__doc__ and utils.is_hip() == (torch.version.hip is not None)


@pytest.mark.parametrize("op, impl, name", [
    ("qk_norm_rope", "sglang-qk-norm-rope", "dsv4-verify-b8-l3-h16"),
    ("qk_norm_rope", "sglang-qk-norm-rope", "caller-q-out-decode"),  # the bf16 ring store
    ("verify_attention", "sglang-shared-kv", "k3-mla-h16-l1-e4m3fn"),  # MLA, fp8 KV: every rounding declared
    ("verify_attention", "sglang-shared-kv", "dspark-hkv4-h16-noncausal"),
])
def test_adapter_passes_under_its_declared_class(registry, device, op, impl, name):
    res, recs = _run(registry, device, op, IMPLS[impl], name)
    assert not res.refused and recs, res
    assert all(r.passed for r in recs.values()), [(r.check, r.err, r.allowed, r.detail) for r in recs.values()
                                                   if not r.passed]


def test_the_strict_class_still_rejects_sglangs_shared_kv(registry, device):
    """Undeclared (exact-fp32) the same kernel fails numeric:o by far (its P in bf16, partials in bf16)."""
    strict = dataclasses.replace(IMPLS["sglang-shared-kv"], name="sglang-shared-kv-undeclared", precision="exact-fp32")
    _, recs = _run(registry, device, "verify_attention", strict, "qwen35-tp-h16-l3")
    rec = recs["numeric:o"]
    assert not rec.passed and rec.err > 5 * rec.allowed, (rec.err, rec.allowed)


def test_stale_split_scratch_is_flagged_by_the_poisoned_allocator_and_known(registry, device):
    """Split-KV on a 40-key prefix: 4 splits of 32 keys, splits 2 and 3 empty; their partial outputs are
    never written and the combine weights them by 0. The poisoned-allocator run always shows it (NaN in
    every output of the request); the ledger explains it, so the rows read known."""
    from cases.ledgers import sglang as ledger

    spec = registry.ops["verify_attention"]
    case = _case(registry, "verify_attention", "qwen35-tp-h4-l3")
    impl = IMPLS["sglang-split-kv"]
    res = runners.run_case(spec, impl, case, device)
    recs = {r.check: r for r in res.records}
    assert not recs["finite:o@poisoned-alloc"].passed and recs["finite:o@poisoned-alloc"].mismatch_frac == 1.0
    assert recs["numeric:o@poisoned-alloc"].passed  # not a precision failure
    rows = suite.rows_for(suite.Planned(spec, case), impl, device, res, suite.provenance(device, _prof(), 0),
                          ledger.LEDGER)
    assert {r.status for r in rows} <= {"pass", "known"}
    assert {r.known for r in rows if r.status == "known"} == {"sglang-splitkv-stale-scratch"}


def test_the_ledger_predicates_follow_sglangs_partition(registry):
    """40 keys leave splits empty (4 x 32); 100 keys do not (last split starts at 96); an empty prefix is the
    other entry."""
    from cases.verify_attention import catalog as va
    from cases.ledgers import sglang as ledger

    stale, empty = ledger.LEDGER
    base = _case(registry, "verify_attention", "qwen35-tp-h4-l3")
    assert stale.when(base)
    assert not stale.when(dataclasses.replace(base, prefix="const:100"))
    assert empty.when(dataclasses.replace(base, prefix="list:0-17", B=2)) and not empty.when(base)
    assert va.prefix_lengths("const:100", 1, 0) == [100]


@pytest.mark.parametrize("op, impl, name, reason", [
    ("qk_norm_rope", "sglang-qk-norm-rope", "neox", "GPT-J pairs only"),
    ("qk_norm_rope", "sglang-qk-norm-rope", "decode-padding-slots", "padding slots"),
    ("verify_attention", "sglang-split-kv", "dspark-hkv2-h8-noncausal", "non-causal"),
    ("verify_attention", "sglang-split-kv", "k3-mla-h16-l3", "MLA layout"),
    ("verify_attention", "sglang-shared-kv", "tree-topk2-qwen35", "never reads the tree mask"),
    ("verify_attention", "sglang-shared-kv", "empty-prefix-all", "empty kv_indices"),
    ("verify_attention", "sglang-shared-kv", "group-3-hkv2", "not a power of two"),
])
def test_refusals_say_why(registry, device, op, impl, name, reason):
    res, _ = _run(registry, device, op, IMPLS[impl], name)
    assert reason in res.refused, res.refused


def _prof():
    from cases import profiles

    return profiles.current("dev")


@pytest.mark.parametrize("name", ["dsv4-nonunified-verify-b2-l3-h16", "dsv4-nonunified-decode-b4-h16"])
def test_sglang_paged_fp8_store_is_the_reference_layout(registry, device, name):
    """SGLang's own non-unified store (``bf16_store=False``, pages of 64) writes the reference chain's
    bytes into the paged SWA cache, every one (fp8 nope, ue8m0 scales, bf16 rope, pad bytes kept), and
    passes the op's suite. Measured under the interpreter: 0 of 4,641 / 2,320 written bytes differ."""
    import copy

    import torch

    from cases.qk_norm_rope import catalog as c
    from reference.qk_norm_rope import chain as ref

    case = _case(registry, "qk_norm_rope", name)
    kw = c.build_inputs(case, device)
    mine, theirs = copy.deepcopy(kw), copy.deepcopy(kw)
    ref.qk_norm_rope_step(**mine)
    IMPLS["sglang-qk-norm-rope"].fn(**theirs)
    assert bool((mine["swa_cache"] != kw["swa_cache"]).any())
    assert torch.equal(mine["swa_cache"].cpu(), theirs["swa_cache"].cpu())
    res, _ = _run(registry, device, "qk_norm_rope", IMPLS["sglang-qk-norm-rope"], name)
    assert not res.refused and all(r.passed for r in res.records), [r.check for r in res.records if not r.passed]


def test_qk_bench_call_runs_sglangs_kernel_on_its_own_kv(device):
    """The benchmark's SGLang call (``qk_bench_calls``, timed beside ours by ``python -m harness bench``):
    the op's q_out, and the caller's kv untouched (SGLang normalises kv in place: it gets a copy with the
    same strides). Planted: passing the caller's kv fails the untouched check; accepting neox, which the
    kernel does not rotate, fails the refusal."""
    from cases.qk_norm_rope import catalog as c
    from reference.qk_norm_rope import chain as ref

    kw = c.build_inputs(c.QkNormRopeCase(T=3, H=2, seed=7), device)
    kv_before = kw["kv"].clone()
    (name, call), = sglang.qk_bench_calls(kw).items()
    assert name == "sglang-qk-norm-rope" and name in IMPLS
    q_out = call()
    assert torch.equal(kw["kv"], kv_before)
    expect = ref.qk_norm_rope(**{k: v for k, v in kw.items() if k not in ("ring", "loc", "forward_mode", "q_out")})
    torch.testing.assert_close(q_out.view_as(kw["q"]), expect[0])  # bf16: one rounding apart at most
    assert sglang.qk_bench_calls({**kw, "rope_style": "neox"}) == {}
