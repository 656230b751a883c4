"""SGLang 0.5.23's JIT-compiled CUDA kernels through their adapters (harness/adapters/sglang_jit.py).

On the CPU: the adapters refuse every case in one line naming what the machine lacks; the same adapters over
the kernels' torch emulation (harness/adapters/sglang_jit_emulation.py) pass the op's checks, so the input
translation (freqs_cis, physical rows, contiguous kv) is checked against the reference, and planted
translation bugs fail. On a CUDA GPU with nvcc (``gpu`` marker): the kernels themselves.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys

import pytest
import torch

from harness.adapters import sglang_jit as jit
from harness.adapters import sglang_jit_emulation as emu
from harness.parity import runners
from reference.qk_norm_rope import chain as qk_chain

REAL = {i.op: i for i in jit.IMPLS()}
EMULATED = {i.op: i for i in jit.impls(emu.KERNELS)}
FP8, QK, TREE = "mla_fp8_prepare", "qk_norm_rope", "verify_tree_accept"


def _case(registry, op, name):
    return {c.name: c for c in registry.ops[op].catalog()}[name]


def _run(registry, device, impl, name):
    res = runners.run_case(registry.ops[impl.op], impl, _case(registry, impl.op, name), device)
    return res, {r.check: r for r in res.records}


def _failed(recs):
    return [(r.check, r.err, r.allowed, r.detail) for r in recs.values() if not r.passed]


# ----------------------------------------------------------------------------- where the kernels cannot run

@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA refusal: this machine has a CUDA device")
@pytest.mark.parametrize("op, name", [(FP8, "k3-verify-b1-l3-h8"), (QK, "dsv4-verify-b1-l3-h8"),
                                      (TREE, "eagle-k8-d7-n48-dfs"), (TREE, "padding-requests")])
def test_refused_in_one_line_without_a_cuda_device(registry, device, op, name):
    res, recs = _run(registry, device, REAL[op], name)
    reason = res.refused
    assert reason and "\n" not in reason and reason.startswith("no CUDA device"), (reason, recs)


def test_missing_names_every_missing_piece(monkeypatch):
    monkeypatch.setattr(jit, "_is_hip", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(jit, "_importable", lambda name: name not in ("tvm_ffi",))
    monkeypatch.setattr(jit, "nvcc", lambda: "")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    fp8, qk, tree = jit.missing("fp8"), jit.missing("qk"), jit.missing("tree")
    assert fp8.startswith("sm_80 is not SM90+") and "sm_80" not in qk and "sm_80" not in tree, (fp8, qk, tree)
    for piece in (jit.TVM_FFI, "no nvcc", "no ninja"):
        assert piece in fp8 and piece in qk and piece in tree, (piece, fp8)
    assert "msgspec" not in fp8 and "\n" not in fp8
    monkeypatch.setattr(jit, "_is_hip", lambda: True)
    assert jit.missing("qk").startswith("ROCm") and "no nvcc" not in jit.missing("qk")


def test_nothing_missing_is_an_empty_line(monkeypatch):
    monkeypatch.setattr(jit, "_is_hip", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(jit, "_importable", lambda name: True)
    monkeypatch.setattr(jit, "nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert jit.missing("fp8") == "" and jit.missing("qk") == "" and jit.missing("tree") == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA refusal: this machine has a CUDA device")
def test_the_build_command_says_what_is_missing(capsys):
    assert jit.main([]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("sglang-jit: refused on this machine: no CUDA device"), out


def test_cache_dir_is_ours_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv(jit.CACHE_ENV, raising=False)
    monkeypatch.delenv("SGLANG_JIT_CACHE_DIR", raising=False)
    assert jit.cache_dir() == os.path.expanduser(jit.DEFAULT_CACHE)
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(tmp_path / "sgl"))
    assert jit.cache_dir() == str(tmp_path / "sgl")
    monkeypatch.setenv(jit.CACHE_ENV, str(tmp_path / "vp"))
    assert jit.cache_dir() == str(tmp_path / "vp")


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("sglang", "tvm_ffi", "msgspec")),
                    reason="pip install --no-deps sglang==0.5.23 and the sglang-jit extra")
def test_sglangs_jit_loader_imports_without_the_serving_stack():
    """The two kernel files and SGLang's JIT loader come from the installed wheel; sglang/__init__.py is not run,
    and the runtime's helpers are the stand-ins."""
    mods = jit.load()
    assert mods["set_mla_kv_concat_q"].__file__.endswith("sglang/kernels/ops/attention/set_mla_kv_concat_q.py")
    assert mods["norm_rope"].__file__.endswith("sglang/kernels/ops/attention/dsv4/norm_rope.py")
    assert mods["tree"].__file__.endswith("sglang/kernels/ops/speculative/tree.py")
    assert os.environ["SGLANG_JIT_CACHE_DIR"] == jit.cache_dir()
    if getattr(sys.modules["sglang"], "__file__", None) is None:
        loader = sys.modules["sglang.kernels.jit.utils.compile.loader"]
        assert loader.__file__.endswith("sglang/kernels/jit/utils/compile/loader.py")
        assert "sglang.lang" not in sys.modules and "sglang.srt.server_args" not in sys.modules
        common = sys.modules["sglang.srt.utils.common"]
        assert "stand-in" in common.__doc__ and common.is_cuda() == torch.cuda.is_available()


