"""The public entry points of each op (``TARGETS``), how each is called with the op's step
keyword arguments, the legal inputs it may refuse (its declared limits), and the small valid
cases every target of an op takes (``base_cases``)."""
from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st


@dataclass(frozen=True)
class Target:
    """A public function and how it is called with the op's step keyword arguments."""
    name: str  # "module:attr"; a plant is "module:attr@<the target it is called like>"
    op: str
    kind: str  # reference | fused | external (harness.registry.KINDS)
    ref: str  # the target whose answer on the legal input is this one's contract
    call: str = "kwargs"  # kwargs (the step's keyword arguments) | qk-bare | mla-bare
    limit: str = ""  # its declared coverage ("" = every legal input): split_kv | shared_kv (verify kernels) | mla

    @property
    def fn_path(self) -> str:
        return self.name.split("@", 1)[0]

    @property
    def outputs(self) -> tuple[str, ...]:
        return {"qk-bare": ("q_out", "kv_out"), "mla-bare": ("q8",)}.get(self.call, ())

    def forwards(self, name: str) -> bool:
        """Does a step argument reach the function (under its own name, ``rename``)?"""
        if self.call == "qk-bare":
            return name != "forward_mode"
        if self.call == "mla-bare":
            return name in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "decode_kernel_loc", "kv_descale",
                            "fp8_policy")
        return True

    def rename(self, name: str) -> str:
        return "loc" if self.call == "mla-bare" and name == "decode_kernel_loc" else name

    def applies(self, case) -> bool:
        if self.call == "mla-bare":  # it writes rows, at the physical rows of the capture loc
            return case.capture_loc and case.save_kv_cache
        return True


_R, _F = "reference", "fused"
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("reference.qk_norm_rope:qk_norm_rope_step", "qk_norm_rope", _R, "reference.qk_norm_rope:qk_norm_rope_step"),
    Target("reference.qk_norm_rope:qk_norm_rope", "qk_norm_rope", _R, "reference.qk_norm_rope:qk_norm_rope", "qk-bare"),
    Target("fused.qk_norm_rope:qk_norm_rope_step", "qk_norm_rope", _F, "reference.qk_norm_rope:qk_norm_rope_step"),
    Target("fused.qk_norm_rope:qk_norm_rope", "qk_norm_rope", _F, "reference.qk_norm_rope:qk_norm_rope", "qk-bare"),
    Target("reference.mla_fp8_prepare:mla_fp8_prepare_step", "mla_fp8_prepare", _R,
           "reference.mla_fp8_prepare:mla_fp8_prepare_step"),
    Target("reference.mla_fp8_prepare:mla_fp8_prepare", "mla_fp8_prepare", _R,
           "reference.mla_fp8_prepare:mla_fp8_prepare", "mla-bare"),
    Target("fused.mla_fp8_prepare:mla_fp8_prepare_step", "mla_fp8_prepare", _F,
           "reference.mla_fp8_prepare:mla_fp8_prepare_step"),
    Target("fused.mla_fp8_prepare:mla_fp8_prepare", "mla_fp8_prepare", _F,
           "reference.mla_fp8_prepare:mla_fp8_prepare", "mla-bare", "mla"),
    Target("reference.verify_attention:verify_attention", "verify_attention", _R,
           "reference.verify_attention:verify_attention"),
    Target("reference.verify_attention:verify_attention_sdpa", "verify_attention", "external",
           "reference.verify_attention:verify_attention"),
    Target("fused.verify_attention:verify_attention", "verify_attention", _F,
           "reference.verify_attention:verify_attention"),
    Target("fused.verify_attention:verify_split_kv", "verify_attention", _F,
           "reference.verify_attention:verify_attention", limit="split_kv"),
    Target("fused.verify_attention:verify_shared_kv", "verify_attention", _F,
           "reference.verify_attention:verify_attention", limit="shared_kv"),
)}


def resolve_target(name: str) -> Target:
    """A built-in target, or ``module:attr@<built-in>``: any function called like that built-in
    (its op, reference, limits), e.g. a wrapper planted by a test."""
    if name in TARGETS:
        return TARGETS[name]
    fn, sep, like = name.partition("@")
    if not sep or like not in TARGETS or ":" not in fn:
        raise ValueError(f"target: expected one of {sorted(TARGETS)} or module:attr@<one of them>, got {name!r}")
    return dataclasses.replace(TARGETS[like], name=name, kind="fused" if TARGETS[like].kind == _R else TARGETS[like].kind)


