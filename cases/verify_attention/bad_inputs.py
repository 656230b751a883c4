"""Bad inputs of ``verify_attention`` (``harness.fuzz``): the arguments of its public call, its public
entry points, and the small valid cases every one of them takes."""
from __future__ import annotations

import dataclasses

import torch

from harness.fuzz.declared import FP8, Arg, Target

OP = "verify_attention"
R, F = "reference", "fused"

# its public call's arguments, as the classes see them
ARGS = (
    Arg("q", "data", "rows"), Arg("k", "data", "rows"), Arg("v", "data", "rows"),
    Arg("k_buffer", "data", "rows"), Arg("v_buffer", "data", "rows"),
    Arg("qo_indptr", "indptr"), Arg("kv_indptr", "indptr"), Arg("kv_indices", "index"),
    Arg("o", "out", "contiguous"),
    Arg("sm_scale", "float"), Arg("k_scale", "float"), Arg("v_scale", "float"),
    Arg("num_kv_splits", "int"), Arg("topk", "int"),
    Arg("is_causal", "bool"), Arg("splitkv_switch", "bool"), Arg("model_family", "enum"),
)

# tensor arguments whose contract takes other dtypes than bf16
DTYPES = {"k_buffer": (torch.bfloat16, *FP8), "v_buffer": (torch.bfloat16, *FP8)}
# shape-<which>-mismatch: the arguments given one more token row / head / last-axis element than the others
MISMATCHED = {"token": ("k", "v", "o"), "head": ("v", "k_buffer", "v_buffer", "o"),
              "dim": ("k", "k_buffer", "v_buffer", "o")}

# value-nan-unread: pool rows off the prefix (slot 0 included)
UNREAD = ("k_buffer",)

# its public entry points, each called like the step (Target.call) unless it says otherwise
TARGETS = (
    Target("reference.verify_attention.chain:verify_attention", OP, R,
           "reference.verify_attention.chain:verify_attention"),
    Target("reference.verify_attention.sdpa:verify_attention_sdpa", OP, "external",
           "reference.verify_attention.chain:verify_attention"),
    Target("fused.verify_attention.wrapper:verify_attention", OP, F,
           "reference.verify_attention.chain:verify_attention"),
    Target("fused.verify_attention.wrapper:verify_split_kv", OP, F,
           "reference.verify_attention.chain:verify_attention", limit="split_kv"),
    Target("fused.verify_attention.wrapper:verify_shared_kv", OP, F,
           "reference.verify_attention.chain:verify_attention", limit="shared_kv"),
)


def base_cases(device):
    """Small valid cases that every target of the op takes on ``device`` (the op's own strategy,
    narrowed: the fused kernels' coverage, the device's fp8 formats)."""
    from cases.verify_attention import catalog as c
    from harness.fuzz.targets import pow2_floor
    from fused.verify_attention import wrapper as f
    from cases.verify_attention.spec import kernel_can_handle

    ok_kv = tuple(n for n, d in (("bf16", torch.bfloat16), ("e4m3fn", torch.float8_e4m3fn),
                                 ("e4m3fnuz", torch.float8_e4m3fnuz))
                  if device.interpreted or d in f.ARCH_KV_DTYPES.get(device.arch, f.KV_DTYPES))

    def legal(k):
        kind, n = k.prefix.split(":")
        return dataclasses.replace(k, ragged=False, topk=1, prefix=f"{kind}:{max(1, int(n))}",
                                   H=k.Hkv * pow2_floor(k.H // k.Hkv), kv_dtype=k.kv_dtype if k.kv_dtype in ok_kv
                                   else "bf16")

    return c.cases(max_batch=2, max_width=3, max_heads=4, max_prefix=10, max_splits=2, head_dims=(64,)).map(
        legal).filter(lambda k: all(kernel_can_handle(kind)(k, device) is True for kind in ("split_kv", "shared_kv")))


def value_args(kind: str) -> tuple[str, ...]:
    """What value-<kind>-data breaks: the data tensors; an Inf not in v, where it meets 0 weights
    (0·inf: its NaN placement is the product's order)."""
    from harness.fuzz.args import args_of

    if kind == "inf":
        return ("q", "k", "k_buffer")
    return args_of(OP, "data")


def prefix_swap_away_slot0(kw):
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


def nan_unread(kw, a, p, ctx):
    """NaN in every pool row the prefix does not read (slot 0 swapped away first)."""
    from harness.fuzz.surgery import fill_rows_nan

    prefix_swap_away_slot0(kw)
    rows = _unread_rows(kw)
    fill_rows_nan(kw["k_buffer"], rows)
    if kw["v_buffer"].untyped_storage().data_ptr() != kw["k_buffer"].untyped_storage().data_ptr():
        fill_rows_nan(kw["v_buffer"], rows)


def nan_unread_case(case):
    """value-nan-unread's case: two requests and a mixed prefix (rows read and rows not)."""
    from harness.fuzz.badclass import replace_fields

    return replace_fields(case, B=max(2, getattr(case, "B", 1)), prefix="mixed:6")


def nan_unread_canon(kw):
    """The legal equivalent: the same slot swap (the NaN rows are legal, unread)."""
    prefix_swap_away_slot0(kw)


# caller-provided outputs its cases leave to the op (o=None): a job on one gets it, NaN-filled (provide_out)
PROVIDED_OUTS = ("o",)


def provide_out(kw, name, ctx):
    q, v = kw["q"], kw["v"]
    kw["o"] = torch.full((q.shape[0], q.shape[1], v.shape[2]), float("nan"), dtype=q.dtype, device=q.device)
