"""SGLang 0.5.23's own Triton kernels behind the plugin API (``--impl harness.adapters.sglang:IMPLS``).

  sglang-split-kv      verify_attention  ``verify_splitkv_fwd``  (verify_splitkv.py): per-head split-KV
  sglang-shared-kv     verify_attention  ``verify_shared_kv_fwd`` (verify_mla.py): grouped shared-KV, MLA too
  sglang-qk-norm-rope  qk_norm_rope      ``fused_qk_norm_rope_swa_store`` (fused_qk_norm_rope_store.py),
                                         bf16 ring store in decode (``bf16_store=True``)
  sglang-chain-sampling spec_sampling    ``chain_speculative_sampling_triton`` (speculative/reject_sampling.py):
                                         the chain rejection sampler EAGLE's verify runs with rejection
                                         sampling on, the uniforms (SGLang's "coins") given: exact
  sglang-tree-greedy   verify_tree_accept ``verify_tree_greedy_triton`` (speculative/spec_tree.py): the Triton
                                         twin of the CUDA kernel EAGLE's greedy tree verify runs on NVIDIA and
                                         AMD (SGLang runs this one on XPU), after EAGLE's torch.argmax: exact

Written as any user's adapter is (docs/plugins.md): it sees the op's keyword arguments and the case,
calls the vendor's own entry point and the vendor's own ``can_handle``, and refuses, with the reason,
what the kernel declines. Each declares the roundings of its design (``precision``):
  split-KV   P rounded to the value dtype before P·V (bf16, or fp8 with fp8 KV), q cast to the fp8 KV
             dtype: ``bf16-p+fp8-q``; its split partials are fp32;
  shared-KV  the same plus split partials stored in bf16: ``bf16-p+bf16-partials+fp8-q``;
  qk         norm and RoPE in fp32, one bf16 rounding: exact; it normalises ``kv`` in place (``may_write``);
  sampling   integer outputs from given uniforms: exact (the uniforms are cleared of every decision boundary).

Importing the kernels without SGLang's serving stack: ``pip install --no-deps sglang==0.5.23`` puts the
kernel files on disk, but ``import sglang`` runs ``sglang/__init__.py``, which imports the whole runtime
(transformers patches, the frontend language, FlashInfer...). ``load()`` instead registers the packages
on the path to the three files as empty packages (their ``__init__`` not run; ``__path__`` the real
folders), so that the three kernel files — and ``dsv4/unified_kv_kernels/layout.py``, which
fused_qk_norm_rope_store.py imports and which needs only torch — load unchanged from the installed
wheel. Three host-side helpers they import from the runtime are given as one-line equivalents
(``SHIMMED``: whether torch is a HIP build, and whether the GPU is a gfx95x / gfx94x part). When the
real ``sglang`` package is already imported, it is used as it is.

The kernels cache their scratch buffers per shape across calls (``_VK_CACHE``, ``_VMLA_CACHE``); the
adapters empty those caches before each call, so that every call allocates its scratch and the
harness's poisoned-allocator run sees what a kernel reads without writing it.
"""
from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import sys
import types

import torch

from harness.registry import Impl
from reference.checks import UnsupportedError

VERSION = "0.5.23"  # the release the adapters, their refusals and cases/ledgers/sglang.py were checked against
_FILES = ("sglang.kernels.ops.attention.verify_splitkv", "sglang.kernels.ops.attention.verify_mla",
          "sglang.kernels.ops.attention.fused_qk_norm_rope_store", "sglang.kernels.ops.speculative.reject_sampling")
_LAYOUT = "sglang.kernels.ops.attention.dsv4.unified_kv_kernels.layout"  # imported by the qk file; torch only


def _is_hip() -> bool:
    return torch.version.hip is not None


def _gcn_arch() -> str:
    return torch.cuda.get_device_properties(0).gcnArchName if _is_hip() else ""


SHIMMED = {  # module -> {name: the host-side helper it stands for}
    "sglang.srt.utils": {"is_hip": _is_hip, "is_gfx95_supported": lambda: "gfx95" in _gcn_arch()},
    "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: "gfx94" in _gcn_arch()},
}


STAND_IN = "__verify_parity_stand_in__"  # marks a module registered by stand_in


class SGLangUnavailable(ImportError):
    """sglang is not installed (``pip install --no-deps sglang==0.5.23``)."""


