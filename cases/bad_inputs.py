"""Bad inputs for every op's public entry points: hypothesis strategies that take a valid case and
break it one way at a time, a worker subprocess that makes each call, and the report.

Entry points (``TARGETS``), each called the way the runners call it (the op's step keyword
arguments, ``cases/<op>.py::build_inputs``):
  qk_norm_rope      reference.qk_norm_rope:{qk_norm_rope_step, qk_norm_rope}, fused.qk_norm_rope: the same
  mla_fp8_prepare   reference.mla_fp8_prepare:{mla_fp8_prepare_step, mla_fp8_prepare}, fused: the same
  verify_attention  reference.verify_attention:{verify_attention, verify_attention_sdpa},
                    fused.verify_attention:{verify_attention, verify_split_kv, verify_shared_kv}
The launch-level helpers (``q_norm_rope``, ``cast_fp8``, ``prefix_split_partials`` ...), the oracles
and the pure gates take arguments their entry point has validated: they are not called here.

A class (``CLASSES``, named ``<group>-<what>``) breaks one argument (or, for ``*`` classes, the
whole call) in one way, and states the one outcome it must have, per op:
  error   a typed error (``reference.checks.VerifyParityInputError``, of the class's subclass
          where it names one) whose message names the broken argument (and the bad value where
          the class says so), with every argument's bytes unchanged;
  answer  the answer of the op's reference chain on the legal equivalent input (``canon``; the
          input itself where the value is legal), by the harness's own checks
          (``harness.runners._check_outputs``: exact bytes, or finite + numeric against the fp64
          oracle with the chain's error as allowance; written rows and untouched rows), with no
          byte of a read-only argument, or outside a writable view, changed.
The expectation is the class's, never the implementation's: the reference and the fused entry
points of an op get the same one, so they must agree on what is legal. Only a kernel wrapper with
declared limits (``verify_split_kv`` / ``verify_shared_kv``: its ``can_handle`` and topk == 1;
fused ``mla_fp8_prepare``: ``covered`` and the device's fp8 formats) may refuse a legal input it
does not cover, with a typed error: that is its answer there.

The contract the classes hold the ops to, where the code left a choice: index tensors and tree
masks contiguous (a kernel reads them as ``ptr + i``; kv_indices always had to be); flags bools
(or ``numpy.bool_``), never a str or an int; integer knobs ints (or numpy integers), never a bool
or a float; float scalars real numbers (ints and numpy floats included), never a bool, str or
tensor, with a normal fp32 value; num_kv_splits bounded (10**4 is refused); meta tensors refused
with a DeviceError; no tokens (T = 0) legal where the op has no per-request structure (qk, mla).

Outcomes of one call (``OUTCOMES``): typed-error and correct are the good ones; crash (any
other exception), segfault (the worker died, or a CUDA fault), hang (past ``--timeout``), wrong
(a different answer, an answer where an error is due, or a write into a read-only argument),
partial-write (a rejected call changed bytes), refused (a typed error where an answer is due),
misnamed (a typed error not naming the argument or the value, or of another subclass).

Every call runs in a worker subprocess (``Worker``: one long-lived process, restarted after a
crash or a hang), so a segfault is a result, not a dead run. A failure prints one line that
reproduces it as printed.

    python -m cases.bad_inputs [--device cpu|cuda] [--classes NAME|GROUP ...] [--ops ...] [--examples N]
    python -m cases.bad_inputs --list
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import importlib
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from reference import checks
from reference.checks import VerifyParityInputError

ROOT = Path(__file__).resolve().parents[1]
OPS = ("qk_norm_rope", "mla_fp8_prepare", "verify_attention")
OUTCOMES = ("typed-error", "correct", "crash", "segfault", "hang", "wrong", "partial-write", "refused", "misnamed")
GOOD = ("typed-error", "correct")
FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
DEFAULT_TIMEOUT_S = 60.0


# ----------------------------------------------------------------------------- arguments

@dataclass(frozen=True)
class Arg:
    """One argument of an op's public call, as the classes see it."""
    name: str
    # data (read-only activations / KV pools) | param (weights) | table (cos, sin) | buffer (written pool)
    # | out (caller-provided output) | index (read indices) | slots (write slots, negative = padding)
    # | map (slot_map) | indptr | float | int | bool | enum
    kind: str
    layout: str = ""  # tensors: rows (unit innermost stride, any row strides) | contiguous | any
    needs: tuple[tuple[str, Any], ...] = ()  # case fields under which the call passes and reads it


DECODE = (("mode", "decode"),)
ARGS: dict[str, tuple[Arg, ...]] = {
    "qk_norm_rope": (
        Arg("q", "data", "rows"), Arg("kv", "data", "rows"),
        Arg("kv_norm_weight", "param", "contiguous"),
        Arg("q_norm_weight", "param", "contiguous", (("q_weight", True),)),
        Arg("cos", "table", "contiguous"), Arg("sin", "table", "contiguous"),
        Arg("positions", "index"),
        Arg("ring", "buffer", "contiguous", DECODE), Arg("loc", "slots", "", DECODE),
        Arg("q_out", "out", "contiguous", (("q_out", "provided"),)),
        Arg("eps", "float"), Arg("rope_dim", "int"), Arg("rope_style", "enum"), Arg("forward_mode", "enum"),
    ),
    "mla_fp8_prepare": (
        Arg("q_nope", "data", "any"), Arg("q_rope", "data", "any"),
        Arg("k_nope", "data", "any"), Arg("k_rope", "data", "any"),
        Arg("kv_buffer", "buffer", "any"),
        Arg("out_cache_loc", "slots"), Arg("slot_map", "map", "", (("pool", "translated"),)),
        Arg("decode_kernel_loc", "slots", "", (("capture_loc", True),)),
        Arg("kv_descale", "float"), Arg("fp8_policy", "enum"),
        Arg("save_kv_cache", "bool"), Arg("fused_switch", "bool"),
    ),
    "verify_attention": (
        Arg("q", "data", "rows"), Arg("k", "data", "rows"), Arg("v", "data", "rows"),
        Arg("k_buffer", "data", "rows"), Arg("v_buffer", "data", "rows"),
        Arg("qo_indptr", "indptr"), Arg("kv_indptr", "indptr"), Arg("kv_indices", "index"),
        Arg("o", "out", "contiguous"),
        Arg("sm_scale", "float"), Arg("k_scale", "float"), Arg("v_scale", "float"),
        Arg("num_kv_splits", "int"), Arg("topk", "int"),
        Arg("is_causal", "bool"), Arg("splitkv_switch", "bool"), Arg("model_family", "enum"),
    ),
}
TENSOR_KINDS = ("data", "param", "table", "buffer", "out", "index", "slots", "map", "indptr")
INDEX_KINDS = ("index", "slots", "map", "indptr")
FLOAT_DATA_KINDS = ("data", "param", "table", "buffer", "out")


def arg(op: str, name: str) -> Arg:
    return next(a for a in ARGS[op] if a.name == name)


