"""Bad inputs of ``qk_norm_rope`` (``harness.fuzz``): the arguments of its public call, its public
entry points, and the small valid cases every one of them takes."""
from __future__ import annotations

import dataclasses

import torch

from harness.fuzz.declared import DECODE, Arg, Target

OP = "qk_norm_rope"
R, F = "reference", "fused"

# its public call's arguments, as the classes see them
ARGS = (
    Arg("q", "data", "rows"), Arg("kv", "data", "rows"),
    Arg("kv_norm_weight", "param", "contiguous"),
    Arg("q_norm_weight", "param", "contiguous", (("q_weight", True),)),
    Arg("cos", "table", "contiguous"), Arg("sin", "table", "contiguous"),
    Arg("positions", "index"),
    Arg("ring", "buffer", "contiguous", DECODE), Arg("loc", "slots", "", DECODE),
    Arg("q_out", "out", "contiguous", (("q_out", "provided"),)),
    Arg("eps", "float"), Arg("rope_dim", "int"), Arg("rope_style", "enum"), Arg("forward_mode", "enum"),
)

# tensor arguments whose contract takes other dtypes than bf16
DTYPES = {"kv_norm_weight": (torch.bfloat16, torch.float32), "q_norm_weight": (torch.bfloat16, torch.float32),
          "cos": (torch.float32,), "sin": (torch.float32,)}
# shape-<which>-mismatch: the arguments given one more token row / head / last-axis element than the others
MISMATCHED = {"token": ("kv", "positions", "loc", "q_out"), "head": ("q_out",),
              "dim": ("kv", "kv_norm_weight", "q_norm_weight", "cos", "sin", "ring", "q_out")}

# value-nan-unread: rope-table rows off the positions, ring rows the call does not write
UNREAD = ("cos", "sin", "ring")

# its public entry points, each called like the step (Target.call) unless it says otherwise
TARGETS = (
    Target("reference.qk_norm_rope.chain:qk_norm_rope_step", OP, R, "reference.qk_norm_rope.chain:qk_norm_rope_step"),
    Target("reference.qk_norm_rope.chain:qk_norm_rope", OP, R, "reference.qk_norm_rope.chain:qk_norm_rope", "qk-bare"),
    Target("fused.qk_norm_rope.wrapper:qk_norm_rope_step", OP, F, "reference.qk_norm_rope.chain:qk_norm_rope_step"),
    Target("fused.qk_norm_rope.wrapper:qk_norm_rope", OP, F, "reference.qk_norm_rope.chain:qk_norm_rope", "qk-bare"),
)


def base_cases(device):
    """Small valid cases that every target of the op takes on ``device`` (the op's own strategy,
    narrowed: the fused kernels' coverage, the device's fp8 formats)."""
    from cases.qk_norm_rope import catalog as c

    # unified layers: a non-unified layer's paged store has no contract for non-finite rows yet
    return c.cases(max_tokens=6, max_heads=3, head_dims=(64, 128), rope_dims=(16, 32, 64), max_positions=64).map(
        lambda k: dataclasses.replace(k, unified=True))


def value_args(kind: str) -> tuple[str, ...]:
    """What value-<kind>-data breaks: subnormal and huge rows in the activations only, NaN/Inf in any float input."""
    from harness.fuzz.args import args_of

    return ("q", "kv") if kind in ("subnormal", "huge") else args_of(OP, "data", "param", "table")


def nan_unread(kw, a, p, ctx):
    """NaN in the rope-table rows off the positions, or in the ring rows off the write slots."""
    from harness.fuzz.classes_values import fill_unread_nan

    used = kw["positions"].long().cpu() if a in ("cos", "sin") else kw["loc"].long().cpu()
    fill_unread_nan(kw[a], used, kw[a].shape[0])