@functools.cache
def load() -> dict[str, types.ModuleType]:
    """The four kernel modules of the installed sglang, keyed by file stem."""
    stand_in(SHIMMED, [m.rsplit(".", 1)[0] for m in (*_FILES, _LAYOUT)])
    return {m.rsplit(".", 1)[1]: importlib.import_module(m) for m in _FILES}


def real_sglang_imported() -> bool:
    """A real ``sglang`` package (its ``__init__`` run) is imported in this process."""
    return getattr(sys.modules.get("sglang"), "__file__", None) is not None


def stand_in(helpers: dict[str, dict], packages=()) -> None:
    """Register ``packages`` (and their parents) as packages whose ``__init__`` is not run, and each module
    of ``helpers`` (module -> {name: the host-side helper it stands for}) as a stand-in holding those names;
    a stand-in already registered (by another adapter of this family) gets the names it lacks. Nothing
    when the real ``sglang`` is imported; SGLangUnavailable when it is not installed."""
    if real_sglang_imported():
        return
    if "sglang" in sys.modules:  # registered by an earlier call
        root = list(sys.modules["sglang"].__path__)
    else:
        spec = importlib.util.find_spec("sglang")
        root = list(spec.submodule_search_locations or []) if spec is not None else []
    if not root:
        raise SGLangUnavailable(f"sglang is not installed: pip install --no-deps sglang=={VERSION}")
    for mod, names in helpers.items():
        _package_path(mod.rsplit(".", 1)[0], root[0])
        stub = sys.modules.get(mod)
        if stub is None or not getattr(stub, STAND_IN, False):
            stub = types.ModuleType(mod, f"verify-parity stand-in for {mod} (harness.adapters: SHIMMED)")
            stub.__dict__[STAND_IN] = True  # a module made here: its names are filled in, nothing is rebound
            sys.modules[mod] = stub
        for name, fn in names.items():
            stub.__dict__.setdefault(name, fn)
    for pkg in packages:
        _package_path(pkg, root[0])


def _package_path(pkg: str, root: str) -> None:
    """Register ``pkg`` and its parents as packages whose ``__init__`` is not run."""
    parts = pkg.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = ["/".join([root, *parts[1:i]])]
            m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)  # find_spec(name) answers
            m.__spec__.submodule_search_locations = m.__path__
            sys.modules[name] = m


def installed_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return ""


# ----------------------------------------------------------------------------- verify attention

def _widths(qo_indptr: torch.Tensor) -> list[int]:
    qo = qo_indptr.tolist()
    return [b - a for a, b in zip(qo, qo[1:])]


def _kv_dtype_refusal(k_buffer: torch.Tensor, device) -> str:
    """fp8 flavours that do not compile on this arch (the interpreter converts both)."""
    if device.interpreted or k_buffer.dtype == torch.bfloat16:
        return ""
    native = torch.float8_e4m3fnuz if device.fp8_format == "e4m3fnuz" else torch.float8_e4m3fn
    return "" if k_buffer.dtype == native else f"{k_buffer.dtype} does not compile on {device.arch}"


def _vendor_args(inputs: dict) -> dict:
    """The op's keyword arguments as SGLang's extend_attention_fwd-style call takes them."""
    return dict(q_extend=inputs["q"], k_extend=inputs["k"], v_extend=inputs["v"], k_buffer=inputs["k_buffer"],
                v_buffer=inputs["v_buffer"], qo_indptr=inputs["qo_indptr"], kv_indptr=inputs["kv_indptr"],
                kv_indices=inputs["kv_indices"], custom_mask=inputs["custom_mask"], is_causal=inputs["is_causal"],
                mask_indptr=None, max_len_extend=max(_widths(inputs["qo_indptr"])))


def _attention_can_handle(stem: str, why_not, declines_after=lambda inputs: ""):
    """The vendor's ``can_handle`` on the very tensors, then what its entry point declines after it
    (``declines_after``); ``why_not`` names the reason of a refusal (the vendor returns a bare False)."""
    def can_handle(case, device, inputs) -> bool | str:
        if inputs["topk"] != 1:
            return (f"topk {inputs['topk']}: the kernel computes the causal chain and never reads the tree mask "
                    f"(SGLang's backend gates it on topk == 1)")
        refusal = _kv_dtype_refusal(inputs["k_buffer"], device)
        if refusal:
            return refusal
        if not load()[stem].can_handle(**_vendor_args(inputs)):
            return f"SGLang's can_handle declines: {why_not(inputs) or 'outside its verify contract'}"
        return declines_after(inputs) or True
    return can_handle


def _ragged(inputs) -> str:
    return "ragged verify widths" if len(set(_widths(inputs["qo_indptr"]))) > 1 else ""


