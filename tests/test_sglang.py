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
    """Only the packages on the path to the four files are registered (their __init__ not run); the
    runtime's host-side helpers are the adapter's one-line stand-ins."""
    mods = sglang.load()
    assert set(mods) == {"verify_splitkv", "verify_mla", "fused_qk_norm_rope_store", "reject_sampling"}
    assert all(m.__file__.endswith(f"sglang/kernels/ops/{'speculative' if k == 'reject_sampling' else 'attention'}/{k}.py")
               for k, m in mods.items())
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


# ----------------------------------------------------------------------------- chain speculative sampling

@pytest.mark.parametrize("name", ["far-drafts", "equal-drafts-all-accepted", "onehot-drafts", "sparse-drafts",
                                  "qwen3-b2-l4-v151936-strided", "temperature-per-request", "topk-masked-targets",
                                  "v-one", "v-17-int32-drafts"])
def test_chain_sampling_is_exact(registry, device, name):
    """SGLang's Triton chain sampler with the uniforms as its coins gives the chain's ids exactly (the coins
    consumed as the op documents: u · q < p, then the first index whose running residual sum exceeds u · S)."""
    res, recs = _run(registry, device, "spec_sampling", IMPLS["sglang-chain-sampling"], name)
    assert not res.refused and {"exact:output_ids", "exact:accept_length"} <= set(recs), res
    assert all(r.passed for r in recs.values()), [(r.check, r.worst) for r in recs.values() if not r.passed]


def test_chain_sampling_refuses_distribution_cases(registry, device):
    """Its coins are inputs (SGLang draws them outside the kernel): nothing of its own to judge in distribution."""
    from reference.checks import UnsupportedError

    impl = IMPLS["sglang-chain-sampling"]
    assert "coins as inputs" in impl.handles(_case(registry, "spec_sampling", "dist-far-v8"), device)
    spec = registry.ops["spec_sampling"]
    kw = spec.build_inputs(_case(registry, "spec_sampling", "far-drafts"), device)
    with pytest.raises(UnsupportedError, match="uniforms"):
        impl.fn(**{**kw, "uniforms": None, "seed": 1})


def _planted_sampler(tmp_path, old: str, new: str, count: int):
    """A copy of SGLang's reject_sampling.py with ``old`` replaced (``count`` times), imported from its file."""
    import importlib.util
    from pathlib import Path

    src = Path(sglang.load()["reject_sampling"].__file__).read_text()
    assert src.count(old) == count, "SGLang's kernel changed: re-plant"
    path = tmp_path / "planted_reject_sampling.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location("planted_reject_sampling", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("plant", ["residual-from-q", "coins-shifted"])
def test_planted_chain_sampling_bugs_fail_exactly(registry, device, tmp_path, plant):
    """Planted in a copy of SGLang's kernel: the residual taken from q (both passes); in the adapter: the
    coins shifted by one draft. Each fails the exact check on far-drafts (rejections at every position)."""
    import functools

    if plant == "residual-from-q":
        mod = _planted_sampler(tmp_path, "diff = residual_scale * p_val - q_val", "diff = q_val  # PLANTED", 2)
        fn = functools.partial(sglang.chain_sampling, kernels=mod)
    else:
        def fn(**kw):
            u = kw.pop("uniforms")
            return sglang.chain_sampling(**kw, uniforms=torch.roll(u, 1, dims=1))
    impl = dataclasses.replace(IMPLS["sglang-chain-sampling"], name=f"planted-{plant}", fn=fn)
    _, recs = _run(registry, device, "spec_sampling", impl, "far-drafts")
    assert not recs["exact:output_ids"].passed, recs


# ----------------------------------------------------------------------------- greedy tree acceptance

@pytest.mark.parametrize("name", ["eagle-k8-d7-n48-dfs", "match-last-sibling", "duplicate-siblings", "cousin-decoys",
                                  "none-accepted", "truncated-at-s", "single-node", "shuffled-rows",
                                  "coarse-ties-v4097", "int32-tree-strided"])
def test_tree_greedy_is_exact(registry, device, name):
    """SGLang's Triton tree verify after EAGLE's torch.argmax gives the chain's path, lengths and predicts
    element for element: first matching sibling, truncation at S - 1, rows permuted, tied maxima, int32 trees."""
    res, recs = _run(registry, device, "verify_tree_accept", IMPLS["sglang-tree-greedy"], name)
    assert not res.refused and {"exact:predicts", "exact:accept_index", "exact:accept_token_num"} <= set(recs), res
    assert all(r.passed for r in recs.values()), [(r.check, r.worst) for r in recs.values() if not r.passed]


def test_tree_greedy_refuses_padding_requests(registry, device):
    impl = IMPLS["sglang-tree-greedy"]
    assert "padding requests" in impl.handles(_case(registry, "verify_tree_accept", "padding-requests"), device)
    assert impl.handles(_case(registry, "verify_tree_accept", "spare-slots"), device) is True


def test_tree_kernel_file_loads_with_its_platform_flags_off():
    """spec_tree.py loads from the wheel with its platform flags stood in (no compiled extension imported)."""
    mod = sglang.load_tree()
    assert mod.__file__.endswith("sglang/kernels/ops/speculative/spec_tree.py")
    if getattr(sys.modules["sglang"], "__file__", None) is None:
        assert not mod._is_cuda and not mod._is_cpu and "sgl_kernel" not in sys.modules


@pytest.mark.parametrize("plant, old, new", [
    ("bonus-off-by-one", "tl.store(predicts_ptr + last_accept_retrieve_idx, final_target)",
     "tl.store(predicts_ptr + last_accept_retrieve_idx, final_target + 1)  # PLANTED"),
    ("mismatch-accepted", "token_match = is_valid & (draft_token == target_token)",
     "token_match = is_valid & (draft_token != target_token)  # PLANTED"),
])
def test_planted_tree_kernel_bugs_fail_exactly(registry, device, tmp_path, plant, old, new):
    """Planted in a copy of SGLang's spec_tree.py: the bonus token off by one, and the first sibling that does
    not match accepted. Each fails an exact check. (A plant that lets the scan go on past a match writes past
    accept_index's row: under the interpreter that is a write outside the tensor, so it is not planted here.)"""
    import functools
    import importlib.util
    from pathlib import Path

    src = Path(sglang.load_tree().__file__).read_text()
    assert src.count(old) == 1, "SGLang's kernel changed: re-plant"
    path = tmp_path / f"planted_spec_tree_{plant.replace('-', '_')}.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    impl = dataclasses.replace(IMPLS["sglang-tree-greedy"], name=f"planted-{plant}",
                               fn=functools.partial(sglang.tree_greedy, kernels=mod))
    _, recs = _run(registry, device, "verify_tree_accept", impl, "duplicate-siblings")
    assert not all(r.passed for r in recs.values()), recs


def test_tree_bench_call_is_the_adapter(registry, device):
    """The benchmark's SGLang column (``tree_bench_calls``) runs what the adapter runs: the chain's outputs."""
    from reference.verify_tree_accept import chain as ref

    kw = registry.ops["verify_tree_accept"].build_inputs(_case(registry, "verify_tree_accept", "cousin-decoys"), device)
    calls = sglang.tree_bench_calls(kw)
    assert list(calls) == ["sglang-tree-greedy"]
    got, want = calls["sglang-tree-greedy"](), ref.verify_tree_accept(**kw)
    assert all(torch.equal(got[k], want[k]) for k in want), (got, want)
