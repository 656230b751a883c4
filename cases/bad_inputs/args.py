"""The arguments of each op's public call, as the classes see them: name, kind, layout, and the
case fields under which a call reads the argument."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

OPS = ("qk_norm_rope", "mla_fp8_prepare", "verify_attention")
FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


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


def tensor_args(op: str) -> tuple[str, ...]:
    return tuple(a.name for a in ARGS[op] if a.kind in TENSOR_KINDS)