def _split_kv_why_not(inputs) -> str:
    if not inputs["is_causal"]:
        return "non-causal drafts (the split-KV kernel is causal only)"
    if inputs["q"].shape[2] != inputs["v"].shape[2]:
        return "MLA layout (head_dim != v_head_dim)"
    return _ragged(inputs)


def _shared_kv_why_not(inputs) -> str:
    group = inputs["q"].shape[1] // inputs["k"].shape[1]
    if inputs["k"].shape[1] > 1 and group & (group - 1):
        return f"KV group {group} is not a power of two with several KV heads"
    return _ragged(inputs)


def _shared_kv_declines_after(inputs) -> str:
    if inputs["q"].shape[2] < inputs["v"].shape[2]:
        return "head_dim < v_head_dim"
    return "empty kv_indices (verify_shared_kv_fwd returns False)" if inputs["kv_indices"].numel() == 0 else ""


def _attention(stem: str, entry: str, cache: str):
    def fn(**inputs):
        mod = load()[stem]
        getattr(mod, cache).clear()  # scratch allocated in this call (see the module docstring)
        q = inputs["q"]
        o = inputs["o"]
        if o is None:
            o = torch.empty(q.shape[0], q.shape[1], inputs["v"].shape[2], dtype=q.dtype, device=q.device)
        ran = getattr(mod, entry)(o_extend=o, k_scale=inputs["k_scale"], v_scale=inputs["v_scale"],
                                  sm_scale=inputs["sm_scale"], **_vendor_args(inputs))
        if not ran:
            raise RuntimeError(f"{entry} returned False (declined) on an input its can_handle accepted")
        return {"o": o}
    return fn


# ----------------------------------------------------------------------------- qk norm + rope

def _qk_can_handle(case, device, inputs) -> bool | str:
    q, D, R = inputs["q"], inputs["q"].shape[2], inputs["rope_dim"]
    if inputs["rope_style"] != "interleaved":
        return f"rope style {inputs['rope_style']!r}: the kernel rotates GPT-J pairs only"
    if D & (D - 1) or R & (R - 1):
        return f"head_dim {D} / rope_dim {R} not powers of two (tl.arange)"
    if q.stride(1) != D * q.stride(2):
        return "q heads not packed (the kernel reads q as (T, H·D))"
    paged = inputs.get("swa_cache") is not None
    if paged and (D, R) != (512, 64):
        return f"non-unified head_dim {D} / rope_dim {R}: the paged fp8 store is DeepSeek-V4's 448 fp8 + 64 bf16 only"
    if (paged or inputs["forward_mode"] == "decode") and bool((inputs["loc"] < 0).any()):
        return "padding slots (loc < 0): the kernel's store writes every row it is given"
    return True


def _qk_norm_rope(*, q, kv, kv_norm_weight, q_norm_weight, eps, rope_dim, cos, sin, positions, rope_style, ring,
                  loc, forward_mode, q_out, swa_cache=None, swa_page_size=None):
    """Unified decode: the bf16 ring store; unified verify: no store; non-unified (``swa_cache``):
    the kernel's paged fp8 store (``bf16_store=False``) in every mode, as the model calls it."""
    if swa_cache is not None:
        cache, page_size, bf16_store = swa_cache, int(swa_page_size), False
    else:
        cache, page_size, bf16_store = (ring if forward_mode == "decode" else None), 1, True
    mod = load()["fused_qk_norm_rope_store"]
    T, H, D = q.shape
    q_out = mod.fused_qk_norm_rope_swa_store(
        q.reshape(T, H * D), kv, q_norm_weight, kv_norm_weight, eps, eps, rope_dim, cos, sin, positions,
        swa_cache=cache, swa_loc=loc.to(torch.int32) if cache is not None else None, swa_page_size=page_size,
        q_out=q_out, dtype=q.dtype, bf16_store=bf16_store)
    return {"q_out": q_out, "kv_out": kv}  # kv normalised and rotated in place


# ----------------------------------------------------------------------------- chain speculative sampling

def _chain_sampling_can_handle(case, device) -> bool | str:
    if case.mode == "distribution":
        return ("no uniforms: SGLang's kernel takes its coins as inputs (drawn outside it by torch.rand); the exact "
                "cases judge it with the coins given")
    return True


