"""SGLang 0.5.23's JIT-compiled CUDA kernels behind the plugin API (``--impl harness.adapters.sglang_jit:IMPLS``).

  sglang-jit-fp8-prepare   mla_fp8_prepare  ``set_mla_kv_concat_q_fp8`` (kernels/ops/attention/set_mla_kv_concat_q.py;
                                            csrc elementwise/set_mla_kv_concat_q.cuh): fp8 q + KV rows, one launch
  sglang-jit-qk-norm-rope  qk_norm_rope     ``fused_q_norm_rope`` (q) + ``fused_norm_rope_inplace`` (kv)
                                            (kernels/ops/attention/dsv4/norm_rope.py; csrc deepseek_v4/main_norm_rope.cuh,
                                            fused_norm_rope.cuh): DeepSeek-V4's target-verify q and kv, no store
  sglang-jit-tree-greedy   verify_tree_accept  ``verify_tree_greedy`` (kernels/ops/speculative/tree.py; csrc
                                            speculative/tree.cuh, kernel ``VerifyTreeGreedy`` in
                                            include/sgl_kernel/speculative/eagle.cuh): EAGLE's greedy tree verify on
                                            NVIDIA (and AMD), after its torch.argmax

SGLang compiles these at run time (``load_jit``: nvcc + ninja, loaded through apache-tvm-ffi) instead of shipping
them as Triton. ``load()`` imports the three Python files SGLang calls them through (``speculative/tree.py`` adds
only ``kernel_api_logging.py``: stdlib and torch), and SGLang's own JIT loader (``sglang.kernels.jit.utils``),
from the installed wheel without running ``sglang/__init__.py``: the packages on
the path are registered unrun (``harness.adapters.sglang.stand_in``), ``sglang/srt/environ.py`` (stdlib only)
loads as it is, and the four runtime helpers the loader and ``norm_rope.py`` import are one-line stand-ins
(``SHIMMED``: is_hip, is_xpu, is_cuda, get_cuda_version).

Where they run: a CUDA GPU with nvcc and ninja, ``apache-tvm-ffi==0.1.11`` and ``msgspec`` installed (the
``sglang-jit`` extra); the fp8 kernel needs SM90+ (TMA bulk store). Anywhere else every case is refused with one
line naming what is missing (``missing``), never an error; the tree kernel asks for no particular arch. Builds go
to the cache directory ``cache_dir()``: ``$VP_SGLANG_JIT_CACHE``, else ``$SGLANG_JIT_CACHE_DIR``, else
``~/.cache/verify-parity/sglang-jit``. The first call of each compiled variant in a process is timed and logged on
stderr apart from the checks (``FIRST_CALLS``); ``python -m harness.adapters.sglang_jit`` builds them all before a run and prints the times.

Gates, as SGLang's dispatch has them, each refusal with its reason:
  fp8  the trtllm-mla backend calls the kernel on fp8-KV decode and target verify when it saves the KV cache,
       with physical rows, and only where ``covered_fp8`` (called on the very tensors) selects it: e4m3fn/uint8
       pool, bf16 q and k, int32/int64 contiguous loc, widths 512/64, SM90+, unit inner strides, 16-byte rows
       (4 for the rope halves). On top, what the op's contract asks that the kernel does not do: it saturates
       (``__NV_SATFINITE``: 'nan'-policy cases refused), it has no k scale (a non-unit ``kv_descale`` refused),
       it writes every token's row (padding ``loc < 0`` refused: at −1 it would write before the pool).
       fp8 policy ``saturate``; precision exact (bytes).
  qk   DeepSeek-V4 calls them with its own head and rope dims, ``freqs_cis`` complex64 (cos + i·sin), q without
       a weight (``q_head_norm``) and a contiguous kv (``_compute_kv_bf16``). Refused: decode (the ring store is
       another launch), non-unified layers (their paged store is ``fused_k_norm_rope_flashmla``), neox pairs,
       a q weight, rope_dim ≠ 64 and head dims the templates' static_asserts reject. Translated, never the check:
       the (cos, sin) tables into ``freqs_cis``, kv into a contiguous copy when it is a strided slice (then
       ``kv_out`` is that copy; contiguous kv is normalised in place, ``may_write``), q packed when its heads
       are not, positions to int64 for the kv kernel. Precision ``bf16-norm``: both kernels round the
       normalised row to bf16 and rotate those bf16 values (the unfused model's two steps' rounding), one more
       rounding of the RoPE dims than the reference chain's fused launch.
  tree EAGLE calls it (``eagle_utils.py``, via ``spec_tree.verify_tree_greedy_func`` on CUDA/ROCm) with
       ``target_predict = torch.argmax(logits).reshape(B, N)`` int64, the tree tensors int64 (B, N) (its
       TensorMatcher checks), accept_index (B, S) int32 filled with -1, predicts (B·N,) int32 zero-filled, the
       count int32. The translation is the Triton adapter's own (``harness.adapters.sglang.tree_kernel_args``:
       the same positional arguments; predicts pre-filled with -1, as the op's contract has it off the path),
       and so is the one refusal (``tree_refusal``): padding requests (retrive_index[b, 0] < 0), whose negative
       index the kernel stores in accept_index, reads target_predict at and writes predicts at (before the
       tensors). Semantics (one thread per request): from the root, at each of S - 1 levels, walk the current
       node's child list in ``retrive_next_sibling`` order and accept the first child whose draft equals
       target_predict at the last accepted node's row (a later sibling with the same token never wins; a leaf
       or no match ends the walk); predicts gets the target token at each accepted node's parent row, then the
       bonus ``target_predict`` at the last accepted row (the root's when nothing is accepted). That is the
       reference's rule and the Triton twin's, to the element. They differ only off the contract: the CUDA
       sibling walk is an unbounded ``while (cur != -1)`` (a cyclic sibling list spins forever), the Triton
       one stops after N siblings; the op's validation rejects such lists before either runs. Exact.

The benchmarks time them through the same gate and translation (``qk_bench_call``, ``fp8_bench_call``: the
translation done once before the timed call, SGLang's entry points called bare, as the model calls them; or the
refusal's one line): ``python -m cases.qk_norm_rope.bench --vs-sglang`` and ``python -m cases.mla_fp8_prepare.bench``.

``harness.adapters.sglang_jit_emulation`` holds the four kernels written in torch from their sources; the same
adapters run over it on the CPU (``impls(Kernels)``), which checks the translation above against the reference.
"""
from __future__ import annotations