def args_of(op: str, *kinds: str, layout: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
            only: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(a.name for a in ARGS[op] if a.kind in kinds and (not layout or a.layout in layout)
                 and a.name not in exclude and (not only or a.name in only))


# ----------------------------------------------------------------------------- targets

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

        return c.cases(max_tokens=6, max_heads=3, head_dims=(64, 128), rope_dims=(16, 32, 64), max_positions=64)
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


# ----------------------------------------------------------------------------- tensor surgery

def _junk(dtype: torch.dtype, kind: str):
    """A junk value of ``kind`` (nan | huge | negative) that ``dtype`` holds."""
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point:
        if kind == "nan":
            return float("nan")
        big = float(torch.finfo(dtype).max)
        return -big if kind == "negative" else big
    big = 2 ** 30 if torch.iinfo(dtype).bits <= 32 else 2 ** 40
    if torch.iinfo(dtype).bits < 32:
        big = torch.iinfo(dtype).max // 2
    return -big if kind == "negative" and torch.iinfo(dtype).min < 0 else big


def fill_(t: torch.Tensor, value) -> torch.Tensor:
    """``t.fill_(value)``; fp8 through its bytes (the code torch's CPU cast gives), which every CUDA build takes."""
    if t.dtype in FP8:
        code = torch.tensor([float(value)]).to(t.dtype).view(torch.uint8)[0]
        t.view(torch.uint8).fill_(int(code))
        return t
    return t.fill_(value)


def cat(ts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat``; fp8 through its bytes (cat of float8 is not on every CUDA build)."""
    if ts[0].dtype in FP8:
        return torch.cat([t.view(torch.uint8) for t in ts], dim).view(ts[0].dtype)
    return torch.cat(ts, dim)


def _filled(shape, like: torch.Tensor, junk: str) -> torch.Tensor:
    return fill_(torch.empty(shape, dtype=like.dtype, device=like.device), _junk(like.dtype, junk))


def rows_view(t: torch.Tensor, junk: str, pad: int = 3) -> torch.Tensor:
    """Same values, rows strided: the first ``n`` columns of a wider tensor whose other columns hold junk."""
    wide = _filled((*t.shape[:-1], t.shape[-1] + pad), t, junk)
    wide[..., : t.shape[-1]].copy_(t)
    return wide[..., : t.shape[-1]]


def interleaved_view(t: torch.Tensor, junk: str) -> torch.Tensor:
    """Same values, innermost stride 2: every other element of a twice-wide tensor, junk between
    (``stack([t, junk], -1)[..., 0]``)."""
    wide = _filled((*t.shape[:-1], 2 * t.shape[-1]), t, junk)
    wide[..., ::2].copy_(t)
    return wide[..., ::2]


def offset_view(t: torch.Tensor, junk: str, offset: int = 5) -> torch.Tensor:
    """Same values, contiguous, at a storage offset past ``offset`` junk elements."""
    big = _filled((t.numel() + offset,), t, junk)
    view = big[offset:].view(t.shape)
    view.copy_(t)
    return view


_NAN_BITS = {torch.bfloat16: (torch.int16, 0x7FC0), torch.float32: (torch.int32, 0x7FC00000),
             torch.float8_e4m3fn: (torch.uint8, 0x7F), torch.float8_e4m3fnuz: (torch.uint8, 0x80)}


def fill_rows_nan(t: torch.Tensor, rows: torch.Tensor) -> None:
    """Rows ``rows`` of ``t`` (any strides) set to the dtype's NaN, through an integer view."""
    if rows.numel():
        int_dtype, bits = _NAN_BITS[t.dtype]
        t.view(int_dtype).index_fill_(0, rows.to(t.device), bits)


def _elem(t: torch.Tensor, at: float) -> tuple[int, ...]:
    """The element at fraction ``at`` of ``t`` in row-major order."""
    i = min(int(at * t.numel()), t.numel() - 1)
    return tuple(int(x) for x in np.unravel_index(i, tuple(t.shape)))


# ----------------------------------------------------------------------------- classes

@dataclass(frozen=True)
class BadClass:
    """One way to break one argument (or the whole call, ``*``), and the one outcome it must have.

    ``apply(kw, arg, p, ctx)`` breaks a fresh copy of the valid keyword arguments in place;
    ``canon`` (answer classes) turns another copy into the legal equivalent (None: the broken
    input is itself legal); ``prepare(op, arg, case, p)`` sets the case fields the break needs to
    bite; ``names(op, arg)`` the arguments a typed error may name; ``value(p)`` a text its message
    must hold."""
    name: str
    doc: str
    expect: str | dict  # "error" | "answer", or {op: one of them} where the ops' contracts differ
    args: Callable[[str], tuple[str, ...]]
    apply: Callable
    params: Callable[[str, str], st.SearchStrategy] = lambda op, a: st.just({})
    prepare: Callable = lambda op, a, case, p: case
    canon: Callable | None = None
    names: Callable[[str, str], tuple[str, ...]] | None = None
    value: Callable[[dict], str] | None = None
    error: type = VerifyParityInputError
    on_device: Callable = lambda device: True  # runs on this device at all (a second GPU, ...)

    @property
    def group(self) -> str:
        return self.name.split("-", 1)[0]

    def expected(self, op: str) -> str:
        return self.expect if isinstance(self.expect, str) else self.expect[op]


@dataclass
class Ctx:
    op: str
    case: Any
    device: Any  # harness.devices.Device

    @property
    def dev(self) -> torch.device:
        return self.device.torch_device


def _replace(case, **fields):
    return dataclasses.replace(case, **{k: v for k, v in fields.items() if hasattr(case, k)})


def _tokens(case, n: int = 2):
    """At least ``n`` tokens (and index entries): qk/mla T, verify B·L and a prefix of n keys."""
    if hasattr(case, "prefix"):
        kind, k = case.prefix.split(":")
        return dataclasses.replace(case, prefix=f"const:{max(n, int(k))}")
    return dataclasses.replace(case, T=max(case.T, n))


def _two_rows(op, a, case, p):
    """At least two rows in every tensor (a view of one row is contiguous whatever its strides, and
    a value in the only row leaves nothing finite to measure): two tokens, positions, prefix keys."""
    if op == "verify_attention":
        return _tokens(dataclasses.replace(case, L=max(2, case.L)))
    return _replace(_tokens(case), max_pos=max(2, getattr(case, "max_pos", 2)))


def _set(kw, a, fn):
    kw[a] = fn(kw[a])


def _junks(*kinds):
    return lambda op, a: st.sampled_from(kinds).map(lambda j: {"junk": j})


def _index_high(op: str, a: str, kw: dict) -> int:
    """One past the largest legal entry of index argument ``a``."""
    if a == "positions":
        return kw["cos"].shape[0]
    if a == "loc":
        return kw["ring"].shape[0]
    if a == "kv_indices":
        return kw["k_buffer"].shape[0]
    if a == "out_cache_loc":
        return kw["kv_buffer"].shape[0] if kw["slot_map"] is None else kw["slot_map"].shape[0]
    return kw["kv_buffer"].shape[0]  # slot_map, decode_kernel_loc


def _first_real(t: torch.Tensor, k: int = 0) -> int:
    """Position of the k-th non-negative entry (padding entries are negative)."""
    return int(torch.nonzero(t.cpu() >= 0).flatten()[k])


def _prefix_swap_away_slot0(kw):
    """kv_indices never read pool row 0 (SGLang's reserved padding slot): swap it for an unread row."""
    idx, n = kw["kv_indices"], int(kw["kv_indptr"][-1])
    used = set(idx[:n].tolist())
    if 0 in used:
        free = next(r for r in range(1, kw["k_buffer"].shape[0]) if r not in used)
        idx[idx == 0] = free


def _unread_rows(kw) -> torch.Tensor:
    n = int(kw["kv_indptr"][-1])
    keep = torch.ones(kw["k_buffer"].shape[0], dtype=torch.bool)
    keep[kw["kv_indices"][:n].long().cpu()] = False
    return torch.nonzero(keep).flatten()


def _nan_unread(kw, a, p, ctx):
    if ctx.op == "verify_attention":
        _prefix_swap_away_slot0(kw)
        rows = _unread_rows(kw)
        fill_rows_nan(kw["k_buffer"], rows)
        if kw["v_buffer"].untyped_storage().data_ptr() != kw["k_buffer"].untyped_storage().data_ptr():
            fill_rows_nan(kw["v_buffer"], rows)
        return
    if ctx.op == "qk_norm_rope":
        used = kw["positions"].long().cpu() if a in ("cos", "sin") else kw["loc"].long().cpu()
        size = kw[a].shape[0]
    else:
        phys = kw["decode_kernel_loc"] if kw["decode_kernel_loc"] is not None else kw["out_cache_loc"]
        used, size = phys.long().cpu(), kw["kv_buffer"].shape[0]
        if kw["slot_map"] is not None and kw["decode_kernel_loc"] is None:
            used = torch.where(used >= 0, kw["slot_map"].cpu().long()[used.clamp(min=0)], -1)
    keep = torch.ones(size, dtype=torch.bool)
    keep[used[used >= 0]] = False
    fill_rows_nan(kw[a], torch.nonzero(keep).flatten())


def _value_at(kind: str):
    """Value classes: one element (nan, inf) or one row (subnormal, huge) of a data tensor."""
    def apply(kw, a, p, ctx):
        t = kw[a]
        if a in ("cos", "sin"):  # a row the positions read
            rows = (int(kw["positions"][_first_real(kw["positions"])]),)
        elif a in ("k_buffer", "v_buffer"):  # a pool row the prefix reads
            rows = (int(kw["kv_indices"][0]),)
        else:
            rows = (min(int(p["at"] * t.shape[0]), t.shape[0] - 1),)
        if kind in ("nan", "inf"):
            sub = t[rows]
            idx = rows + _elem(sub, p["at"])
            val = float("nan") if kind == "nan" else p["sign"] * float("inf")
            fill_(t[idx], val)
            return
        if kind == "subnormal":  # bf16: 2^-3 of the smallest normal; fp8: 2^-9
            val = p["sign"] * (torch.finfo(t.dtype).tiny / 8 if t.dtype not in FP8 else 2.0 ** -9)
        else:
            big = {"mla_fp8_prepare": float(torch.finfo(t.dtype).max)}.get(ctx.op, 1e15)
            val = p["sign"] * (float(torch.finfo(t.dtype).max) if t.dtype in FP8 else big)
        fill_(t[rows], val)
    return apply


def _nan_masked_key(kw, a, p, ctx):
    """k of the last draft of request 0 gets a NaN in its last dim (the rope part under MLA, where
    v is k's first Dv dims; under GQA v is its own tensor)."""
    last = int(kw["qo_indptr"][1]) - 1
    fill_(kw["k"][last, 0, -1], float("nan"))


def _value_args(op: str, kind: str) -> tuple[str, ...]:
    if op == "qk_norm_rope":
        return ("q", "kv") if kind in ("subnormal", "huge") else args_of(op, "data", "param", "table")
    if op == "mla_fp8_prepare":
        return args_of(op, "data")
    if kind == "inf":  # inf in v meets 0 weights (0·inf): its NaN placement is the product's order
        return ("q", "k", "k_buffer")
    return args_of(op, "data")


def _values_params(op, a):
    return st.fixed_dictionaries({"at": st.floats(0, 1), "sign": st.sampled_from((1.0, -1.0))})


def _swap_fp8(dtype):
    return torch.float8_e4m3fnuz if dtype == torch.float8_e4m3fn else torch.float8_e4m3fn


def _scalar_value(kw, a):
    v = kw[a]
    return 0.5 if v is None else v


def _meta_one(kw, a, p, ctx):
    kw[a] = kw[a].to("meta")


def _meta_all(kw, a, p, ctx):
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            kw[k] = v.to("meta")


def _tensor_args(op):
    return tuple(a.name for a in ARGS[op] if a.kind in TENSOR_KINDS)


def _t0(kw, a, p, ctx):
    if ctx.op == "verify_attention":
        for k in ("q", "k", "v"):
            kw[k] = kw[k][:0]
        kw["qo_indptr"] = torch.zeros_like(kw["qo_indptr"])
        return
    per_token = ("q", "kv", "positions", "loc", "q_out") if ctx.op == "qk_norm_rope" else \
        ("q_nope", "q_rope", "k_nope", "k_rope", "out_cache_loc", "decode_kernel_loc")
    for k in per_token:
        if kw.get(k) is not None:
            kw[k] = kw[k][:0]


def _all_padding(kw, a, p, ctx):
    for k in (("loc",) if ctx.op == "qk_norm_rope" else ("out_cache_loc", "decode_kernel_loc")):
        if kw.get(k) is not None:
            kw[k] = torch.full_like(kw[k], -1)


def _head_dim0(kw, a, p, ctx):
    T, H = kw["q_nope"].shape[:2]
    dev, bf = ctx.dev, torch.bfloat16
    if p["which"] == "Dn":
        kw["q_nope"], kw["k_nope"] = torch.zeros(T, H, 0, dtype=bf, device=dev), torch.zeros(T, 0, dtype=bf, device=dev)
        kw["kv_buffer"] = kw["kv_buffer"][:, -kw["k_rope"].shape[-1]:].contiguous()
    else:
        kw["q_rope"], kw["k_rope"] = torch.zeros(T, H, 0, dtype=bf, device=dev), torch.zeros(T, 0, dtype=bf, device=dev)
        kw["kv_buffer"] = kw["kv_buffer"][:, : kw["k_nope"].shape[-1]].contiguous()


def _gqa_indivisible(kw, a, p, ctx):
    H = kw["q"].shape[1]
    for k in ("k", "v", "k_buffer", "v_buffer"):
        kw[k] = cat([kw[k][:, :1]] * (H + 1), 1)


def _v_wider(kw, a, p, ctx):
    """v and v_buffer 16 dims wider than head_dim (zeros appended)."""
    extra = kw["q"].shape[-1] + 16 - kw["v"].shape[-1]
    for k in ("v", "v_buffer"):
        kw[k] = cat([kw[k], fill_(kw[k].new_empty(*kw[k].shape[:-1], extra), 0.0)], -1)


def _identity_tree(kw, a, p, ctx):
    """topk 2 and a tree mask in which every draft sees only itself (never the causal mask)."""
    qo = kw["qo_indptr"].tolist()
    kw["topk"] = 2
    kw["custom_mask"] = torch.cat([torch.eye(qo[b + 1] - qo[b], dtype=torch.bool).flatten()
                                   for b in range(len(qo) - 1)]).to(ctx.dev)


def _tree_then(fn):
    def apply(kw, a, p, ctx):
        _identity_tree(kw, a, p, ctx)
        fn(kw)
    return apply


def _dup_write(kw, a, p, ctx):
    t = kw[a].clone()
    if a == "slot_map":
        t[2] = t[1]
    else:
        i, j = _first_real(t, 0), _first_real(t, 1)
        t[j] = t[i]
    kw[a] = t


def _dup_read(kw, a, p, ctx):
    t = kw[a].clone()
    t[1] = t[0]
    kw[a] = t


def _entry(kind: str):
    """An entry of an index argument set to -1 (negative), its bound (past-end) or a huge value."""
    def apply(kw, a, p, ctx):
        t = kw[a].clone()
        i = _first_real(t) if t.numel() else 0
        if kind == "negative":
            v = -1
        elif kind == "past-end":
            v = _index_high(ctx.op, a, kw)
        else:
            v = torch.iinfo(t.dtype).max if t.dtype == torch.int32 else 2 ** 40
        t[i] = v
        kw[a] = t
        p["_value"] = str(v)
    return apply


def _padding_junk(kw, a, p, ctx):
    t = kw[a].clone()
    t[t < 0] = torch.iinfo(t.dtype).min
    kw[a] = t


def _real_entry(op, a, case, p):
    """Two tokens, at least one of them not padding (an entry to break)."""
    case = _tokens(case)
    return _replace(case, padding=min(getattr(case, "padding", 0), case.T - 1)) if hasattr(case, "T") else case


def _padding_prepare(op, a, case, p):
    return _replace(_tokens(case), padding=max(1, case.padding))


def _indptr_non_monotone(kw, a, p, ctx):
    t = kw[a].clone()
    t[1] = t[2] + 1
    kw[a] = t


def _indptr_ends(kw, a, p, ctx):
    t = kw[a].clone()
    if p["end"] == "first":
        t[0] = 1
    else:
        t[-1] = (kw["q"].shape[0] if a == "qo_indptr" else kw["kv_indices"].shape[0]) + 1
    kw[a] = t


def _unused_tail(kw, a, p, ctx):
    t = kw["kv_indices"]
    kw["kv_indices"] = torch.cat([t, torch.full((3,), _junk(t.dtype, p["junk"]), dtype=t.dtype, device=t.device)])


def _provide_o(kw, ctx):
    q, v = kw["q"], kw["v"]
    kw["o"] = torch.full((q.shape[0], q.shape[1], v.shape[2]), float("nan"), dtype=q.dtype, device=q.device)


def _foreign_format(kw, a, p, ctx):
    """The KV buffers in the other fp8 format: mla's pool reinterpreted (stale bytes), verify's values converted."""
    if ctx.op == "mla_fp8_prepare":
        kw["kv_buffer"] = kw["kv_buffer"].view(_swap_fp8(kw["kv_buffer"].dtype))
        return
    other = _swap_fp8(kw["k_buffer"].dtype)
    kb = kw["k_buffer"].float().to(other)
    kw["v_buffer"] = kb[..., : kw["v_buffer"].shape[-1]] if ctx.case.layout == "mla" else \
        kw["v_buffer"].float().to(other)
    kw["k_buffer"] = kb


def _devices_second(device) -> bool:
    return not device.interpreted and torch.cuda.device_count() >= 2


def _other_device(kw, a, p, ctx):
    kw[a] = kw[a].to("cpu" if p["where"] == "cpu" else "cuda:1")


FLOATS = (torch.float32, torch.float16, torch.float64, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
ALLOWED = {  # (op, arg) -> dtypes its contract takes; every other tensor argument: bf16
    ("qk_norm_rope", "kv_norm_weight"): (torch.bfloat16, torch.float32),
    ("qk_norm_rope", "q_norm_weight"): (torch.bfloat16, torch.float32),
    ("qk_norm_rope", "cos"): (torch.float32,), ("qk_norm_rope", "sin"): (torch.float32,),
    ("mla_fp8_prepare", "kv_buffer"): FP8,
    ("verify_attention", "k_buffer"): (torch.bfloat16, *FP8), ("verify_attention", "v_buffer"): (torch.bfloat16, *FP8),
}


def _wrong_float(op, a):
    allowed = ALLOWED.get((op, a), (torch.bfloat16,))
    return st.sampled_from([str(d).removeprefix("torch.") for d in FLOATS if d not in allowed]).map(
        lambda d: {"dtype": d})


def _to_dtype(kw, a, p, ctx):
    kw[a] = kw[a].to(getattr(torch, p["dtype"]))


_E = "error"
_A = "answer"
_any_tensor = _tensor_args


def _c(name, doc, expect, args, apply, **kw):
    return BadClass(name, doc, expect, args, apply, **kw)


CLASSES: dict[str, BadClass] = {c.name: c for c in (
    # ------------------------------------------------------------------ strides
    _c("stride-rows", "rows strided (a slice of a wider tensor whose other columns hold NaN or huge junk), "
       "unit innermost stride: the layout the contract takes", _A,
       lambda op: tuple(a.name for a in ARGS[op] if a.kind in ("data", "buffer") and a.layout in ("rows", "any")),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: rows_view(t, p["junk"])), params=_junks("nan", "huge"), prepare=_two_rows),
    _c("stride-inner", "innermost stride 2 (every other element of an interleaved tensor, junk between): qk and "
       "verify take a unit innermost stride only; mla's contract takes any strides", {
           "qk_norm_rope": _E, "verify_attention": _E, "mla_fp8_prepare": _A},
       lambda op: tuple(a.name for a in ARGS[op] if a.kind in ("data", "buffer") and a.layout in ("rows", "any")),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: interleaved_view(t, p["junk"])), params=_junks("nan", "huge"),
       error=checks.LayoutError, prepare=_two_rows),
    _c("stride-contiguous-only", "a non-contiguous view (rows strided, or interleaved for 1-D) of a tensor the "
       "contract wants contiguous: weights, rope tables, the ring, caller-provided outputs", _E,
       lambda op: args_of(op, "param", "table", "buffer", "out", layout=("contiguous",)),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: interleaved_view(t, p["junk"]) if t.dim() == 1
                                  else rows_view(t, p["junk"])), params=_junks("nan", "huge"),
       error=checks.LayoutError, prepare=_two_rows),
    _c("stride-index", "an index tensor as a non-contiguous view (stack([t, junk], -1)[..., 0], junk huge or "
       "negative): index tensors must be contiguous, as kv_indices already is", _E,
       lambda op: args_of(op, *INDEX_KINDS), lambda kw, a, p, ctx: _set(kw, a, lambda t: interleaved_view(t, p["junk"])),
       params=_junks("huge", "negative"), prepare=_two_rows, error=checks.LayoutError),
    _c("stride-offset", "every tensor argument may sit at a storage offset (contiguous, after junk elements)", _A,
       _any_tensor, lambda kw, a, p, ctx: _set(kw, a, lambda t: offset_view(t, p["junk"])),
       params=lambda op, a: st.sampled_from(("nan", "huge") if arg(op, a).kind in FLOAT_DATA_KINDS
                                            else ("huge", "negative")).map(lambda j: {"junk": j}),
       prepare=_two_rows),
    # ------------------------------------------------------------------ dtypes
    _c("dtype-wrong-float", "a float dtype the argument does not take (fp32 / fp16 / fp64 / bf16 / fp8 e4m3fn / "
       "e5m2 where another is due)", _E, lambda op: args_of(op, *FLOAT_DATA_KINDS), _to_dtype, params=_wrong_float,
       error=checks.DTypeError),
    _c("dtype-int-for-float", "an int32 tensor for a float one", _E, lambda op: args_of(op, *FLOAT_DATA_KINDS),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.float().nan_to_num().clamp(-1e6, 1e6).to(torch.int32)),
       error=checks.DTypeError),
    _c("dtype-float-for-int", "a float32 index tensor", _E, lambda op: args_of(op, *INDEX_KINDS),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.float()), error=checks.DTypeError),
    _c("dtype-narrow-index", "an index tensor as int16, uint8 or bool", _E, lambda op: args_of(op, *INDEX_KINDS),
       _to_dtype, params=lambda op, a: st.sampled_from(("int16", "uint8", "bool")).map(lambda d: {"dtype": d}),
       error=checks.DTypeError),
    _c("dtype-fp8-foreign-format", "the KV buffers in the other fp8 e4m3 format (e4m3fnuz on NVIDIA, e4m3fn on "
       "gfx942; either on the CPU): legal; a kernel that has no conversion for it refuses with a typed error", _A,
       lambda op: ("*",) if op != "qk_norm_rope" else (), _foreign_format,
       prepare=lambda op, a, case, p: _replace(case, kv_dtype="e4m3fn") if op == "verify_attention" and
       case.kv_dtype == "bf16" else case, names=lambda op, a: ("kv_buffer", "k_buffer", "v_buffer")),
    _c("dtype-fp8-mixed", "k_buffer and v_buffer in different fp8 formats", _E,
       lambda op: ("v_buffer",) if op == "verify_attention" else (),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.view(_swap_fp8(t.dtype))),
       prepare=lambda op, a, case, p: _replace(case, kv_dtype="e4m3fn" if case.kv_dtype == "bf16" else case.kv_dtype),
       error=checks.DTypeError),
    # ------------------------------------------------------------------ ranks and shapes
    _c("rank-extra-dim", "a leading axis of size 1 added", _E, _any_tensor,
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.unsqueeze(0)), error=checks.RankError),
    _c("rank-missing-dim", "the last two axes flattened into one", _E,
       lambda op: tuple(a for a in _tensor_args(op) if a not in ("positions", "loc", "out_cache_loc", "slot_map",
                                                                 "decode_kernel_loc", "qo_indptr", "kv_indptr",
                                                                 "kv_indices", "kv_norm_weight", "q_norm_weight")),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.flatten(-2)), error=checks.RankError),
    _c("rank-0d", "a 0-d tensor for a tensor argument", _E, _any_tensor,
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.reshape(-1)[0].clone()), error=checks.RankError),
    _c("shape-token-mismatch", "one more token row than the other per-token arguments", _E,
       lambda op: {"qk_norm_rope": ("kv", "positions", "loc", "q_out"),
                   "mla_fp8_prepare": ("q_rope", "k_nope", "k_rope", "out_cache_loc", "decode_kernel_loc"),
                   "verify_attention": ("k", "v", "o")}[op],
       lambda kw, a, p, ctx: _set(kw, a, lambda t: cat([t, t[:1]], 0)),
       names=lambda op, a: (a, *{"mla_fp8_prepare": ("q_nope", "out_cache_loc", "decode_kernel_loc")}.get(op, ()))),
    _c("shape-head-mismatch", "one more head than the other arguments have", _E,
       lambda op: {"qk_norm_rope": ("q_out",), "mla_fp8_prepare": ("q_rope",),
                   "verify_attention": ("v", "k_buffer", "v_buffer", "o")}[op],
       lambda kw, a, p, ctx: _set(kw, a, lambda t: cat([t, t[:, :1]], 1))),
    _c("shape-dim-mismatch", "one more element on the last axis than the other arguments have", _E,
       lambda op: {"qk_norm_rope": ("kv", "kv_norm_weight", "q_norm_weight", "cos", "sin", "ring", "q_out"),
                   "mla_fp8_prepare": ("k_nope", "k_rope", "kv_buffer"),
                   "verify_attention": ("k", "k_buffer", "v_buffer", "o")}[op],
       lambda kw, a, p, ctx: _set(kw, a, lambda t: cat([t, t[..., :1]], -1))),
    _c("shape-gqa-indivisible", "num_heads not a multiple of num_kv_heads (H + 1 KV heads)", _E,
       lambda op: ("*",) if op == "verify_attention" else (), _gqa_indivisible, names=lambda op, a: ("k",)),
    _c("shape-v-wider", "v_head_dim larger than head_dim", _E, lambda op: ("*",) if op == "verify_attention" else (),
       _v_wider, names=lambda op, a: ("v",)),
    # ------------------------------------------------------------------ sizes
    _c("size-t0", "no tokens: legal for qk and mla (empty outputs, nothing written); verify needs a draft token "
       "per request", {"qk_norm_rope": _A, "mla_fp8_prepare": _A, "verify_attention": _E}, lambda op: ("*",), _t0,
       names=lambda op, a: ("qo_indptr",)),
    _c("size-b0", "no requests (qo_indptr of one entry)", _E, lambda op: ("*",) if op == "verify_attention" else (),
       lambda kw, a, p, ctx: kw.update(q=kw["q"][:0], k=kw["k"][:0], v=kw["v"][:0], qo_indptr=kw["qo_indptr"][:1],
                                       kv_indptr=kw["kv_indptr"][:1]), names=lambda op, a: ("qo_indptr",)),
    _c("size-empty-prefix", "every request with an empty prefix (kv_indptr all zero): legal", _A,
       lambda op: ("*",) if op == "verify_attention" else (),
       lambda kw, a, p, ctx: kw.update(kv_indptr=torch.zeros_like(kw["kv_indptr"]))),
    _c("size-all-padding", "every write slot padding (-1): legal, nothing written", _A,
       lambda op: ("*",) if op != "verify_attention" else (), _all_padding,
       prepare=lambda op, a, case, p: _replace(case, mode="decode")),
    _c("size-head-dim-0", "an empty head dim (Dn = 0 or R = 0)", _E,
       lambda op: ("*",) if op == "mla_fp8_prepare" else (), _head_dim0,
       params=lambda op, a: st.sampled_from(("Dn", "R")).map(lambda w: {"which": w}),
       names=lambda op, a: ("q_nope", "q_rope")),
    # ------------------------------------------------------------------ values in tensors
    _c("value-nan-data", "a NaN in an input tensor (an element the op reads): propagates as the oracle says", _A,
       lambda op: _value_args(op, "nan"), _value_at("nan"), params=_values_params, prepare=_two_rows),
    _c("value-inf-data", "a ±Inf in an input tensor", _A, lambda op: _value_args(op, "inf"), _value_at("inf"),
       params=_values_params, prepare=_two_rows),
    _c("value-subnormal-data", "a row of subnormals", _A, lambda op: _value_args(op, "subnormal"),
       _value_at("subnormal"), params=_values_params, prepare=_two_rows),
    _c("value-huge-data", "a row of huge values (bf16 max for mla's casts, 1e15 where fp32 sums of squares and "
       "scores must stay finite, the fp8 max in fp8 pools)", _A, lambda op: _value_args(op, "huge"),
       _value_at("huge"), params=_values_params, prepare=_two_rows),
    _c("value-nan-masked-key", "NaN in the score of a draft key the causal mask hides from every draft but the last "
       "(a dim of k that v does not share): only the last draft's output is NaN", _A,
       lambda op: ("k",) if op == "verify_attention" else (), _nan_masked_key,
       prepare=lambda op, a, case, p: _replace(case, L=max(2, case.L), is_causal=True)),
    _c("value-nan-unread", "NaN in every row a call must not read (rope-table rows off the positions, pool rows "
       "off the prefix: slot 0 included, ring / KV rows it does not write)", _A,
       lambda op: {"qk_norm_rope": ("cos", "sin", "ring"), "mla_fp8_prepare": ("kv_buffer",),
                   "verify_attention": ("k_buffer",)}[op], _nan_unread,
       prepare=lambda op, a, case, p: _replace(case, B=max(2, getattr(case, "B", 1)), prefix="mixed:6")
       if op == "verify_attention" else case,
       canon=lambda kw, a, p, ctx: _prefix_swap_away_slot0(kw) if ctx.op == "verify_attention" else None),
    # ------------------------------------------------------------------ scalars
    _c("value-nan-scale", "NaN for a float scalar (eps, kv_descale, sm_scale, k_scale, v_scale)", _E,
       lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: float("nan")}), value=lambda p: "nan"),
    _c("value-inf-scale", "+Inf for a float scalar (eps=inf included)", _E, lambda op: args_of(op, "float"),
       lambda kw, a, p, ctx: kw.update({a: float("inf")}), value=lambda p: "inf"),
    _c("value-negative-scale", "a negative float scalar", _E, lambda op: args_of(op, "float"),
       lambda kw, a, p, ctx: kw.update({a: -0.5}), value=lambda p: "-0.5"),
    _c("value-zero-scale", "0.0 for a float scalar", _E, lambda op: args_of(op, "float"),
       lambda kw, a, p, ctx: kw.update({a: 0.0}), value=lambda p: "0.0"),
    _c("value-subnormal-scale", "a float scalar subnormal in fp32, the dtype it is applied in (a GPU may flush it "
       "to 0; kv_descale's reciprocal overflows)", _E, lambda op: args_of(op, "float"),
       lambda kw, a, p, ctx: kw.update({a: p["v"]}), params=lambda op, a: st.sampled_from((1e-40, 3e-39)).map(
           lambda v: {"v": v}), value=lambda p: repr(p["v"])),
    _c("value-scale-past-fp32", "a float scalar finite as a Python float, infinite in fp32 (1e39)", _E,
       lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: 1e39}), value=lambda p: "1e+39"),
    # ------------------------------------------------------------------ index ranges
    _c("index-negative", "a negative entry where negative is not padding", _E,
       lambda op: args_of(op, "index", "map"), _entry("negative"), prepare=_real_entry,
       value=lambda p: p["_value"]),
    _c("index-past-end", "an entry one past the table / pool", _E, lambda op: args_of(op, "index", "slots", "map"),
       _entry("past-end"), prepare=_real_entry, value=lambda p: p["_value"]),
    _c("index-huge", "an entry near the index dtype's max (2**31 - 1, 2**40)", _E,
       lambda op: args_of(op, "index", "slots", "map"), _entry("huge"), prepare=_real_entry,
       value=lambda p: p["_value"]),
    _c("index-duplicate-writes", "two tokens write the same slot", _E, lambda op: args_of(op, "slots", "map"),
       _dup_write, prepare=lambda op, a, case, p: _replace(_tokens(case), padding=0), error=checks.RangeError),
    _c("index-duplicate-reads", "two tokens read the same position / pool row: legal", _A,
       lambda op: args_of(op, "index"), _dup_read, prepare=lambda op, a, case, p: _tokens(case)),
    _c("index-padding-junk", "padding write slots as the dtype's most negative value instead of -1: legal", _A,
       lambda op: args_of(op, "slots"), _padding_junk, prepare=_padding_prepare,
       canon=lambda kw, a, p, ctx: _set(kw, a, lambda t: torch.where(t < 0, torch.full_like(t, -1), t))),
    _c("index-unused-tail", "kv_indices longer than kv_indptr[-1], the unused tail junk: legal", _A,
       lambda op: ("kv_indices",) if op == "verify_attention" else (), _unused_tail,
       params=_junks("huge", "negative"), canon=lambda kw, a, p, ctx: None),
    _c("index-indptr-non-monotone", "an indptr that falls", _E, lambda op: args_of(op, "indptr"),
       _indptr_non_monotone, prepare=lambda op, a, case, p: _replace(case, B=max(2, getattr(case, "B", 1)))),
    _c("index-indptr-ends", "an indptr not starting at 0 or ending past the tokens / indices", _E,
       lambda op: args_of(op, "indptr"), _indptr_ends,
       params=lambda op, a: st.sampled_from(("first", "last")).map(lambda e: {"end": e})),
    # ------------------------------------------------------------------ Python types
    _c("pytype-str-bool", "'False' for a bool (a truthy str)", _E, lambda op: args_of(op, "bool"),
       lambda kw, a, p, ctx: kw.update({a: "False"}), value=lambda p: "False"),
    _c("pytype-int-bool", "0 or 1 for a bool", _E, lambda op: args_of(op, "bool"),
       lambda kw, a, p, ctx: kw.update({a: int(kw[a])})),
    _c("pytype-numpy-float64", "a numpy float64 for a float scalar (a Python float subclass): the same answer", _A,
       lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: np.float64(_scalar_value(kw, a))}),
       canon=lambda kw, a, p, ctx: kw.update({a: float(_scalar_value(kw, a))})),
    _c("pytype-numpy-float32", "a numpy float32 for a float scalar (a real number): the answer for its value", _A,
       lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: np.float32(_scalar_value(kw, a))}),
       canon=lambda kw, a, p, ctx: kw.update({a: float(np.float32(_scalar_value(kw, a)))})),
    _c("pytype-numpy-int", "a numpy int64 for an int: the same answer", _A, lambda op: args_of(op, "int"),
       lambda kw, a, p, ctx: kw.update({a: np.int64(kw[a])})),
    _c("pytype-numpy-bool", "a numpy bool_ for a bool: the same answer", _A, lambda op: args_of(op, "bool"),
       lambda kw, a, p, ctx: kw.update({a: np.bool_(kw[a])})),
    _c("pytype-tensor0d-float", "a 0-d tensor for a float scalar", _E, lambda op: args_of(op, "float"),
       lambda kw, a, p, ctx: kw.update({a: torch.tensor(_scalar_value(kw, a), device=ctx.dev)})),
    _c("pytype-float-for-int", "a float for an int (2.0)", _E, lambda op: args_of(op, "int"),
       lambda kw, a, p, ctx: kw.update({a: float(kw[a])})),
    _c("pytype-int-for-float", "an int for a float scalar (a real number): the answer for float(x)", _A,
       lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: 1}),
       canon=lambda kw, a, p, ctx: kw.update({a: 1.0})),
    _c("pytype-bool-for-float", "True for a float scalar", _E, lambda op: args_of(op, "float"),
       lambda kw, a, p, ctx: kw.update({a: True})),
    _c("pytype-str-for-float", "a str for a float scalar ('0.5')", _E, lambda op: args_of(op, "float"),
       lambda kw, a, p, ctx: kw.update({a: "0.5"})),
    _c("pytype-bool-for-int", "True for an int", _E, lambda op: args_of(op, "int"),
       lambda kw, a, p, ctx: kw.update({a: True})),
    _c("pytype-str-for-int", "a str for an int ('2')", _E, lambda op: args_of(op, "int"),
       lambda kw, a, p, ctx: kw.update({a: str(kw[a])})),
    _c("pytype-none-for-tensor", "None for a required tensor", _E,
       lambda op: args_of(op, *TENSOR_KINDS, exclude=("q_norm_weight", "slot_map", "decode_kernel_loc", "q_out", "o")),
       lambda kw, a, p, ctx: kw.update({a: None})),
    _c("pytype-list-for-tensor", "a Python list for a tensor", _E, _any_tensor,
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.float().tolist() if t.is_floating_point() else t.tolist())),
    # ------------------------------------------------------------------ enums and knobs
    _c("enum-bogus", "'bogus' for an enum string (forward_mode, rope_style, fp8_policy, model_family)", _E,
       lambda op: args_of(op, "enum"), lambda kw, a, p, ctx: kw.update({a: "bogus"}), value=lambda p: "bogus"),
    _c("enum-none", "None for an enum string", _E, lambda op: args_of(op, "enum"),
       lambda kw, a, p, ctx: kw.update({a: None}), value=lambda p: "None"),
    _c("knob-splits-huge", "an unbounded num_kv_splits (10**4, 2**16)", _E,
       lambda op: ("num_kv_splits",) if op == "verify_attention" else (),
       lambda kw, a, p, ctx: kw.update({a: p["v"]}),
       params=lambda op, a: st.sampled_from((10 ** 4, 2 ** 16)).map(lambda v: {"v": v}), value=lambda p: str(p["v"])),
    _c("knob-nonpositive", "0 or -1 for a count (num_kv_splits, topk, rope_dim)", _E, lambda op: args_of(op, "int"),
       lambda kw, a, p, ctx: kw.update({a: p["v"]}), params=lambda op, a: st.sampled_from((0, -1)).map(
           lambda v: {"v": v}), value=lambda p: str(p["v"])),
    _c("knob-rope-dim", "rope_dim odd, larger than head_dim, or not dividing it", _E,
       lambda op: ("rope_dim",) if op == "qk_norm_rope" else (),
       lambda kw, a, p, ctx: kw.update({a: {"odd": kw[a] - 1, "wide": 2 * kw["q"].shape[-1],
                                            "non-divisor": 3 * kw["q"].shape[-1] // 4 // 2 * 2 + 2}[p["how"]]}),
       params=lambda op, a: st.sampled_from(("odd", "wide", "non-divisor")).map(lambda h: {"how": h})),
    # ------------------------------------------------------------------ trees (topk > 1)
    _c("tree-topk2", "topk 2 with a tree mask: legal for the chain, the SDPA path and the dispatch (which must "
       "route it away from the kernels); the kernels read no tree mask and must refuse it", _A,
       lambda op: ("*",) if op == "verify_attention" else (), _identity_tree,
       prepare=lambda op, a, case, p: _replace(case, L=max(2, case.L), is_causal=True),
       names=lambda op, a: ("topk", "custom_mask")),
    _c("tree-mask-at-topk1", "a tree mask at topk 1", _E, lambda op: ("*",) if op == "verify_attention" else (),
       _tree_then(lambda kw: kw.update(topk=1)), prepare=lambda op, a, case, p: _replace(case, L=max(2, case.L)),
       names=lambda op, a: ("custom_mask", "topk")),
    _c("tree-topk2-no-mask", "topk 2 without a tree mask", _E, lambda op: ("*",) if op == "verify_attention" else (),
       lambda kw, a, p, ctx: kw.update(topk=2, custom_mask=None), names=lambda op, a: ("custom_mask", "topk")),
    _c("tree-mask-length", "a tree mask one element too long", _E,
       lambda op: ("*",) if op == "verify_attention" else (),
       _tree_then(lambda kw: kw.update(custom_mask=torch.cat([kw["custom_mask"], kw["custom_mask"][:1]]))),
       prepare=lambda op, a, case, p: _replace(case, L=max(2, case.L)), names=lambda op, a: ("custom_mask",)),
    _c("tree-mask-not-bool", "a uint8 tree mask", _E, lambda op: ("*",) if op == "verify_attention" else (),
       _tree_then(lambda kw: kw.update(custom_mask=kw["custom_mask"].to(torch.uint8))),
       prepare=lambda op, a, case, p: _replace(case, L=max(2, case.L)), names=lambda op, a: ("custom_mask",)),
    # ------------------------------------------------------------------ devices
    _c("device-meta-one", "one tensor on the meta device (no data)", _E, _any_tensor, _meta_one,
       error=checks.DeviceError),
    _c("device-meta-all", "every tensor on the meta device", _E, lambda op: ("*",), _meta_all,
       names=lambda op, a: _tensor_args(op), error=checks.DeviceError),
    _c("device-cpu-among-gpu", "one tensor on the CPU, the others on the GPU (GPU runs)", _E, _any_tensor,
       _other_device, params=lambda op, a: st.just({"where": "cpu"}), error=checks.DeviceError,
       on_device=lambda d: not d.interpreted),
    _c("device-second-gpu", "one tensor on a second GPU (runs with two or more)", _E, _any_tensor, _other_device,
       params=lambda op, a: st.just({"where": "cuda:1"}), error=checks.DeviceError, on_device=_devices_second),
)}


def expand_classes(tokens: list[str] | None) -> list[str]:
    """Class names, or group names (the part before the first '-') selecting every class of the group."""
    if not tokens:
        return list(CLASSES)
    out = []
    for tok in tokens:
        hits = [tok] if tok in CLASSES else [n for n, c in CLASSES.items() if c.group == tok]
        if not hits:
            raise ValueError(f"classes: {tok!r} is neither a class nor a group; groups: "
                             f"{sorted({c.group for c in CLASSES.values()})}")
        out += [h for h in hits if h not in out]
    return out


# ----------------------------------------------------------------------------- strategies

@dataclass(frozen=True)
class BadInput:
    """A valid case of ``op`` and the one way class ``cls`` breaks its argument ``arg`` (``*``: the call)."""
    op: str
    cls: str
    arg: str
    case: Any
    params: tuple[tuple[str, Any], ...]


def bad_inputs(op: str, cls: str, a: str, device) -> st.SearchStrategy[BadInput]:
    """Hypothesis strategy: a valid case (``base_cases``) with the fields the break needs, and its parameters."""
    c = CLASSES[cls]
    needs = dict(arg(op, a).needs) if a != "*" else {}

    def build(case, p):
        case = c.prepare(op, a, _replace(case, **needs), p)
        return BadInput(op, cls, a, case, tuple(sorted(p.items())))

    return st.builds(build, base_cases(op, device), c.params(op, a))


def draw(strategy, n: int, *, rng_seed: int = 0) -> list:
    """Up to ``n`` distinct examples, deterministic for a seed, on a budget of about n hypothesis
    runs (``cases.base.draw`` spends n + 10: too slow for some 500 strategies per plan)."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    out, seen = [], set()

    @seed(rng_seed)
    @settings(max_examples=n + n // 3 + 1, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(x):
        key = dataclasses.astuple(x)
        if key not in seen and len(out) < n:
            seen.add(key)
            out.append(x)

    collect()
    return out


@dataclass(frozen=True)
class Job:
    op: str
    cls: str
    arg: str
    target: str
    case: str  # cases.base.case_id
    params: tuple[tuple[str, Any], ...]

    def as_dict(self) -> dict:
        return {"op": self.op, "cls": self.cls, "arg": self.arg, "target": self.target, "case": self.case,
                "params": [list(kv) for kv in self.params]}

    @staticmethod
    def from_dict(d: dict) -> "Job":
        return Job(d["op"], d["cls"], d["arg"], d["target"], d["case"], tuple((k, v) for k, v in d["params"]))


def plan(device, *, classes: list[str] | None = None, ops: tuple[str, ...] = OPS, targets: list[str] | None = None,
         examples: int = 2, seed: int = 0) -> list[Job]:
    """Every (class, op, argument) on ``device`` × ``examples`` drawn bad inputs × every target that takes it."""
    from cases.base import case_id

    jobs = []
    for name in expand_classes(classes):
        c = CLASSES[name]
        if not c.on_device(device):
            continue
        for op in ops:
            tgts = [resolve_target(t) for t in targets] if targets else targets_for(op)
            tgts = [t for t in tgts if t.op == op]
            for a in c.args(op):
                for bi in draw(bad_inputs(op, name, a, device), examples, rng_seed=seed):
                    for t in tgts:
                        if (a == "*" or t.forwards(a)) and t.applies(bi.case):
                            jobs.append(Job(op, name, a, t.name, case_id(op, bi.case), bi.params))
    return jobs


# ----------------------------------------------------------------------------- one call (in the worker)

def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).cpu().clone()


def _covered(t: torch.Tensor) -> torch.Tensor:
    """Bool mask over the bytes of ``t``'s storage: the bytes its view reads or writes."""
    n = t.untyped_storage().nbytes() // t.element_size()
    mask = torch.zeros(n, dtype=torch.bool)
    if t.numel():
        mask[torch.arange(n).as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1)] = True
    return mask.repeat_interleave(t.element_size())