def _chain_sampling_step(*, target_logits, temperature, draft_probs, draft_tokens, uniforms, kernels=None):
    """EAGLE's verify with rejection sampling on (``eagle_utils.py``) for a chain, as a zero-argument callable
    doing the device work (the target probabilities softmax(logits / T), ``sampling_softmax``'s torch path,
    then ``chain_speculative_sampling_triton``) -> (predicts (B, L + 1) int32, accept_token_num (B,) int32).
    Built once: the chain as SGLang's tree layout of one path (``candidates`` (B, L + 1): slot 0 the last
    verified token, which the kernel never reads, then the drafts; ``retrive_index`` b·(L + 1) + i), the
    coins ``uniform_samples`` (B, L + 1) (column j decides draft j) and ``uniform_samples_for_final_sampling``
    (B,): ``uniforms[:, :L]`` and ``uniforms[:, L]``. ``kernels``: another module of SGLang's
    ``reject_sampling`` (default: the installed one; tests plant bugs in a copy)."""
    mod = kernels or load()["reject_sampling"]
    B, Lp1, _ = target_logits.shape
    dev = target_logits.device
    candidates = torch.cat((torch.zeros(B, 1, dtype=torch.long, device=dev), draft_tokens.long()), 1)
    retrive_index = torch.arange(B * Lp1, dtype=torch.long, device=dev).view(B, Lp1)
    coins = torch.cat((uniforms[:, :-1], torch.zeros(B, 1, device=dev)), 1).contiguous()  # (B, L + 1) as SGLang's
    final = uniforms[:, -1].contiguous()

    def step():
        probs = torch.softmax(target_logits.float() / temperature[:, None, None], dim=-1)  # (B, L + 1, V)
        predicts = torch.full((B * Lp1,), -1, dtype=torch.int32, device=dev)
        accept_index = torch.full((B, Lp1), -1, dtype=torch.int32, device=dev)
        n = torch.zeros((B,), dtype=torch.int32, device=dev)
        mod.chain_speculative_sampling_triton(predicts, accept_index, n, candidates, retrive_index, None, None, coins,
                                              final, probs, draft_probs, 1.0, 1.0, True)
        return predicts.view(B, Lp1), n
    return step


def chain_sampling(*, target_logits, temperature, draft_probs, draft_tokens, uniforms=None, seed=None, kernels=None):
    """The op through SGLang's chain sampler (``_chain_sampling_step``): SGLang writes ``predicts`` at the
    accepted path's slots, the drafts then the sampled token; the rest of ``output_ids`` is -1. The coins
    are the kernel's inputs (SGLang draws them outside it, with ``torch.rand`` or from per-request seeds),
    so ``uniforms`` must be given."""
    if uniforms is None:
        raise UnsupportedError("uniforms", "SGLang's chain sampler takes its coins as inputs: give the uniforms")
    predicts, n = _chain_sampling_step(target_logits=target_logits, temperature=temperature, draft_probs=draft_probs,
                                       draft_tokens=draft_tokens, uniforms=uniforms, kernels=kernels)()
    keep = torch.arange(predicts.shape[1], device=n.device)[None, :] <= n.long()[:, None]
    return {"output_ids": torch.where(keep, predicts, -1), "accept_length": n}


def sampling_bench_calls(kw: dict) -> dict:
    """{"sglang-chain-sampling": a zero-argument callable} running SGLang's verify sampling for a chain
    (``_chain_sampling_step``: softmax, ``chain_speculative_sampling_triton``) on spec_sampling keyword
    arguments ``kw`` (uniforms given), for the benchmark (cases/spec_sampling/bench.py). {} when sglang is
    not installed."""
    try:
        load()
    except SGLangUnavailable:
        return {}
    return {"sglang-chain-sampling": _chain_sampling_step(
        **{k: kw[k] for k in ("target_logits", "temperature", "draft_probs", "draft_tokens", "uniforms")})}


# ----------------------------------------------------------------------------- tree greedy acceptance

_TREE = "sglang.kernels.ops.speculative.spec_tree"


def _no_platform_dispatch(*args, **kwargs):
    raise NotImplementedError("verify-parity stand-in: SGLang's platform dispatch is not part of the adapters")


# spec_tree.py's host side: its platform flags pick what ``verify_tree_greedy_func`` dispatches to and which
# compiled builders it imports (sgl_kernel on CPU and MUSA, its JIT module on CUDA and ROCm). The adapter calls
# the Triton kernel itself, so those flags are False (no branch imports a compiled extension); ``is_hip`` stays
# SHIMMED's (the real answer), so on ROCm the file imports SGLang's JIT tree module and may not load.
TREE_SHIMMED = {
    "sglang.srt.utils": {f"is_{p}": (lambda: False) for p in ("cuda", "cpu", "musa", "npu", "xpu")},
    "sglang.srt.platforms": {"current_platform": None},
    "sglang.srt.platforms.interface": {"reject_out_of_tree_path": _no_platform_dispatch},
}