# ----------------------------------------------------------------------------- the translation, over the emulation

QK_ADMITTED = ["dsv4-verify-b1-l3-h8", "one-token-one-head", "odd-tokens-odd-heads", "table-of-one-position",
               "kv-contiguous", "caller-q-out", "tiny-rows-eps-visible", "d128-r64", "rope-covers-whole-head"]
TREE_ADMITTED = ["eagle-k8-d7-n48-dfs", "match-last-sibling", "duplicate-siblings", "cousin-decoys", "none-accepted",
                 "truncated-at-s", "single-node", "shuffled-rows", "coarse-ties-v4097", "int32-tree-strided",
                 "spare-slots"]
FP8_ADMITTED = ["k3-verify-b1-l3-h8", "translated-pool", "translated-pool-no-capture-loc", "edge-values-only",
                "overflow-heavy"]


@pytest.mark.parametrize("op, name", [(QK, n) for n in QK_ADMITTED] + [(FP8, n) for n in FP8_ADMITTED]
                         + [(TREE, n) for n in TREE_ADMITTED])
def test_the_adapters_over_the_emulated_kernels_pass(registry, device, op, name):
    """The adapters' input translation (freqs_cis = cos + i·sin, a contiguous kv, physical rows) meets the
    reference: qk within its declared class, the fp8 bytes exact."""
    res, recs = _run(registry, device, EMULATED[op], name)
    assert not res.refused and recs, res.refused
    assert not _failed(recs), _failed(recs)


