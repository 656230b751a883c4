"""Classes of the call families: Python types, enums and knobs, tree masks (topk > 1), devices."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from harness.fuzz.args import TENSOR_KINDS, args_of, tensor_args
from harness.fuzz.badclass import ANSWER, ERROR, BadClass, bad, replace_fields, set_arg
from reference import checks


def _trees(op):
    """The whole call of an op that takes a tree width (``topk``): it may carry a tree mask."""
    return ("*",) if args_of(op, "int", only=("topk",)) else ()


def _scalar_value(kw, a):
    v = kw[a]
    return 0.5 if v is None else v


def _meta_one(kw, a, p, ctx):
    kw[a] = kw[a].to("meta")


def _meta_all(kw, a, p, ctx):
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            kw[k] = v.to("meta")


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


def _devices_second(device) -> bool:
    return not device.interpreted and torch.cuda.device_count() >= 2


def _other_device(kw, a, p, ctx):
    kw[a] = kw[a].to("cpu" if p["where"] == "cpu" else "cuda:1")


CLASSES: tuple[BadClass, ...] = (  # in report order
    # ------------------------------------------------------------------ Python types
    bad("pytype-str-bool", "'False' for a bool (a truthy str)", ERROR, lambda op: args_of(op, "bool"),
        lambda kw, a, p, ctx: kw.update({a: "False"}), value=lambda p: "False"),
    bad("pytype-int-bool", "0 or 1 for a bool", ERROR, lambda op: args_of(op, "bool"),
        lambda kw, a, p, ctx: kw.update({a: int(kw[a])})),
    bad("pytype-numpy-float64", "a numpy float64 for a float scalar (a Python float subclass): the same answer", ANSWER,
        lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: np.float64(_scalar_value(kw, a))}),
        canon=lambda kw, a, p, ctx: kw.update({a: float(_scalar_value(kw, a))})),
    bad("pytype-numpy-float32", "a numpy float32 for a float scalar (a real number): the answer for its value", ANSWER,
        lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: np.float32(_scalar_value(kw, a))}),
        canon=lambda kw, a, p, ctx: kw.update({a: float(np.float32(_scalar_value(kw, a)))})),
    bad("pytype-numpy-int", "a numpy int64 for an int: the same answer", ANSWER, lambda op: args_of(op, "int"),
        lambda kw, a, p, ctx: kw.update({a: np.int64(kw[a])})),
    bad("pytype-numpy-bool", "a numpy bool_ for a bool: the same answer", ANSWER, lambda op: args_of(op, "bool"),
        lambda kw, a, p, ctx: kw.update({a: np.bool_(kw[a])})),
    bad("pytype-tensor0d-float", "a 0-d tensor for a float scalar", ERROR, lambda op: args_of(op, "float"),
        lambda kw, a, p, ctx: kw.update({a: torch.tensor(_scalar_value(kw, a), device=ctx.dev)})),
    bad("pytype-float-for-int", "a float for an int (2.0)", ERROR, lambda op: args_of(op, "int"),
        lambda kw, a, p, ctx: kw.update({a: float(kw[a])})),
    bad("pytype-int-for-float", "an int for a float scalar (a real number): the answer for float(x)", ANSWER,
        lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: 1}),
        canon=lambda kw, a, p, ctx: kw.update({a: 1.0})),
    bad("pytype-bool-for-float", "True for a float scalar", ERROR, lambda op: args_of(op, "float"),
        lambda kw, a, p, ctx: kw.update({a: True})),
    bad("pytype-str-for-float", "a str for a float scalar ('0.5')", ERROR, lambda op: args_of(op, "float"),
        lambda kw, a, p, ctx: kw.update({a: "0.5"})),
    bad("pytype-bool-for-int", "True for an int", ERROR, lambda op: args_of(op, "int"),
        lambda kw, a, p, ctx: kw.update({a: True})),
    bad("pytype-str-for-int", "a str for an int ('2')", ERROR, lambda op: args_of(op, "int"),
        lambda kw, a, p, ctx: kw.update({a: str(kw[a])})),
    bad("pytype-none-for-tensor", "None for a required tensor", ERROR,
        lambda op: args_of(op, *TENSOR_KINDS, exclude=("q_norm_weight", "slot_map", "decode_kernel_loc", "q_out", "o")),
        lambda kw, a, p, ctx: kw.update({a: None})),
    bad("pytype-list-for-tensor", "a Python list for a tensor", ERROR, tensor_args,
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: t.float().tolist() if t.is_floating_point() else t.tolist())),
    # ------------------------------------------------------------------ enums and knobs
    bad("enum-bogus", "'bogus' for an enum string (forward_mode, rope_style, fp8_policy, model_family)", ERROR,
        lambda op: args_of(op, "enum"), lambda kw, a, p, ctx: kw.update({a: "bogus"}), value=lambda p: "bogus"),
    bad("enum-none", "None for an enum string", ERROR, lambda op: args_of(op, "enum"),
        lambda kw, a, p, ctx: kw.update({a: None}), value=lambda p: "None"),
    bad("knob-splits-huge", "an unbounded num_kv_splits (10**4, 2**16)", ERROR,
        lambda op: args_of(op, "int", only=("num_kv_splits",)),
        lambda kw, a, p, ctx: kw.update({a: p["v"]}),
        params=lambda op, a: st.sampled_from((10 ** 4, 2 ** 16)).map(lambda v: {"v": v}), value=lambda p: str(p["v"])),
    bad("knob-nonpositive", "0 or -1 for a count (num_kv_splits, topk, rope_dim)", ERROR, lambda op: args_of(op, "int"),
        lambda kw, a, p, ctx: kw.update({a: p["v"]}), params=lambda op, a: st.sampled_from((0, -1)).map(
           lambda v: {"v": v}), value=lambda p: str(p["v"])),
    bad("knob-rope-dim", "rope_dim odd, larger than head_dim, or not dividing it", ERROR,
        lambda op: args_of(op, "int", only=("rope_dim",)),
        lambda kw, a, p, ctx: kw.update({a: {"odd": kw[a] - 1, "wide": 2 * kw["q"].shape[-1],
                                             "non-divisor": 3 * kw["q"].shape[-1] // 4 // 2 * 2 + 2}[p["how"]]}),
        params=lambda op, a: st.sampled_from(("odd", "wide", "non-divisor")).map(lambda h: {"how": h})),
    # ------------------------------------------------------------------ trees (topk > 1)
    bad("tree-topk2", "topk 2 with a tree mask: legal for the chain, the SDPA path and the dispatch (which must "
        "route it away from the kernels); the kernels read no tree mask and must refuse it", ANSWER,
        _trees, _identity_tree,
        prepare=lambda op, a, case, p: replace_fields(case, L=max(2, case.L), is_causal=True),
        names=lambda op, a: ("topk", "custom_mask")),
    bad("tree-mask-at-topk1", "a tree mask at topk 1", ERROR, _trees,
        _tree_then(lambda kw: kw.update(topk=1)), prepare=lambda op, a, case, p: replace_fields(case, L=max(2, case.L)),
        names=lambda op, a: ("custom_mask", "topk")),
    bad("tree-topk2-no-mask", "topk 2 without a tree mask", ERROR, _trees,
        lambda kw, a, p, ctx: kw.update(topk=2, custom_mask=None), names=lambda op, a: ("custom_mask", "topk")),
    bad("tree-mask-length", "a tree mask one element too long", ERROR,
        _trees,
        _tree_then(lambda kw: kw.update(custom_mask=torch.cat([kw["custom_mask"], kw["custom_mask"][:1]]))),
        prepare=lambda op, a, case, p: replace_fields(case, L=max(2, case.L)), names=lambda op, a: ("custom_mask",)),
    bad("tree-mask-not-bool", "a uint8 tree mask", ERROR, _trees,
        _tree_then(lambda kw: kw.update(custom_mask=kw["custom_mask"].to(torch.uint8))),
        prepare=lambda op, a, case, p: replace_fields(case, L=max(2, case.L)), names=lambda op, a: ("custom_mask",)),
    # ------------------------------------------------------------------ devices
    bad("device-meta-one", "one tensor on the meta device (no data)", ERROR, tensor_args, _meta_one,
        error=checks.DeviceError),
    bad("device-meta-all", "every tensor on the meta device", ERROR, lambda op: ("*",), _meta_all,
        names=lambda op, a: tensor_args(op), error=checks.DeviceError),
    bad("device-cpu-among-gpu", "one tensor on the CPU, the others on the GPU (GPU runs)", ERROR, tensor_args,
        _other_device, params=lambda op, a: st.just({"where": "cpu"}), error=checks.DeviceError,
        on_device=lambda d: not d.interpreted),
    bad("device-second-gpu", "one tensor on a second GPU (runs with two or more)", ERROR, tensor_args, _other_device,
        params=lambda op, a: st.just({"where": "cuda:1"}), error=checks.DeviceError, on_device=_devices_second),
)
