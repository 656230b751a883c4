"""The public entry points of each op (``TARGETS``, declared in ``cases/<op>/bad_inputs.py``), how
each is called with the op's step keyword arguments, the legal inputs it may refuse (its declared
limits), and the small valid cases every target of an op takes (``base_cases``, the op module's)."""
from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable

from hypothesis import strategies as st

from harness.fuzz.args import MODULES
from harness.fuzz.declared import Target

_R = "reference"
TARGETS: dict[str, Target] = {t.name: t for mod in MODULES.values() for t in mod.TARGETS}


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
        from fused.verify_attention import wrapper as f

        if kw.get("topk", 1) != 1 or kw.get("custom_mask") is not None:
            return "topk > 1: the kernels read no tree mask"
        verdict = f.can_handle(t.limit, **kw)
        return "" if verdict is True else str(verdict)
    if t.limit == "mla":
        from fused.mla_fp8_prepare import wrapper as f
        from reference.mla_fp8_prepare.chain import FP8_FORMAT_OF

        why = f.covered(**{k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "fp8_policy")})
        fmt = FP8_FORMAT_OF.get(kw["kv_buffer"].dtype)
        return why or ("" if fmt in f.kernel_fp8_formats(device) else f"{fmt} on {device.arch}")
    return ""


def targets_for(op: str) -> list[Target]:
    """Reference targets first (a class's first failure is usually found there, cheaply)."""
    return sorted((t for t in TARGETS.values() if t.op == op), key=lambda t: t.kind != _R)


# ----------------------------------------------------------------------------- valid cases

def pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def base_cases(op: str, device) -> st.SearchStrategy:
    """Small valid cases of ``op`` that every target of the op takes on ``device``: its module's."""
    return MODULES[op].base_cases(device)


@functools.cache
def op_spec(op: str):
    """The op's registry spec (build_inputs, oracle, outputs, effects, writable buffers)."""
    from harness.ops import default_registry

    return default_registry(with_mutants=False, with_plugins=False).ops[op]