@pytest.mark.parametrize("op, name, reason", [
    (QK, "dsv4-decode-b1-h16", "verify mode only"),
    (QK, "neox", "interleaved pairs"),
    (QK, "with-q-weight", "without a weight"),
    (QK, "tile-boundary-plus-one", "rope_dim 32"),
    (QK, "dsv4-nonunified-verify-b2-l3-h16", "fused_k_norm_rope_flashmla"),
    (FP8, "nan-policy-overflow", "saturates"),
    (FP8, "descale-0.37", "unscaled"),
    (FP8, "writes-off", "saves the KV cache"),
    (FP8, "padding-entries", "before the pool"),
    (FP8, "q-inner-strided-not-covered", "inner stride 2"),
    (FP8, "non-pow2-dims", "512/64"),
    (FP8, "one-token-one-head-fnuz", "float8_e4m3fn (or uint8)"),
    (TREE, "padding-requests", "padding requests (retrive_index[b, 0] < 0)"),
])
def test_refusals_say_why(registry, device, op, name, reason):
    res, _ = _run(registry, device, EMULATED[op], name)
    assert reason in res.refused, res.refused


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def test_the_bench_calls_compute_what_the_adapters_compute(registry, device):
    """What the benchmarks time (``qk_bench_call``, ``fp8_bench_call``) over the emulation: the adapters' bytes
    on the same inputs, the caller's tensors untouched (the kernel normalises its own kv copy in place, a
    second call that copy again; the pool its own). Planted: a bench call that hands the kernel the caller's
    kv, or skips the translation (sin + i·cos, logical rows), fails."""
    from cases.mla_fp8_prepare import catalog as fc
    from cases.qk_norm_rope import catalog as qc

    for name in ("dsv4-verify-b1-l3-h8", "kv-contiguous"):  # kv a strided slice (copied), and contiguous
        kw = qc.build_inputs(_case(registry, QK, name), device)
        kv_before = kw["kv"].clone()
        q_out, kv_out = jit.qk_bench_call(kw, emu.KERNELS)()  # the second call: the first was the build's
        assert torch.equal(_bytes(kw["kv"]), _bytes(kv_before)), name
        once = EMULATED[QK].fn(**{**kw, "kv": kv_before.clone(), "q_out": None})
        twice = EMULATED[QK].fn(**{**kw, "kv": once["kv_out"].clone(), "q_out": None})
        assert torch.equal(_bytes(q_out), _bytes(once["q_out"])), name
        assert torch.equal(_bytes(kv_out), _bytes(twice["kv_out"])), name

    case = _case(registry, FP8, "translated-pool")
    kw = fc.build_inputs(case, device)
    pool = kw["kv_buffer"].clone()
    q8 = jit.fp8_bench_call({**kw, "kv_buffer": pool}, emu.KERNELS)()
    want = fc.build_inputs(case, device)
    want_q8 = EMULATED[FP8].fn(**want)["q8"]
    assert torch.equal(_bytes(q8), _bytes(want_q8)) and torch.equal(_bytes(pool), _bytes(want["kv_buffer"]))
    assert not torch.equal(_bytes(pool), _bytes(kw["kv_buffer"]))  # the rows went to the bench's pool, not the caller's


@pytest.mark.parametrize("op, name, reason", [(QK, "dsv4-decode-b1-h16", "verify mode only"),
                                              (FP8, "descale-0.37", "unscaled")])
def test_the_bench_calls_refuse_as_the_adapters_do(registry, device, op, name, reason):
    from cases.mla_fp8_prepare import catalog as fc
    from cases.qk_norm_rope import catalog as qc

    case = _case(registry, op, name)
    if op == QK:
        got = jit.qk_bench_call(qc.build_inputs(case, device), emu.KERNELS)
    else:
        got = jit.fp8_bench_call(fc.build_inputs(case, device), emu.KERNELS)
    assert isinstance(got, str) and reason in got and "\n" not in got, got
    lacks = dataclasses.replace(emu.KERNELS, missing=lambda kernel: "no nvcc ($CUDA_HOME, PATH or /usr/local/cuda)")
    fn = jit.qk_bench_call if op == QK else jit.fp8_bench_call
    assert fn((qc if op == QK else fc).build_inputs(case, device), lacks).startswith("no nvcc")  # the machine first


def test_the_norm_rope_templates_gate():
    assert all(jit.norm_rope_compiles(D, 64) == "" for D in (64, 128, 256, 512, 1024))
    assert jit.norm_rope_compiles(512, 32).startswith("rope_dim 32")
    assert jit.norm_rope_compiles(96, 64).startswith("head_dim 96")
    assert jit.norm_rope_compiles(576, 64).startswith("head_dim 576")


def test_the_freqs_translation_bites(registry, device, monkeypatch):
    """Planted: (cos, sin) handed over as sin + i·cos. The rotation is wrong and numeric:q_out fails."""
    right = jit.qk_kernel_args

    def swapped(**kw):
        return {**right(**kw), "freqs_cis": torch.complex(kw["sin"], kw["cos"])}

    monkeypatch.setattr(jit, "qk_kernel_args", swapped)
    _, recs = _run(registry, device, EMULATED[QK], "dsv4-verify-b1-l3-h8")
    assert not recs["numeric:q_out"].passed and not recs["numeric:kv_out"].passed, _failed(recs)


def test_the_physical_rows_translation_bites(registry, device, monkeypatch):
    """Planted: the kernel handed the logical out_cache_loc (no slot_map translation): rows written at the
    wrong slots."""
    right = jit.fp8_kernel_args

    def logical(**kw):
        return {**right(**kw), "loc": kw["out_cache_loc"]}

    monkeypatch.setattr(jit, "fp8_kernel_args", logical)
    _, recs = _run(registry, device, EMULATED[FP8], "translated-pool")
    assert {"effect:kv_buffer", "untouched:kv_buffer"} & {c for c, _, _, _ in _failed(recs)}, _failed(recs)


