"""Eager dispatch of the qk_norm_rope kernel (``fused.qk_norm_rope.wrapper`` calls it): a variant's second
launch goes through the CompiledKernel its first one returned (``compiled_launch``), and a call whose
arguments' metadata equals an earlier call's takes that call's plan (``call_key``, ``Plan``): the
same checks passed, only the outputs and the tensors are new. ``VP_FAST_LAUNCH=0`` turns both off.
"""
from __future__ import annotations

import inspect
import os

import torch

from fused import device_checks
from fused.qk_norm_rope import kernels as kern
from reference.qk_norm_rope import swa

FAST_LAUNCH_ENV = "VP_FAST_LAUNCH"
_SIGNATURE = tuple(inspect.signature(kern.qk_norm_rope_kernel.fn).parameters.values())
# every parameter in signature order with its default (None for the required ones: the call gives them)
ALL_ARGS = {p.name: None if p.default is inspect.Parameter.empty else p.default for p in _SIGNATURE}
POINTERS = tuple(n for n in ALL_ARGS if n.endswith("_ptr"))
_POINTER_SET = frozenset(POINTERS)
CONSTEXPRS = tuple(p.name for p in _SIGNATURE if "constexpr" in str(p.annotation))
# the int parameters Triton specialises on their value (== 1, divisible by 16): every other int is
# in the kernel's do_not_specialize (tests/test_fast_launch.py holds the two lists together)
SPECIALISED_INTS = ("D", "R")
_DNS_INTS = tuple(getattr(kern.qk_norm_rope_kernel, "do_not_specialize", None)  # JIT / interpreter
                  or kern.qk_norm_rope_kernel.kwargs["do_not_specialize"])
_I32 = 2**31
_ZEROS = (0,) * len(_DNS_INTS)  # the default of a dns int the call leaves out (the pool's, without a pool)
_compiled: dict[tuple, object] = {}


def _variant_key(args: dict, num_warps: int) -> tuple | None:
    """Everything Triton's JIT specialises this kernel on, read from the arguments: the constexprs,
    num_warps, the specialised ints' values, each pointer's dtype and 16-byte alignment (None:
    absent), and that every other int fits i32 (Triton types it i64 otherwise). None when one does
    not (that launch goes through the JIT)."""
    get = args.get
    if max(map(get, _DNS_INTS, _ZEROS)) >= _I32:  # all of them >= 0 (sizes, strides, counts)
        return None
    ptrs = [None if t is None else (t.dtype, t.data_ptr() % 16 == 0) for t in map(get, POINTERS)]
    return (args["q_ptr"].device.index, num_warps, *map(args.__getitem__, SPECIALISED_INTS), *map(get, CONSTEXPRS),
            *ptrs)


def compiled_launch(grid, args: dict, num_warps: int):
    """Launch through Triton's JIT the first time a variant is seen, then through the CompiledKernel it
    returned (``CompiledKernel[grid](*args)``: Triton's own launcher, the arguments in signature
    order), skipping the JIT's per-call binding and cache key: measured on the H200 as most of an
    eager launch (docs/benchmarks.md). ``VP_FAST_LAUNCH=0``: always the JIT. Returns the CompiledKernel
    (None when the variant has no key: its ints need i64)."""
    key = _variant_key(args, num_warps) if os.environ.get(FAST_LAUNCH_ENV, "1") != "0" else None
    compiled = _compiled.get(key) if key is not None else None
    if compiled is None:
        compiled = kern.qk_norm_rope_kernel[grid](**args, num_warps=num_warps)
        if key is None or compiled is None:
            return None
        compiled = _compiled[key] = compiled.result() if hasattr(compiled, "result") else compiled
        return compiled
    compiled[grid](*{**ALL_ARGS, **args}.values())  # grid: all three axes (CompiledKernel reads grid[2])
    return compiled