@functools.cache
def load_tree() -> types.ModuleType:
    """SGLang's spec_tree.py (``verify_tree_greedy_triton``), loaded as ``load`` loads the other files."""
    stand_in(SHIMMED)
    stand_in(TREE_SHIMMED, [_TREE.rsplit(".", 1)[0]])
    return importlib.import_module(_TREE)


TREE_PADDING_REFUSAL = ("padding requests (retrive_index[b, 0] < 0): SGLang's kernel stores that index in accept_index "
                        "and writes predicts at it; EAGLE never passes them")


def tree_refusal(case) -> str:
    """What SGLang's greedy tree verify (its Triton kernel and its CUDA twin alike) declines of a
    verify_tree_accept case ("" nothing): padding requests (``TREE_PADDING_REFUSAL``)."""
    return TREE_PADDING_REFUSAL if case.padding else ""


def _tree_can_handle(case, device) -> bool | str:
    if tree_refusal(case):
        return tree_refusal(case)
    try:
        load_tree()
    except Exception as exc:  # e.g. ROCm: the file imports SGLang's JIT tree module there
        return f"spec_tree.py does not load here ({type(exc).__name__}: {exc})"
    return True


def tree_kernel_args(*, target_logits, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                     num_speculative_tokens) -> tuple:
    """The op's inputs as EAGLE's greedy tree verify (``eagle_utils.py``) hands them to SGLang's tree kernel, in
    the positional order both its Triton ``verify_tree_greedy_triton`` and its CUDA ``verify_tree_greedy`` take:
    (predicts (B·N,) int32 pre-filled with -1 — SGLang zero-fills it and its kernels write the accepted path's
    entries only, the op's contract has -1 elsewhere —, accept_index (B, S) int32 -1, accept_token_num (B,) int32,
    candidates, retrive_index, retrive_next_token, retrive_next_sibling as contiguous int64 (B, N), target_predict
    = ``torch.argmax`` of the target rows, (B, N) int64 in row order). Device work (the argmax) included."""
    B, N = candidates.shape
    dev = target_logits.device
    target_predict = torch.argmax(target_logits[: B * N], dim=-1).view(B, N)
    return (torch.full((B * N,), -1, dtype=torch.int32, device=dev),
            torch.full((B, num_speculative_tokens), -1, dtype=torch.int32, device=dev),
            torch.zeros((B,), dtype=torch.int32, device=dev),
            *(t.long().contiguous() for t in (candidates, retrive_index, retrive_next_token, retrive_next_sibling)),
            target_predict)


def tree_outputs(args: tuple) -> dict:
    """The op's three outputs from the kernel's written arguments (``tree_kernel_args``' first three)."""
    return {"predicts": args[0], "accept_index": args[1], "accept_token_num": args[2]}


def tree_greedy(*, target_logits, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
                num_speculative_tokens, kernels=None):
    """The op as EAGLE's greedy tree verify runs it (``eagle_utils.py``): ``torch.argmax`` of the target rows,
    then ``verify_tree_greedy_triton`` on SGLang's int64 tree tensors (``tree_kernel_args``). ``kernels``:
    another module of SGLang's ``spec_tree`` (default: the installed one; tests plant bugs in a copy)."""
    mod = kernels or load_tree()
    args = tree_kernel_args(target_logits=target_logits, candidates=candidates, retrive_index=retrive_index,
                            retrive_next_token=retrive_next_token, retrive_next_sibling=retrive_next_sibling,
                            num_speculative_tokens=num_speculative_tokens)
    mod.verify_tree_greedy_triton(*args)
    return tree_outputs(args)


def tree_bench_calls(kw: dict) -> dict:
    """{"sglang-tree-greedy": a zero-argument callable} doing EAGLE's greedy tree verify (``tree_greedy``:
    torch.argmax, then SGLang's Triton tree kernel) on verify_tree_accept keyword arguments ``kw``, for the
    benchmark (cases/verify_tree_accept/bench.py); {} when sglang is not installed or the file does not load."""
    try:
        load_tree()
    except Exception:  # noqa: BLE001 - not installed, or spec_tree.py does not load on this platform
        return {}
    return {"sglang-tree-greedy": lambda: tree_greedy(**kw)}