def test_the_bf16_norm_rounding_is_real_and_declared(registry, device):
    """Undeclared (the strict class) the kernels' bf16 normalised row fails numeric:q_out: the class is the
    kernels' design, declared, not a widened tolerance."""
    strict = dataclasses.replace(EMULATED[QK], name="emulated-undeclared", precision="exact-fp32")
    _, recs = _run(registry, device, strict, "dsv4-verify-b1-l3-h8")
    rec = recs["numeric:q_out"]
    assert not rec.passed and rec.err > 5 * rec.allowed, (rec.err, rec.allowed)


def test_the_class_still_rejects_a_truncating_norm(registry, device, monkeypatch):
    """Planted: the normalised row truncated to bf16 (round toward zero) instead of rounded to nearest: more
    rounding than the class declares fails it."""
    round_nearest = torch.Tensor.to

    def truncating(x, weight, eps, freqs_cis, positions):
        freqs = torch.view_as_real(freqs_cis).flatten(-2)
        R, D = freqs.shape[-1], x.shape[-1]
        xf = x.float()
        y = xf * torch.rsqrt(emu.warp_sum_of_squares(xf) / D + eps)[..., None]
        y = y if weight is None else y * weight.float()
        y = (y.view(torch.int32) & ~0xFFFF).view(torch.float32)  # fp32 -> bf16 toward zero
        f = freqs[positions.long()].view(x.shape[0], *([1] * (x.dim() - 2)), R)
        re, im = y[..., D - R::2], y[..., D - R + 1::2]
        c, s = f[..., 0::2], f[..., 1::2]
        rot = round_nearest(torch.stack((re * c - im * s, re * s + im * c), dim=-1).flatten(-2), x.dtype)
        return torch.cat((round_nearest(y[..., : D - R], x.dtype), rot), dim=-1)

    kernels = dataclasses.replace(
        emu.KERNELS, name="truncating",
        fused_q_norm_rope=lambda q, out, eps, f, p: out.copy_(truncating(q, None, eps, f, p)),
        fused_norm_rope_inplace=lambda kv, w, eps, f, p: kv.copy_(truncating(kv, w, eps, f, p)))
    impl = next(i for i in jit.impls(kernels) if i.op == QK)
    _, recs = _run(registry, device, impl, "dsv4-verify-b8-l3-h16")
    assert not recs["numeric:q_out"].passed, _failed(recs)


@pytest.mark.parametrize("variant", [{"rsqrt_ulps": 2}, {"rsqrt_ulps": -2}, {"rope_fma": "first"},
                                     {"rope_fma": "second"}])
def test_each_rounding_variant_of_the_chain_is_a_different_chain(registry, device, variant):
    """The bf16-norm allowance takes the worst of the chain's variants (cases/qk_norm_rope/spec.py): each one
    changes some bf16 value of a DeepSeek-V4 verify step, so none is dead."""
    spec = registry.ops[QK]
    assert variant in spec.rounding_variants
    kw = spec.build_inputs(_case(registry, QK, "dsv4-verify-b8-l3-h128"), device)
    plain = spec.reference(**{**kw, "bf16_norm": True})
    varied = spec.reference(**{**kw, "bf16_norm": True, **variant})
    assert not torch.equal(plain["q_out"], varied["q_out"])


def test_the_emulated_fp8_kernel_writes_what_the_kernel_would_at_padding():
    """No bounds check in the kernel: loc -1 is a write before the pool, which is why the adapter refuses it."""
    kv = torch.zeros(4, 576, dtype=torch.float8_e4m3fn)
    k = torch.ones(1, 576, dtype=torch.bfloat16)
    q = torch.ones(1, 2, 576, dtype=torch.bfloat16)
    with pytest.raises(IndexError, match="outside the pool"):
        emu.set_mla_kv_concat_q_fp8(kv, torch.tensor([-1]), k[:, :512], k[:, 512:], q[..., :512], q[..., 512:])