def pointer_args(*, q_out, kv_out, q, kv, kv_norm_weight, q_norm_weight, cos, sin, positions, ring, loc,
                 swa_cache, flags) -> dict:
    """The kernel's tensor arguments from the op's (the one place that maps them:
    ``fused.qk_norm_rope.wrapper.launch`` and a ``Plan``'s calls). Absent ones are left out (the kernel's
    defaults); a pointer the kernel does not read without its feature gets a tensor of the call (its
    dtype is in the variant's key)."""
    ptrs = dict(q_out_ptr=q_out, kv_out_ptr=kv_out, ring_ptr=kv_out if ring is None else ring, q_ptr=q, kv_ptr=kv,
                q_w_ptr=kv_norm_weight if q_norm_weight is None else q_norm_weight, kv_w_ptr=kv_norm_weight,
                cos_ptr=cos, sin_ptr=sin, pos_ptr=positions,
                loc_ptr=positions if ring is None and swa_cache is None else loc)
    if swa_cache is not None:
        ptrs.update(pool_ptr=swa_cache, pool_fp8_ptr=swa_cache.view(swa.SWA_FP8))
    if flags is not None:
        ptrs["flag_ptr"] = flags
    return ptrs


# ----------------------------------------------------------------------------- call plans
# A call's arguments are validated (shapes, dtypes, strides, devices, scalars) and its launch built
# from nothing but their metadata: a later call whose metadata equals one seen before is the same
# validation and the same launch with other pointers. ``call_key`` is that metadata, complete (a
# test plants each part missing); a ``Plan`` replays the launch with the new call's tensors.

PLAN_CACHE_SIZE = 4096  # distinct call signatures kept (then forgotten, all at once)
plans: dict[tuple, "Plan"] = {}


def remember(key: tuple, plan: "Plan") -> None:
    if len(plans) >= PLAN_CACHE_SIZE:
        plans.clear()
    plans[key] = plan


def plans_on() -> bool:
    return os.environ.get(FAST_LAUNCH_ENV, "1") != "0" and os.environ.get("TRITON_INTERPRET") != "1"


def _meta(t):
    """What ``validate`` and the variant read of a tensor argument (None: absent). A tensor of another
    layout than strided has no strides (``stride()`` raises: no key)."""
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() % 16 == 0)


def call_key(mode, eps, rope_dim, rope_style, swa_page_size, *tensors) -> tuple | None:
    """The call's metadata: the value-check mode, the scalars (exact Python types: the caller checked),
    and ``_meta`` of every tensor argument in order; None when one of them has none (not a tensor, no
    strides: ``validate`` names it)."""
    try:
        return mode, eps, rope_dim, rope_style, swa_page_size, *map(_meta, tensors)
    except (AttributeError, RuntimeError, TypeError):
        return None


class Plan:
    """One validated call signature's launch: the kernel compiled for it on its grid (Triton's runner,
    which reads the current stream per call), and every non-tensor argument; a call fills in its
    tensors (``pointer_args``) and fresh outputs."""

    __slots__ = ("runner", "template", "device_checked", "q_meta", "kv_meta")

    def __init__(self, compiled, grid, args, *, device_checked, q_meta, kv_meta):
        self.runner = compiled[grid]
        # signature order; no tensor of the call that made it (it would keep them alive): each call's own
        self.template = {n: None if n in _POINTER_SET else v for n, v in {**ALL_ARGS, **args}.items()}
        self.device_checked, self.q_meta, self.kv_meta = device_checked, q_meta, kv_meta

    def __call__(self, q, kv, kv_norm_weight, q_norm_weight, cos, sin, positions, ring, loc, q_out, swa_cache):
        if q_out is None:
            shape, dtype, device = self.q_meta
            q_out = torch.empty(shape, dtype=dtype, device=device)
        shape, dtype, device = self.kv_meta
        kv_out = torch.empty(shape, dtype=dtype, device=device)
        flags = device_checks.record(device) if self.device_checked else None
        args = {**self.template, **pointer_args(q_out=q_out, kv_out=kv_out, q=q, kv=kv, kv_norm_weight=kv_norm_weight,
                                                  q_norm_weight=q_norm_weight, cos=cos, sin=sin, positions=positions,
                                                  ring=ring, loc=loc, swa_cache=swa_cache, flags=flags)}
        self.runner(*args.values())
        return q_out, kv_out