def load_fn(path: str) -> Callable:
    module, attr = path.split(":", 1)
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def call_target(t: Target, fn: Callable, kw: dict, case) -> dict:
    """Call the function the way ``t`` says; its outputs by name."""
    if t.call == "qk-bare":
        keep = {k: v for k, v in kw.items() if k != "forward_mode" and (case.mode == "decode" or k not in ("ring", "loc"))}
        q_out, kv_out = fn(**keep)
        return {"q_out": q_out, "kv_out": kv_out}
    if t.call == "mla-bare":
        q8 = fn(q_nope=kw["q_nope"], q_rope=kw["q_rope"], k_nope=kw["k_nope"], k_rope=kw["k_rope"],
                kv_buffer=kw["kv_buffer"], loc=kw["decode_kernel_loc"], kv_descale=kw["kv_descale"],
                fp8_policy=kw["fp8_policy"])
        return {"q8": q8}
    return dict(fn(**kw))


def target_limit(t: Target, kw: dict, device) -> str:
    """Why ``t`` may refuse this legal input ("" when it must answer): its declared coverage."""
    if t.limit in ("split_kv", "shared_kv"):
        from fused import verify_attention as f

        if kw.get("topk", 1) != 1 or kw.get("custom_mask") is not None:
            return "topk > 1: the kernels read no tree mask"
        verdict = f.can_handle(t.limit, **kw)
        return "" if verdict is True else str(verdict)
    if t.limit == "mla":
        from fused import mla_fp8_prepare as f
        from reference.mla_fp8_prepare import FP8_FORMAT_OF

        why = f.covered(**{k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "fp8_policy")})
        fmt = FP8_FORMAT_OF.get(kw["kv_buffer"].dtype)
        return why or ("" if fmt in f.kernel_fp8_formats(device) else f"{fmt} on {device.arch}")
    return ""


def targets_for(op: str) -> list[Target]:
    """Reference targets first (a class's first failure is usually found there, cheaply)."""
    return sorted((t for t in TARGETS.values() if t.op == op), key=lambda t: t.kind != _R)


# ----------------------------------------------------------------------------- valid cases

def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def base_cases(op: str, device) -> st.SearchStrategy:
    """Small valid cases of ``op`` that every target of the op takes on ``device`` (the op's own
    strategy, narrowed: the fused kernels' coverage, the device's fp8 formats)."""
    if op == "qk_norm_rope":
        from cases import qk_norm_rope as c

        # unified layers: a non-unified layer's paged store has no contract for non-finite rows yet
        return c.cases(max_tokens=6, max_heads=3, head_dims=(64, 128), rope_dims=(16, 32, 64), max_positions=64).map(
            lambda k: dataclasses.replace(k, unified=True))
    if op == "mla_fp8_prepare":
        from cases import mla_fp8_prepare as c
        from fused import mla_fp8_prepare as f

        return c.cases(max_tokens=6, max_heads=3, head_dims=((64, 16), (17, 5), (512, 64)),
                       formats=f.kernel_fp8_formats(device), policies=("saturate",)).map(
            lambda k: k if k.q_layout != "inner_strided" else dataclasses.replace(k, q_layout="model"))
    from cases import verify_attention as c
    from fused import verify_attention as f
    from harness.ops.verify_attention import _kernel_can_handle

    ok_kv = tuple(n for n, d in (("bf16", torch.bfloat16), ("e4m3fn", torch.float8_e4m3fn),
                                 ("e4m3fnuz", torch.float8_e4m3fnuz))
                  if device.interpreted or d in f.ARCH_KV_DTYPES.get(device.arch, f.KV_DTYPES))

    def legal(k):
        kind, n = k.prefix.split(":")
        return dataclasses.replace(k, ragged=False, topk=1, prefix=f"{kind}:{max(1, int(n))}",
                                   H=k.Hkv * _pow2_floor(k.H // k.Hkv), kv_dtype=k.kv_dtype if k.kv_dtype in ok_kv
                                   else "bf16")

    return c.cases(max_batch=2, max_width=3, max_heads=4, max_prefix=10, max_splits=2, head_dims=(64,)).map(
        legal).filter(lambda k: all(_kernel_can_handle(kind)(k, device) is True for kind in ("split_kv", "shared_kv")))


@functools.cache
def op_spec(op: str):
    """The op's registry spec (build_inputs, oracle, outputs, effects, writable buffers)."""
    from harness.registry import default_registry

    return default_registry(with_mutants=False, with_plugins=False).ops[op]