def IMPLS() -> list[Impl]:
    """The five adapters (a zero-argument callable: ``--impl`` imports no sglang until it runs)."""
    load()
    doc = f"SGLang {installed_version() or '?'} (checked against {VERSION}) "
    return [
        Impl("verify_attention", "sglang-split-kv", "external",
             _attention("verify_splitkv", "verify_splitkv_fwd", "_VK_CACHE"),
             can_handle=_attention_can_handle("verify_splitkv", _split_kv_why_not), precision="bf16-p+fp8-q",
             doc=doc + "verify_splitkv_fwd: per-head split-KV, fp32 partials"),
        Impl("verify_attention", "sglang-shared-kv", "external",
             _attention("verify_mla", "verify_shared_kv_fwd", "_VMLA_CACHE"),
             can_handle=_attention_can_handle("verify_mla", _shared_kv_why_not, _shared_kv_declines_after),
             precision="bf16-p+bf16-partials+fp8-q", doc=doc + "verify_shared_kv_fwd: grouped heads, bf16 partials"),
        Impl("spec_sampling", "sglang-chain-sampling", "external", chain_sampling,
             can_handle=_chain_sampling_can_handle,
             doc=doc + "chain_speculative_sampling_triton: EAGLE's rejection sampler on a chain, coins given"),
        Impl("verify_tree_accept", "sglang-tree-greedy", "external", tree_greedy, can_handle=_tree_can_handle,
             doc=doc + "verify_tree_greedy_triton after torch.argmax: EAGLE's greedy tree verify (its XPU kernel)"),
        Impl("qk_norm_rope", "sglang-qk-norm-rope", "external", _qk_norm_rope, can_handle=_qk_can_handle,
             may_write=("kv",), doc=doc + "fused_qk_norm_rope_swa_store, bf16 ring store in decode, "
                                                "paged fp8 store on non-unified layers"),
    ]


def bench_calls(kw: dict) -> dict:
    """Zero-argument callables running SGLang's two attention kernels as its backend does (scratch cached
    across calls, the vendor's own split counts) on verify_attention keyword arguments ``kw``, for the
    benchmark (cases/verify_attention/bench.py); {} when sglang is not installed."""
    try:
        mods = load()
    except SGLangUnavailable:
        return {}
    q = kw["q"]
    args = dict(**_vendor_args({**kw, "custom_mask": None}), k_scale=kw["k_scale"], v_scale=kw["v_scale"],
                sm_scale=kw["sm_scale"])
    o = torch.empty(q.shape[0], q.shape[1], kw["v"].shape[2], dtype=q.dtype, device=q.device)
    out = {}
    for name, stem, entry in (("sglang-split-kv", "verify_splitkv", "verify_splitkv_fwd"),
                              ("sglang-shared-kv", "verify_mla", "verify_shared_kv_fwd")):
        if mods[stem].can_handle(**_vendor_args({**kw, "custom_mask": None})):
            out[name] = functools.partial(getattr(mods[stem], entry), o_extend=o, **args)
    return out


def qk_bench_calls(kw: dict) -> dict:
    """{"sglang-qk-norm-rope": a zero-argument callable} running SGLang's ``fused_qk_norm_rope_swa_store``
    in target-verify (no store) as its model calls it, on qk_norm_rope keyword arguments ``kw``, for
    the benchmark (cases/qk_norm_rope/bench.py): q_out allocated per call, kv normalised in place on
    its own copy (the same strides), so the other implementations' inputs stay untouched. {} when
    sglang is not installed or its kernel declines the inputs (``_qk_can_handle``)."""
    try:
        mod = load()["fused_qk_norm_rope_store"]
    except SGLangUnavailable:
        return {}
    if _qk_can_handle(None, None, {**kw, "forward_mode": "target_verify"}) is not True:
        return {}
    q, kv = kw["q"], kw["kv"]
    T, H, D = q.shape
    own_kv = torch.empty_strided(kv.shape, kv.stride(), dtype=kv.dtype, device=kv.device).copy_(kv)
    args = (q.reshape(T, H * D), own_kv, kw["q_norm_weight"], kw["kv_norm_weight"], kw["eps"], kw["eps"],
            kw["rope_dim"], kw["cos"], kw["sin"], kw["positions"])
    return {"sglang-qk-norm-rope": functools.partial(mod.fused_qk_norm_rope_swa_store, *args, swa_cache=None,
                                                     swa_loc=None, swa_page_size=1, dtype=q.dtype, bf16_store=True)}