def test_the_emulated_fp8_cast_saturates():
    x = torch.tensor([500.0, -1e4, float("inf"), float("-inf"), float("nan"), 448.0, 464.0], dtype=torch.bfloat16)
    assert emu.fp8_satfinite(x).view(torch.uint8).tolist() == [0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7E, 0x7E]


def test_the_chain_takes_its_variants_only_as_named():
    from reference.checks import VerifyParityInputError

    kw = dict(q=torch.zeros(1, 1, 64, dtype=torch.bfloat16), kv=torch.zeros(1, 64, dtype=torch.bfloat16),
              kv_norm_weight=torch.ones(64, dtype=torch.bfloat16), eps=1e-6, rope_dim=64,
              cos=torch.ones(1, 32), sin=torch.zeros(1, 32), positions=torch.zeros(1, dtype=torch.long))
    with pytest.raises(VerifyParityInputError, match="rope_fma"):
        qk_chain.qk_norm_rope(**kw, rope_fma="both")
    with pytest.raises(VerifyParityInputError, match="rsqrt_ulps"):
        qk_chain.qk_norm_rope(**kw, rsqrt_ulps=1.5)


# ----------------------------------------------------------------------------- greedy tree verify

def test_the_tree_adapter_is_listed():
    names = {i.name for i in jit.IMPLS() if i.op == TREE}
    assert names == {"sglang-jit-tree-greedy"}, names
    assert {i.name for i in jit.impls(emu.KERNELS) if i.op == TREE} == {"sglang-jit-tree-greedy-emulated"}


def test_the_prebuild_builds_the_tree_module(monkeypatch):
    """``python -m harness.adapters.sglang_jit`` (``warm``) hands SGLang's parallel_compile the tree module's build
    beside the fp8 and norm+RoPE ones."""
    jit.load()  # first: the stand-ins, before any sglang import
    import sglang.kernels.jit.utils as jit_utils

    built = []
    monkeypatch.setattr(jit, "missing", lambda kernel: "")
    for name in ("zeros", "ones"):  # the norm+RoPE builds' sample tensors, on the CPU here
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, device=None, _real=real, **kw: _real(*a, **kw))
    monkeypatch.setattr(jit_utils, "parallel_compile", lambda fns: built.extend(f.__name__ for f in fns))
    jit.warm((512,))
    assert "_tree_module" in built and "_fp8_module" in built and len(built) == 4, built


def _tree_args(registry, device, name):
    from harness.adapters import sglang

    return sglang.tree_kernel_args(**registry.ops[TREE].build_inputs(_case(registry, TREE, name), device))


@pytest.mark.parametrize("name", TREE_ADMITTED)
def test_the_emulated_tree_kernel_is_sglangs_triton_twin(registry, device, name):
    """On the very arguments the two adapters share (``tree_kernel_args``), the CUDA kernel's walk (emulated from
    eagle.cuh) writes what SGLang's Triton ``verify_tree_greedy_triton`` writes (run here under the interpreter),
    every element of the three outputs."""
    from harness.adapters import sglang

    emulated, triton = _tree_args(registry, device, name), _tree_args(registry, device, name)
    emu.verify_tree_greedy(*emulated)
    sglang.load_tree().verify_tree_greedy_triton(*triton)
    for got, want in zip(emulated[:3], triton[:3]):
        assert torch.equal(got, want), (name, got, want)


def test_the_emulated_tree_kernel_checks_dtypes_as_its_tensor_matcher(registry, device):
    args = list(_tree_args(registry, device, "single-node"))
    args[7] = args[7].int()
    with pytest.raises(TypeError, match="target_predict"):
        emu.verify_tree_greedy(*args)


@pytest.mark.parametrize("plant, name", [("zero-filled-predicts", "cousin-decoys"),
                                         ("last-matching-sibling", "duplicate-siblings"),
                                         ("bonus-at-the-root", "eagle-k8-d7-n48-dfs")])
