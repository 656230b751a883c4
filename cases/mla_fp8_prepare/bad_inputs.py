"""Bad inputs of ``mla_fp8_prepare`` (``harness.fuzz``): the arguments of its public call, its public
entry points, and the small valid cases every one of them takes."""
from __future__ import annotations

import dataclasses

from harness.fuzz.declared import FP8, Arg, Target

OP = "mla_fp8_prepare"
R, F = "reference", "fused"

# its public call's arguments, as the classes see them
ARGS = (
    Arg("q_nope", "data", "any"), Arg("q_rope", "data", "any"),
    Arg("k_nope", "data", "any"), Arg("k_rope", "data", "any"),
    Arg("kv_buffer", "buffer", "any"),
    Arg("out_cache_loc", "slots"), Arg("slot_map", "map", "", (("pool", "translated"),)),
    Arg("decode_kernel_loc", "slots", "", (("capture_loc", True),)),
    Arg("kv_descale", "float"), Arg("fp8_policy", "enum"),
    Arg("save_kv_cache", "bool"), Arg("fused_switch", "bool"),
)

# tensor arguments whose contract takes other dtypes than bf16
DTYPES = {"kv_buffer": FP8}
# shape-<which>-mismatch: the arguments given one more token row / head / last-axis element than the others
# ("token-names": the arguments a token mismatch's error may name besides the broken one)
MISMATCHED = {"token": ("q_rope", "k_nope", "k_rope", "out_cache_loc", "decode_kernel_loc"), "head": ("q_rope",),
              "dim": ("k_nope", "k_rope", "kv_buffer"), "token-names": ("q_nope", "out_cache_loc", "decode_kernel_loc")}

# value-nan-unread: pool rows the call does not write
UNREAD = ("kv_buffer",)
HUGE_IS_MAX = True  # value-huge-data: the activations' largest finite value (1e15 for the other ops)

# its public entry points, each called like the step (Target.call) unless it says otherwise
TARGETS = (
    Target("reference.mla_fp8_prepare.chain:mla_fp8_prepare_step", OP, R,
           "reference.mla_fp8_prepare.chain:mla_fp8_prepare_step"),
    Target("reference.mla_fp8_prepare.chain:mla_fp8_prepare", OP, R,
           "reference.mla_fp8_prepare.chain:mla_fp8_prepare", "mla-bare"),
    Target("fused.mla_fp8_prepare.wrapper:mla_fp8_prepare_step", OP, F,
           "reference.mla_fp8_prepare.chain:mla_fp8_prepare_step"),
    Target("fused.mla_fp8_prepare.wrapper:mla_fp8_prepare", OP, F,
           "reference.mla_fp8_prepare.chain:mla_fp8_prepare", "mla-bare", "mla"),
)


def base_cases(device):
    """Small valid cases that every target of the op takes on ``device`` (the op's own strategy,
    narrowed: the fused kernels' coverage, the device's fp8 formats)."""
    from cases.mla_fp8_prepare import catalog as c
    from fused.mla_fp8_prepare import wrapper as f

    return c.cases(max_tokens=6, max_heads=3, head_dims=((64, 16), (17, 5), (512, 64)),
                   formats=f.kernel_fp8_formats(device), policies=("saturate",)).map(
        lambda k: k if k.q_layout != "inner_strided" else dataclasses.replace(k, q_layout="model"))


def nan_unread(kw, a, p, ctx):
    """NaN in the pool rows off the physical write rows."""
    import torch

    from harness.fuzz.classes_values import fill_unread_nan

    phys = kw["decode_kernel_loc"] if kw["decode_kernel_loc"] is not None else kw["out_cache_loc"]
    used, size = phys.long().cpu(), kw["kv_buffer"].shape[0]
    if kw["slot_map"] is not None and kw["decode_kernel_loc"] is None:
        used = torch.where(used >= 0, kw["slot_map"].cpu().long()[used.clamp(min=0)], -1)
    fill_unread_nan(kw[a], used, size)