import functools
import importlib
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from harness.adapters.sglang import (
    VERSION,
    SGLangUnavailable,
    installed_version,
    stand_in,
    tree_kernel_args,
    tree_outputs,
    tree_refusal,
)
from harness.registry import Impl

TVM_FFI = "apache-tvm-ffi==0.1.11"  # the release SGLang 0.5.23's JIT loader was checked with
EXTRA = "pip install 'verify-parity[sglang-jit]'"  # apache-tvm-ffi + msgspec
CACHE_ENV = "VP_SGLANG_JIT_CACHE"
DEFAULT_CACHE = "~/.cache/verify-parity/sglang-jit"
FP8_FILE = "sglang.kernels.ops.attention.set_mla_kv_concat_q"
NORM_ROPE_FILE = "sglang.kernels.ops.attention.dsv4.norm_rope"
TREE_FILE = "sglang.kernels.ops.speculative.tree"
FP8_NOPE, FP8_ROPE = 512, 64  # kFp8NopeDim, kFp8RopeDim: the fp8 kernel's fixed row widths
ROPE_DIM = 64  # the norm+RoPE kernels: one (re, im) pair per lane of a warp


def _is_hip() -> bool:
    return torch.version.hip is not None


SHIMMED = {  # module -> {name: the host-side helper it stands for}
    "sglang.srt.utils": {"is_hip": _is_hip, "is_xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available()},
    "sglang.srt.utils.common": {
        "is_cuda": lambda: torch.cuda.is_available() and torch.version.cuda is not None,
        "get_cuda_version": lambda: tuple(map(int, torch.version.cuda.split("."))) if torch.version.cuda else (0, 0)},
}


def cache_dir() -> str:
    """Where SGLang's JIT puts its builds for these adapters (module docstring)."""
    return os.path.expanduser(os.environ.get(CACHE_ENV) or os.environ.get("SGLANG_JIT_CACHE_DIR") or DEFAULT_CACHE)


def nvcc() -> str:
    """The nvcc SGLang's JIT will run, found as it finds it ($CUDA_HOME, $CUDA_PATH, PATH, /usr/local/cuda); ""."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    path = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    return path if os.path.isfile(path) else ""


def _importable(name: str) -> bool:
    import importlib.util

    return name in sys.modules or importlib.util.find_spec(name) is not None


def missing(kernel: str) -> str:
    """What this machine lacks to run ``kernel`` ("fp8", "qk" or "tree"), as one line ("" when nothing): every
    missing piece, joined by "; "."""
    out = []
    if _is_hip():
        out.append("ROCm: SGLang's JIT builds these kernels with nvcc for CUDA GPUs only")
    elif not torch.cuda.is_available():
        out.append(f"no CUDA device (torch {torch.__version__})")
    elif kernel == "fp8" and torch.cuda.get_device_capability()[0] < 9:
        major, minor = torch.cuda.get_device_capability()
        out.append(f"sm_{major}{minor} is not SM90+ (the fp8 kernel's TMA bulk store; can_use_set_mla_kv_concat_q_fp8)")
    if not _importable("sglang"):
        out.append(f"sglang not installed (pip install --no-deps sglang=={VERSION})")
    for mod, dist in (("tvm_ffi", TVM_FFI), ("msgspec", "msgspec")):
        if not _importable(mod):
            out.append(f"{dist} not installed ({EXTRA})")
    if not _is_hip():
        if not nvcc():
            out.append("no nvcc ($CUDA_HOME, PATH or /usr/local/cuda)")
        if not shutil.which("ninja"):
            out.append("no ninja on PATH")
    return "; ".join(out)


@functools.cache
def load() -> dict[str, object]:
    """SGLang's three Python files of these kernels, keyed by stem, from the installed wheel; its JIT cache set to
    ``cache_dir()``. SGLangUnavailable when sglang, apache-tvm-ffi or msgspec is not installed."""
    for mod, dist in (("tvm_ffi", TVM_FFI), ("msgspec", "msgspec")):
        if not _importable(mod):
            raise SGLangUnavailable(f"{dist} not installed ({EXTRA})")
    os.environ["SGLANG_JIT_CACHE_DIR"] = cache_dir()
    found = nvcc()
    if found and not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
        # SGLang takes CUDA_HOME as the parent of nvcc's folder and links libcudart from its lib64: an nvcc on PATH
        # that is a link or a wrapper script (/usr/local/bin/nvcc) points it at a folder without one
        homes = [os.path.dirname(os.path.dirname(p)) for p in (found, os.path.realpath(found))] + ["/usr/local/cuda"]
        with_rt = [h for h in homes if any(Path(h, "lib64").glob("libcudart.so*"))]
        if with_rt and with_rt[0] != homes[0]:
            os.environ["CUDA_HOME"] = with_rt[0]
    stand_in(SHIMMED, [m.rsplit(".", 1)[0] for m in (FP8_FILE, NORM_ROPE_FILE, TREE_FILE)])
    return {m.rsplit(".", 1)[1]: importlib.import_module(m) for m in (FP8_FILE, NORM_ROPE_FILE, TREE_FILE)}


# ----------------------------------------------------------------------------- the kernels, by SGLang's signatures

@dataclass(frozen=True)
class Kernels:
    """What the adapters call, with the Python signatures of SGLang's entry points: SGLang's own (``sglang()``)
    or their torch emulation (``sglang_jit_emulation.KERNELS``). ``covered_fp8``: SGLang's gate on the very
    tensors (None: the adapter's reading of it only); ``missing(kernel)``: what the machine lacks ("" none);
    ``first_call(kernel)``: build what the kernel's first call would build, timed (None: nothing to build)."""
    name: str
    set_mla_kv_concat_q_fp8: Callable
    covered_fp8: Callable | None
    fused_q_norm_rope: Callable
    fused_norm_rope_inplace: Callable
    verify_tree_greedy: Callable
    missing: Callable[[str], str]
    first_call: Callable[[str], None] | None


FIRST_CALLS: dict[str, float] = {}  # "entry[variant]" -> seconds of its first call in this process (JIT build or cache load)


def _first_call_timed(key: str, call: Callable):
    """``call()``; the first time ``key`` is called in this process, timed (synchronised) and logged on stderr."""
    if key in FIRST_CALLS:
        return call()
    t0 = time.perf_counter()
    out = call()
    torch.cuda.synchronize()
    FIRST_CALLS[key] = time.perf_counter() - t0
    print(f"sglang-jit: {key} first call {FIRST_CALLS[key]:.2f} s (JIT build or load from {cache_dir()})",
          file=sys.stderr, flush=True)
    return out


def _fp8_module() -> None:
    """Build (or load) the fp8 kernel's module as ``covered_fp8`` would, timed."""
    fp8 = load()["set_mla_kv_concat_q"]  # first: the stand-ins, before any sglang import
    _first_call_timed("set_mla_kv_concat_q_fp8", lambda: fp8.set_mla_kv_concat_q_fp8_module(fp8.is_arch_support_pdl()))


def _tree_module() -> None:
    """Build (or load) the tree kernels' module (``speculative_tree``: build, verify, reconstruct), timed."""
    tree = load()["tree"]
    _first_call_timed("speculative_tree", tree._jit_tree_module)


def _sglang_entry(stem: str, entry: str, variant: Callable[..., str]):
    def call(*args, **kw):
        fn = getattr(load()[stem], entry)
        return _first_call_timed(f"{entry}[{variant(*args)}]", lambda: fn(*args, **kw))
    return call


def sglang() -> Kernels:
    """SGLang's own kernels, loaded (and built) on first use."""
    return Kernels(
        name="sglang",
        set_mla_kv_concat_q_fp8=_sglang_entry("set_mla_kv_concat_q", "set_mla_kv_concat_q_fp8", lambda *a: "512/64"),
        covered_fp8=lambda **kw: load()["set_mla_kv_concat_q"].covered_fp8(**kw),
        fused_q_norm_rope=_sglang_entry("norm_rope", "fused_q_norm_rope", lambda q, *a: f"D={q.shape[-1]}"),
        fused_norm_rope_inplace=_sglang_entry("norm_rope", "fused_norm_rope_inplace", lambda kv, *a: f"D={kv.shape[-1]}"),
        verify_tree_greedy=_sglang_entry("tree", "verify_tree_greedy", lambda *a: "int32/int64"),
        missing=missing,
        first_call=lambda kernel: _fp8_module() if kernel == "fp8" else None,
    )


# ----------------------------------------------------------------------------- fp8 KV/Q prepare

def _row_aligned(t: torch.Tensor, align: int) -> bool:
    return t.data_ptr() % align == 0 and all(s * t.element_size() % align == 0 for s in t.stride()[:-1])


def fp8_gate(kv_buffer, loc, k_nope, k_rope, q_nope, q_rope) -> str:
    """Why ``covered_fp8`` declines these tensors, in its order ("" when it selects the kernel); its SM90
    test is ``missing("fp8")``'s."""
    if kv_buffer.dtype not in (torch.float8_e4m3fn, torch.uint8):
        return f"kv_buffer {kv_buffer.dtype}: covered_fp8 takes float8_e4m3fn (or uint8) pools only"
    for name, t in (("k_nope", k_nope), ("k_rope", k_rope), ("q_nope", q_nope), ("q_rope", q_rope)):
        if t.dtype != torch.bfloat16:
            return f"{name} {t.dtype}: covered_fp8 takes bf16 only"
    if loc.dtype not in (torch.int32, torch.int64) or not loc.is_contiguous():
        return f"loc {loc.dtype}, stride {loc.stride()}: covered_fp8 takes contiguous int32/int64 only"
    if k_nope.shape[-1] != FP8_NOPE or k_rope.shape[-1] != FP8_ROPE:
        return (f"widths {k_nope.shape[-1]}/{k_rope.shape[-1]}: the kernel's rows are {FP8_NOPE}/{FP8_ROPE} "
                f"(kFp8NopeDim/kFp8RopeDim)")
    for name, t in (("kv_buffer", kv_buffer), ("k_nope", k_nope), ("k_rope", k_rope), ("q_nope", q_nope),
                    ("q_rope", q_rope)):
        if t.stride(-1) != 1:
            return f"{name} inner stride {t.stride(-1)}: covered_fp8 wants unit-stride rows (vector loads)"
    if kv_buffer.data_ptr() % 16 or kv_buffer.stride(0) % 16:
        return "kv_buffer base or row stride not 16-byte aligned (the TMA bulk store)"
    for name, t, align in (("k_nope", k_nope, 16), ("k_rope", k_rope, 4), ("q_nope", q_nope, 16), ("q_rope", q_rope, 4)):
        if not _row_aligned(t, align):
            return f"{name} base or strides not {align}-byte aligned (the kernel's vector loads)"
    return ""


def fp8_kernel_args(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, out_cache_loc, slot_map, **_ignored) -> dict:
    """The op's inputs as SGLang's backend hands them to the kernel: the physical rows (the pool's translation
    of out_cache_loc, its dtype kept), the rest as they are. ``_ignored``: the dispatch's flags (the gate)."""
    from reference.mla_fp8_prepare.chain import KVPool

    phys = KVPool(kv_buffer, slot_map).physical(out_cache_loc).contiguous()
    return {"kv_buffer": kv_buffer, "loc": phys, "k_nope": k_nope, "k_rope": k_rope, "q_nope": q_nope,
            "q_rope": q_rope}


def _fp8_can_handle(kernels: Kernels):
    def can_handle(case, device, inputs) -> bool | str:
        lacks = kernels.missing("fp8")
        if lacks:
            return lacks
        if inputs["fp8_policy"] != "saturate":
            return f"fp8 policy {inputs['fp8_policy']!r}: the kernel saturates (__NV_SATFINITE)"
        if inputs["kv_descale"] not in (None, 1.0):
            return (f"kv_descale {inputs['kv_descale']}: the kernel casts k unscaled (SGLang's fp8 MLA path has no "
                    f"k scale)")
        if not inputs["save_kv_cache"]:
            return "save_kv_cache False: SGLang launches the kernel only when it saves the KV cache"
        args = fp8_kernel_args(**inputs)
        if bool((args["loc"] < 0).any()):
            return ("padding slots (loc < 0): the kernel writes every token's row (its only skip is DCP ownership); "
                    "at loc -1 it would write before the pool")
        reason = fp8_gate(**args)
        if kernels.first_call is not None:
            kernels.first_call("fp8")  # the build covered_fp8 would start, timed apart from the check
        if kernels.covered_fp8 is not None and not kernels.covered_fp8(**args):
            return f"SGLang's covered_fp8 declines: {reason or 'a reason this adapter does not know'}"
        return reason or True
    return can_handle


def _fp8_adapter(kernels: Kernels):
    def fn(**inputs):
        """One launch on the physical rows; the rows it was given recorded in the pool model (docs/plugins.md)."""
        from reference.mla_fp8_prepare.chain import KVPool

        a = fp8_kernel_args(**inputs)
        q8 = kernels.set_mla_kv_concat_q_fp8(a["kv_buffer"], a["loc"], a["k_nope"], a["k_rope"], a["q_nope"],
                                             a["q_rope"])
        pool = KVPool(a["kv_buffer"])
        pool.record(a["loc"])
        return {"q8": q8, "kv_writes": pool.writes}
    return fn


# ----------------------------------------------------------------------------- qk norm + rope (target verify)

def norm_rope_compiles(D: int, R: int) -> str:
    """Why the norm+RoPE templates reject head_dim ``D`` / rope_dim ``R`` (their static_asserts; "" when not)."""
    if R != ROPE_DIM:
        return f"rope_dim {R}: the kernels rotate {ROPE_DIM} dims (one (re, im) pair per lane; static_assert)"
    vec = min(8, D // 32)  # kVecSize = min(16 / sizeof(bf16), kHeadDim / kWarpThreads)
    if vec < 1 or D % (32 * vec) or R % vec or R // vec > 32 or R % (vec * (D // (32 * vec))):
        return f"head_dim {D}: the templates' lane tiling rejects it (static_assert: whole warp tiles, rope in the last)"
    return ""


def _qk_can_handle(kernels: Kernels):
    def can_handle(case, device, inputs) -> bool | str:
        lacks = kernels.missing("qk")
        if lacks:
            return lacks
        if inputs["forward_mode"] != "target_verify":
            return (f"forward mode {inputs['forward_mode']!r}: verify mode only (the kernels store nothing; the "
                    f"decode ring store is another launch)")
        if inputs.get("swa_cache") is not None:
            return "non-unified layer: its paged fp8 store is fused_k_norm_rope_flashmla, not adapted here"
        if inputs["rope_style"] != "interleaved":
            return f"rope style {inputs['rope_style']!r}: the kernels rotate interleaved pairs (2l, 2l + 1)"
        if inputs["q_norm_weight"] is not None:
            return "q weight given: fused_q_norm_rope normalises q without a weight (DeepSeek-V4's q_head_norm)"
        kv, w = inputs["kv"], inputs["kv_norm_weight"]
        if w.dtype != kv.dtype:
            return f"kv_norm_weight {w.dtype}: the kernel reads the weight in kv's dtype ({kv.dtype})"
        return norm_rope_compiles(kv.shape[-1], int(inputs["rope_dim"])) or True
    return can_handle


def qk_kernel_args(*, q, kv, cos, sin, positions, q_out) -> dict:
    """The op's inputs as DeepSeek-V4 hands them to the kernels (module docstring): q heads packed, q_out
    allocated like q when not given, kv contiguous (a copy of a strided slice), ``freqs_cis`` (max_pos, R/2)
    complex64 = cos + i·sin, positions int64."""
    q_in = q if q.stride()[1:] == (q.shape[2], 1) else q.contiguous()
    return dict(q=q_in, q_out=q_out if q_out is not None else torch.empty_like(q_in, memory_format=torch.contiguous_format),
                kv=kv if kv.is_contiguous() else kv.contiguous(), freqs_cis=torch.complex(cos, sin),
                positions=positions.long())


def _qk_adapter(kernels: Kernels):
    def fn(*, q, kv, kv_norm_weight, q_norm_weight, eps, rope_dim, cos, sin, positions, rope_style, ring, loc,
           forward_mode, q_out, swa_cache=None, swa_page_size=None):
        """Target verify: q into q_out, kv normalised and rotated in place (on its contiguous copy); no store."""
        a = qk_kernel_args(q=q, kv=kv, cos=cos, sin=sin, positions=positions, q_out=q_out)
        kernels.fused_q_norm_rope(a["q"], a["q_out"], float(eps), a["freqs_cis"], a["positions"])
        kernels.fused_norm_rope_inplace(a["kv"], kv_norm_weight, float(eps), a["freqs_cis"], a["positions"])
        return {"q_out": a["q_out"], "kv_out": a["kv"]}
    return fn


# ----------------------------------------------------------------------------- greedy tree verify

def _tree_can_handle(kernels: Kernels):
    def can_handle(case, device) -> bool | str:
        return kernels.missing("tree") or tree_refusal(case) or True
    return can_handle


def _tree_adapter(kernels: Kernels):
    def fn(**inputs):
        """EAGLE's greedy tree verify: torch.argmax, then the CUDA kernel on the Triton adapter's arguments."""
        args = tree_kernel_args(**inputs)
        kernels.verify_tree_greedy(*args)
        return tree_outputs(args)
    return fn


# ----------------------------------------------------------------------------- the implementations

def impls(kernels: Kernels) -> list[Impl]:
    """The three adapters over ``kernels`` (SGLang's, or the emulation's, whose names end in ``-emulated``)."""
    suffix = "" if kernels.name == "sglang" else f"-{kernels.name}"
    doc = f"SGLang {installed_version() or '?'} (checked against {VERSION}) JIT CUDA, {kernels.name}: "
    return [
        Impl("mla_fp8_prepare", f"sglang-jit-fp8-prepare{suffix}", "external", _fp8_adapter(kernels),
             can_handle=_fp8_can_handle(kernels), fp8_policy="saturate",
             doc=doc + "set_mla_kv_concat_q_fp8, one launch on physical rows, __NV_SATFINITE"),
        Impl("qk_norm_rope", f"sglang-jit-qk-norm-rope{suffix}", "external", _qk_adapter(kernels),
             can_handle=_qk_can_handle(kernels), may_write=("kv",), precision="bf16-norm",
             doc=doc + "fused_q_norm_rope + fused_norm_rope_inplace, target verify, normalised row in bf16"),
        Impl("verify_tree_accept", f"sglang-jit-tree-greedy{suffix}", "external", _tree_adapter(kernels),
             can_handle=_tree_can_handle(kernels),
             doc=doc + "verify_tree_greedy after torch.argmax: EAGLE's greedy tree verify on NVIDIA"),
    ]


def IMPLS() -> list[Impl]:
    """SGLang's JIT kernels (a zero-argument callable: nothing is imported or built until a case runs)."""
    return impls(sglang())


# ----------------------------------------------------------------------------- the benchmarks' calls

def _timed_entries(kernels: Kernels) -> Kernels:
    """``kernels`` as a benchmark times them: SGLang's own entry points unwrapped (the first-call bookkeeping of
    ``sglang()`` is not what the model's call pays; call them once through ``kernels`` first), the emulation's
    as they are."""
    if kernels.name != "sglang":
        return kernels
    mods = load()
    return replace(kernels, set_mla_kv_concat_q_fp8=mods["set_mla_kv_concat_q"].set_mla_kv_concat_q_fp8,
                   fused_q_norm_rope=mods["norm_rope"].fused_q_norm_rope,
                   fused_norm_rope_inplace=mods["norm_rope"].fused_norm_rope_inplace,
                   verify_tree_greedy=mods["tree"].verify_tree_greedy)


def qk_bench_call(inputs: dict, kernels: Kernels | None = None) -> Callable[[], tuple] | str:
    """For the benchmarks (``cases/qk_norm_rope/bench_vs_sglang.py``): the two norm+RoPE kernels on qk_norm_rope
    ``inputs`` (``forward_mode`` among them) as DeepSeek-V4 calls them, a zero-argument callable returning
    (q_out, kv_out); or, where the adapter refuses them (``can_handle``: what the machine lacks first), its
    one-line reason. ``qk_kernel_args`` translates once, outside the timed call, as the model holds its
    ``freqs_cis`` and a contiguous kv: q_out allocated once, kv normalised in place on its own copy (the caller's
    tensors stay untouched). The first call (the JIT build, timed in ``FIRST_CALLS``) is made here. ``kernels``:
    default SGLang's (``sglang()``)."""
    kernels = kernels or sglang()
    why = _qk_can_handle(kernels)(None, None, inputs)
    if why is not True:
        return why
    a = qk_kernel_args(q=inputs["q"], kv=inputs["kv"], cos=inputs["cos"], sin=inputs["sin"],
                       positions=inputs["positions"], q_out=None)
    kv = a["kv"].clone() if a["kv"] is inputs["kv"] else a["kv"]
    weight, eps = inputs["kv_norm_weight"], float(inputs["eps"])

    def call(k: Kernels) -> tuple:
        k.fused_q_norm_rope(a["q"], a["q_out"], eps, a["freqs_cis"], a["positions"])
        k.fused_norm_rope_inplace(kv, weight, eps, a["freqs_cis"], a["positions"])
        return a["q_out"], kv

    call(kernels)
    return functools.partial(call, _timed_entries(kernels))


def fp8_bench_call(inputs: dict, kernels: Kernels | None = None) -> Callable[[], torch.Tensor] | str:
    """For the benchmarks (``cases/mla_fp8_prepare/bench.py``): ``set_mla_kv_concat_q_fp8`` on mla_fp8_prepare
    ``inputs`` as the trtllm-mla backend calls it (``fp8_kernel_args``: the physical rows), a zero-argument
    callable returning q8 (allocated by the kernel per call, as SGLang's call does); or, where the adapter
    refuses them (``can_handle``: what the machine lacks, the policy, the k scale, padding, then
    ``covered_fp8``), its one-line reason. The first call (the JIT build, timed) is made here. ``kernels``:
    default SGLang's (``sglang()``)."""
    kernels = kernels or sglang()
    why = _fp8_can_handle(kernels)(None, None, inputs)
    if why is not True:
        return why
    a = fp8_kernel_args(**inputs)
    args = (a["kv_buffer"], a["loc"], a["k_nope"], a["k_rope"], a["q_nope"], a["q_rope"])
    kernels.set_mla_kv_concat_q_fp8(*args)
    return functools.partial(_timed_entries(kernels).set_mla_kv_concat_q_fp8, *args)


# ----------------------------------------------------------------------------- building ahead of a run

def warm(head_dims=(512,)) -> dict[str, float]:
    """Build (or load from ``cache_dir()``) every variant the adapters call — the fp8 kernel, the two
    norm+RoPE kernels per head dim and the tree module — concurrently, each timed; {variant: seconds}. RuntimeError naming what
    is missing."""
    lacks = missing("fp8") or missing("qk")
    if lacks:
        raise RuntimeError(lacks)
    load()  # first: the stand-ins, before any sglang import
    from sglang.kernels.jit.utils import parallel_compile

    k = sglang()
    dev = torch.device("cuda")

    def norm_rope(D):
        q = torch.zeros(1, 1, D, dtype=torch.bfloat16, device=dev)
        kv = torch.zeros(1, D, dtype=torch.bfloat16, device=dev)
        freqs, pos = torch.ones(1, ROPE_DIM // 2, dtype=torch.complex64, device=dev), torch.zeros(1, dtype=torch.long,
                                                                                                  device=dev)
        return [lambda: k.fused_q_norm_rope(q, torch.empty_like(q), 1e-6, freqs, pos),
                lambda: k.fused_norm_rope_inplace(kv, kv[0].clone(), 1e-6, freqs, pos)]

    parallel_compile([_fp8_module, _tree_module, *(b for D in head_dims for b in norm_rope(D))])
    return dict(FIRST_CALLS)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m harness.adapters.sglang_jit",
                                description="Build SGLang's JIT kernels the sglang_jit adapters call, timed; or say "
                                            "in one line what this machine lacks to run them.")
    p.add_argument("--head-dims", default="512", help="norm+RoPE head dims to build, comma-separated (default 512)")
    args = p.parse_args(argv)
    lacks = missing("fp8") or missing("qk")
    if lacks:
        print(f"sglang-jit: refused on this machine: {lacks}")
        return 0
    t0 = time.perf_counter()
    times = warm(tuple(int(d) for d in args.head_dims.split(",")))
    for key, s in sorted(times.items()):
        print(f"sglang-jit: {key:40s} {s:8.2f} s")
    print(f"sglang-jit: {len(times)} variants ready in {time.perf_counter() - t0:.2f} s wall (cache {cache_dir()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