def test_planted_tree_bugs_fail_through_the_jit_adapter(registry, device, plant, name):
    """The adapter's checks bite: predicts zero-filled as EAGLE allocates it (off the contract's -1), a kernel
    taking the last matching sibling, a bonus read at the root's row. Each fails an exact check."""
    real_kernel = emu.verify_tree_greedy

    def zero_filled(p, *rest):  # the translation's -1 fill of predicts undone: EAGLE's torch.zeros
        p.zero_()
        real_kernel(p, *rest)

    def reversed_siblings(p, a, n, cand, ridx, nxt, sib, tp):
        # the same tree with every sibling list reversed: the first match found is the last in the real order
        B, N = cand.shape
        nxt2, sib2 = nxt.clone(), torch.full_like(sib, -1)
        for b in range(B):
            for parent in range(N):
                kids, c = [], int(nxt[b, parent])
                while c != -1:
                    kids.append(c)
                    c = int(sib[b, c])
                if kids:
                    nxt2[b, parent] = kids[-1]
                    for x, y in zip(kids[::-1], kids[-2::-1]):
                        sib2[b, x] = y
        real_kernel(p, a, n, cand, ridx, nxt2, sib2, tp)

    def bonus_at_root(p, a, n, cand, ridx, nxt, sib, tp):
        real_kernel(p, a, n, cand, ridx, nxt, sib, tp)
        for b in range(cand.shape[0]):
            last = int(a[b, int(n[b])])
            if int(n[b]) > 0:
                p[last] = tp.view(-1)[int(ridx[b, 0])]

    kernel = {"zero-filled-predicts": zero_filled, "last-matching-sibling": reversed_siblings,
              "bonus-at-the-root": bonus_at_root}[plant]
    impl = {i.op: i for i in jit.impls(dataclasses.replace(emu.KERNELS, verify_tree_greedy=kernel))}[TREE]
    _, recs = _run(registry, device, impl, name)
    assert recs and _failed(recs), (plant, recs)
    assert any(c.startswith("exact:") for c, *_ in _failed(recs)), _failed(recs)


# ----------------------------------------------------------------------------- the kernels themselves (CUDA + nvcc)

needs_jit = pytest.mark.skipif(bool(jit.missing("fp8")), reason=f"SGLang's JIT kernels: {jit.missing('fp8')}")


@pytest.mark.gpu
@needs_jit
@pytest.mark.parametrize("op, name", [(QK, "dsv4-verify-b8-l3-h128"), (QK, "caller-q-out"), (QK, "d128-r64"),
                                      (FP8, "k3-verify-b1-l3-h8"), (FP8, "edge-values-only"), (FP8, "translated-pool")])
def test_sglangs_jit_kernels_pass(registry, device, op, name):
    res, recs = _run(registry, device, REAL[op], name)
    assert not res.refused and recs, res.refused
    assert not _failed(recs), _failed(recs)


@pytest.mark.gpu
@needs_jit
def test_the_fp8_gate_reads_covered_fp8_as_sglang_does(registry, device):
    """On every catalog case the contract lets through, the adapter's reading of covered_fp8 agrees with it."""
    spec = registry.ops[FP8]
    covered = jit.load()["set_mla_kv_concat_q"].covered_fp8
    for case in spec.catalog():
        args = jit.fp8_kernel_args(**spec.build_inputs(case, device))
        assert (jit.fp8_gate(**args) == "") == covered(**args), case.name


@pytest.mark.gpu
@pytest.mark.skipif(bool(jit.missing("tree")), reason=f"SGLang's JIT tree kernel: {jit.missing('tree')}")
@pytest.mark.parametrize("name", TREE_ADMITTED)
def test_sglangs_jit_tree_kernel_passes_and_is_its_triton_twin(registry, device, name):
    """The CUDA kernel through the adapter gives the chain's outputs; on the same arguments it writes what
    SGLang's Triton kernel and the emulation write."""
    from harness.adapters import sglang

    res, recs = _run(registry, device, REAL[TREE], name)
    assert not res.refused and recs, res.refused
    assert not _failed(recs), _failed(recs)
    cuda, triton = _tree_args(registry, device, name), _tree_args(registry, device, name)
    emulated = tuple(t.cpu() for t in _tree_args(registry, device, name))
    jit.load()["tree"].verify_tree_greedy(*cuda)
    sglang.load_tree().verify_tree_greedy_triton(*triton)
    emu.verify_tree_greedy(*emulated)
    for got, tri, em in zip(cuda[:3], triton[:3], emulated[:3]):
        assert torch.equal(got, tri) and torch.equal(got.cpu(), em.cpu()), (name, got, tri, em)