def snapshot(kw: dict) -> dict:
    return {k: (_storage_bytes(v), _covered(v)) for k, v in kw.items()
            if isinstance(v, torch.Tensor) and v.device.type != "meta"}


def changed(snap: dict, kw: dict, writable: tuple[str, ...] = ()) -> list[str]:
    """Arguments whose storage bytes changed since ``snap``; for ``writable`` ones only bytes outside their view."""
    out = []
    for k, (before, covered) in snap.items():
        after = _storage_bytes(kw[k])
        diff = before != after
        if k in writable:
            diff &= ~covered
        if bool(diff.any()):
            out.append(k)
    return out


def _device_fault(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return "AcceleratorError" in text or "CUDA error" in text or "illegal memory access" in text


def _word(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


def _cpu(kw: dict) -> dict:
    return {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def build(job: Job, device) -> tuple[Any, dict, dict, dict, BadClass]:
    """(case, valid inputs, broken inputs, params) of a job, rebuilt exactly from its fields."""
    from cases.base import parse_case

    spec = op_spec(job.op)
    case = parse_case(spec.case_type, job.case.split(":", 1)[1])
    c, p, ctx = CLASSES[job.cls], dict(job.params), Ctx(job.op, case, device)
    base = spec.build_inputs(case, device)
    if job.op == "verify_attention" and job.arg == "o":
        _provide_o(base, ctx)
    bad = copy.deepcopy(base)
    c.apply(bad, job.arg, p, ctx)
    return case, base, bad, p, c


def execute(job: Job, device) -> dict:
    """One call of a job's target on its broken input, classified: {"outcome", "detail"}."""
    from harness.devices import synchronize
    from harness.registry import Impl
    from harness.runners import _check_outputs

    spec = op_spec(job.op)
    t = resolve_target(job.target)
    case, base, bad, p, c = build(job, device)
    ctx = Ctx(job.op, case, device)
    expect = c.expected(job.op)
    writable = tuple(spec.writable) + tuple(spec.out_args)
    names = tuple(t.rename(n) for n in (c.names(job.op, job.arg) if c.names else (job.arg,)))
    canon = None
    if expect == "answer":
        canon = copy.deepcopy(base)
        if c.canon is not None:
            c.canon(canon, job.arg, p, ctx)
        else:
            canon = copy.deepcopy(bad)
    limit = target_limit(t, canon, device) if canon is not None else ""
    snap = snapshot(bad)
    before = {b: bad[b].detach().cpu().clone() for b in spec.writable
              if isinstance(bad.get(b), torch.Tensor) and bad[b].device.type != "meta"}
    fn = load_fn(t.fn_path)
    exc = None
    try:
        out = call_target(t, fn, bad, case)
        synchronize(device)
    except Exception as e:  # noqa: BLE001 - every exception is classified below
        exc = e
    if exc is not None:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if _device_fault(exc):
            return {"outcome": "segfault", "detail": f"device fault: {text}", "fatal": True}
        moved = changed(snap, bad)
        if moved:
            return {"outcome": "partial-write", "detail": f"rejected ({text}) but changed {moved}"}
        if not isinstance(exc, VerifyParityInputError):
            return {"outcome": "crash", "detail": text}
        if expect == "answer" and not limit:
            return {"outcome": "refused", "detail": f"a legal input: {text}"}
        if expect == "answer":  # a declared limit: any typed error that names an argument
            ok = any(_word(n, str(exc)) for n in (*bad, *names))
            return {"outcome": "typed-error" if ok else "misnamed", "detail": f"limit ({limit}): {text}"}
        if not isinstance(exc, c.error):
            return {"outcome": "misnamed", "detail": f"expected {c.error.__name__}, got {text}"}
        if not any(_word(n, str(exc)) for n in names):
            return {"outcome": "misnamed", "detail": f"does not name {' or '.join(names)}: {text}"}
        want = c.value(p) if c.value else ""
        if want and want not in str(exc):
            return {"outcome": "misnamed", "detail": f"does not say the value {want!r}: {text}"}
        return {"outcome": "typed-error", "detail": text}
    if expect == "error":
        return {"outcome": "wrong", "detail": f"accepted: expected {c.error.__name__} naming {' or '.join(names)}"}
    moved = changed(snap, bad, writable)
    if moved:
        return {"outcome": "wrong", "detail": f"wrote into {moved} (read-only, or outside a writable view)"}
    ref_t = resolve_target(t.ref)
    ref_in = copy.deepcopy(canon)
    try:
        ref_out = call_target(ref_t, load_fn(ref_t.fn_path), ref_in, case)
    except Exception as e:  # noqa: BLE001
        return {"outcome": "crash", "detail": f"no answer to compare with: {ref_t.name} raised on the legal input: "
                                              f"{type(e).__name__}: {e}"}
    oracle = spec.oracle(**_cpu(canon))
    keep = t.outputs or tuple(o.name for o in spec.outputs)
    sub = dataclasses.replace(spec, outputs=tuple(o for o in spec.outputs if o.name in keep))
    impl = Impl(job.op, t.name, t.kind, fn)
    recs = _check_outputs(sub, impl, case, out, oracle, _cpu(ref_out), bad, _cpu(ref_in), before)
    bad_recs = [r for r in recs if not r.passed]
    if bad_recs:
        r = bad_recs[0]
        return {"outcome": "wrong", "detail": f"{r.check}: {r.detail} {r.worst}".strip()}
    return {"outcome": "correct", "detail": f"({limit}: answered anyway)" if limit else ""}


# ----------------------------------------------------------------------------- the worker process

def worker_main(device_kind: str) -> int:
    """Read one job (a JSON line) from stdin at a time, answer one JSON line on the original
    stdout; everything else (prints, warnings, tracebacks) goes to stderr."""
    import faulthandler

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    faulthandler.enable()
    from harness import devices

    device = devices.select(device_kind)
    import fused  # noqa: F401 - Triton prepared before any kernel import

    from harness.devices import synchronize

    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        job = Job.from_dict(json.loads(line))
        t0 = time.perf_counter()
        try:
            res = execute(job, device)
            synchronize(device)  # a fault of the call that surfaces only now is still the call's
        except Exception as e:  # noqa: BLE001 - the harness itself failed on this job: say so
            where = traceback.extract_tb(e.__traceback__)[-1]
            res = {"outcome": "segfault", "detail": f"device fault: {type(e).__name__}: {e}", "fatal": True} \
                if _device_fault(e) else \
                {"outcome": "crash", "detail": f"harness error building or checking the call "
                                               f"({Path(where.filename).name}:{where.lineno}): {type(e).__name__}: {e}"}
        res["seconds"] = round(time.perf_counter() - t0, 4)
        fatal = res.pop("fatal", False)
        proto.write(json.dumps(res) + "\n")
        proto.flush()
        if fatal:  # a CUDA fault poisons the context: end here, the parent starts a fresh worker
            os._exit(3)
    return 0


class Worker:
    """One long-lived worker subprocess; ``run`` sends it a job and waits up to ``timeout`` seconds.
    A worker that died (segfault, abort) or hung (then killed) is replaced on the next job."""

    START_TIMEOUT_S = 300.0

    def __init__(self, device: str):
        self.device = device
        self.proc: subprocess.Popen | None = None
        self.err = None
        self.buf = b""

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
        self.err = tempfile.TemporaryFile()
        self.buf = b""
        self.proc = subprocess.Popen([sys.executable, "-m", "cases.bad_inputs", "--worker", "--device", self.device],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, cwd=ROOT, env=env)
        ready = self._read(self.START_TIMEOUT_S)
        if not isinstance(ready, dict) or not ready.get("ready"):
            raise RuntimeError(f"bad-input worker did not start: {ready!r}; stderr: {self._stderr_since(0)[-3000:]}")

    def _stderr_since(self, offset: int) -> str:
        if self.err is None:
            return ""
        self.err.seek(offset)
        return self.err.read().decode(errors="replace")

    def _death(self, text: str) -> str:
        """faulthandler's report of a dying worker, shortened: the error and the innermost frames."""
        lines = [ln.strip() for ln in text.splitlines()]
        fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
        frames = [ln for ln in lines if ln.startswith('File "')][:3]
        return "; ".join(fatal[:1] + frames) or " | ".join(lines[-4:])

    def _read(self, timeout: float):
        """A JSON line, None on timeout, "eof" when the process ended."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return "eof"
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def run(self, job: Job, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.err.seek(0, os.SEEK_END)
        err_at = self.err.tell()
        try:
            self.proc.stdin.write((json.dumps(job.as_dict()) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        got = self._read(timeout)
        if got is None:
            self.stop()
            return {"outcome": "hang", "detail": f"no answer within {timeout:g} s (worker killed)"}
        if got == "eof":
            rc = self.proc.wait()
            why = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
            self.proc = None
            return {"outcome": "segfault", "detail": f"worker died ({why}): {self._death(self._stderr_since(err_at))}"}
        return got


# ----------------------------------------------------------------------------- running and reporting

@dataclass
class Result:
    job: Job
    outcome: str
    detail: str
    expect: str
    seconds: float = float("nan")
    repro: str = ""

    @property
    def bad(self) -> bool:
        return self.outcome not in GOOD


def repro_line(job: Job, device: str, timeout: float) -> str:
    t = "" if timeout == DEFAULT_TIMEOUT_S else f" --timeout {timeout:g}"
    return f"python -m cases.bad_inputs --device {device}{t} --one {shlex.quote(json.dumps(job.as_dict()))}"


def run(jobs: list[Job], *, device: str, timeout: float = DEFAULT_TIMEOUT_S, stop_after: int = 0, workers: int = 1,
        progress: Callable[[Result], None] | None = None) -> list[Result | None]:
    """Run every job in worker subprocesses. ``stop_after`` > 0: once a (class, op) has that many bad
    outcomes, its remaining jobs are skipped (None in the result list)."""
    bad_count: Counter = Counter()
    pool = [Worker(device) for _ in range(max(1, workers))]
    free = list(pool)
    import threading

    lock = threading.Lock()

    def one(job: Job) -> Result | None:
        key = (job.cls, job.op)
        with lock:
            if stop_after and bad_count[key] >= stop_after:
                return None
            w = free.pop()
        try:
            got = w.run(job, timeout)
        finally:
            with lock:
                free.append(w)
        res = Result(job, got["outcome"], got.get("detail", ""), CLASSES[job.cls].expected(job.op),
                     got.get("seconds", float("nan")))
        if res.bad:
            res.repro = repro_line(job, device, timeout)
            with lock:
                bad_count[key] += 1
        if progress:
            progress(res)
        return res

    try:
        with ThreadPoolExecutor(max_workers=len(pool)) as ex:
            return list(ex.map(one, jobs))
    finally:
        for w in pool:
            w.stop()


def table(results: list[Result | None], jobs: list[Job]) -> "pandas.DataFrame":  # noqa: F821
    """class → op → outcome counts (plus skipped), one row per (class, op)."""
    import pandas as pd

    rows = [{"class": j.cls, "op": j.op, "expect": CLASSES[j.cls].expected(j.op),
             "outcome": r.outcome if r is not None else "skipped"} for j, r in zip(jobs, results)]
    cols = [*OUTCOMES, "skipped"]
    if not rows:
        return pd.DataFrame(columns=["class", "op", "expect", *cols])
    df = pd.crosstab([pd.Series([r["class"] for r in rows], name="class"),
                      pd.Series([r["op"] for r in rows], name="op"),
                      pd.Series([r["expect"] for r in rows], name="expect")],
                     pd.Series([r["outcome"] for r in rows], name="outcome"))
    df = df.reindex(columns=cols, fill_value=0)
    order = {n: i for i, n in enumerate(CLASSES)}
    return df.sort_index(key=lambda ix: ix.map(lambda v: order.get(v, v) if ix.name == "class" else v))


def failing_classes(results: list[Result | None]) -> set[str]:
    return {r.job.cls for r in results if r is not None and r.bad}


def report(results: list[Result | None], jobs: list[Job], out=None, per_key: int = 2) -> int:
    """Print the table and one repro line per failure (``per_key`` per class, op and target); 1 on any bad outcome."""
    import pandas as pd

    out = out or sys.stdout

    with pd.option_context("display.max_rows", None, "display.width", 250, "display.max_columns", None):
        print(table(results, jobs).reset_index().to_string(index=False), file=out)
    shown: Counter = Counter()
    bad = [r for r in results if r is not None and r.bad]
    for r in bad:
        key = (r.job.cls, r.job.op, r.job.target)
        shown[key] += 1
        if shown[key] <= per_key:
            print(f"FAIL {r.job.cls} {r.job.op} {r.job.arg} {r.job.target}: {r.outcome}: {r.detail[:400]}\n"
                  f"  repro: {r.repro}", file=out)
    hidden = sum(max(0, n - per_key) for n in shown.values())
    if hidden:
        print(f"... {hidden} more failures of the same class, op and target", file=out)
    n_bad_cls = len(failing_classes(results))
    print(f"{len([r for r in results if r is not None])} calls, {len(bad)} bad, classes failing: {n_bad_cls} of "
          f"{len({j.cls for j in jobs})}", file=out)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cases.bad_inputs", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "rocm", "auto"),
                   help="auto: the GPU if torch sees one, else the CPU interpreter")
    p.add_argument("--classes", nargs="*", help="class names or groups (stride, dtype, device, ...); default: all")
    p.add_argument("--ops", nargs="*", choices=OPS, default=list(OPS))
    p.add_argument("--targets", nargs="*", help="module:attr of built-in targets, or module:attr@<built-in>")
    p.add_argument("--examples", type=int, default=2, help="drawn bad inputs per class, op and argument")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per call before it is a hang")
    p.add_argument("--stop-after", type=int, default=5,
                   help="skip a class's remaining calls on an op after this many bad outcomes (0: never)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--list", action="store_true", help="print the classes and exit")
    p.add_argument("--verbose", action="store_true", help="print every call's outcome as it comes")
    p.add_argument("--one", help="run one job (the JSON of a repro line) and print its outcome")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args.device)
    if args.list:
        for c in CLASSES.values():
            exp = c.expect if isinstance(c.expect, str) else ", ".join(f"{k}: {v}" for k, v in c.expect.items())
            print(f"{c.name:28s} {exp:10s} {c.doc}")
        return 0
    from harness import devices

    if args.one:
        job = Job.from_dict(json.loads(args.one))
        res = run([job], device=devices.select(args.device).kind, timeout=args.timeout)[0]
        print(f"{job.cls} {job.op} {job.arg} {job.target}: {res.outcome} (expected "
              f"{'typed-error' if res.expect == 'error' else 'correct'}): {res.detail}")
        return 1 if res.bad else 0
    try:
        classes = expand_classes(args.classes)
    except ValueError as e:
        p.error(str(e))
    device = devices.select(args.device)
    jobs = plan(device, classes=classes, ops=tuple(args.ops), targets=args.targets, examples=args.examples,
                seed=args.seed)
    show = (lambda r: print(f"{r.outcome:13s} {r.job.cls} {r.job.op} {r.job.arg} {r.job.target}: {r.detail[:300]}",
                            flush=True)) if args.verbose else None
    results = run(jobs, device=device.kind, timeout=args.timeout, stop_after=args.stop_after, workers=args.jobs,
                  progress=show)
    return report(results, jobs)


if __name__ == "__main__":
    sys.exit(main())
