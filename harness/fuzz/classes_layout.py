"""Classes of the layout families: strides, dtypes, ranks and shapes, sizes."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from harness.fuzz.args import ARGS, FLOAT_DATA_KINDS, INDEX_KINDS, MODULES, OPS, arg, args_of, tensor_args
from harness.fuzz.badclass import ANSWER, ERROR, BadClass, bad, junk_params, replace_fields, set_arg, two_rows
from harness.fuzz.declared import FP8
from harness.fuzz.surgery import cat, fill_, interleaved_view, offset_view, rows_view
from reference import checks


def _swap_fp8(dtype):
    return torch.float8_e4m3fnuz if dtype == torch.float8_e4m3fn else torch.float8_e4m3fn


def _per_request(op: str) -> bool:
    """Whether the op's call is a per-request attention (indptr arguments beside q, k, v): the
    classes that break its heads, prefix and token counts."""
    return bool(args_of(op, "indptr")) and len(args_of(op, "data", only=("q", "k", "v"))) == 3


def _mismatched(which: str):
    """The op's arguments that ``shape-<which>-mismatch`` breaks (its module's ``MISMATCHED``)."""
    return lambda op: getattr(MODULES[op], "MISMATCHED", {}).get(which, ())


def _t0(kw, a, p, ctx):
    if hasattr(MODULES[ctx.op], "t0"):  # the op module's own (a call whose tokens are not its arguments' rows)
        MODULES[ctx.op].t0(kw, ctx)
        return
    if _per_request(ctx.op):
        for k in ("q", "k", "v"):
            kw[k] = kw[k][:0]
        kw["qo_indptr"] = torch.zeros_like(kw["qo_indptr"])
        return
    per_token = args_of(ctx.op, "data", "index", "slots", "out")
    for k in per_token:
        if kw.get(k) is not None:
            kw[k] = kw[k][:0]


def _b0(kw, a, p, ctx):
    if hasattr(MODULES[ctx.op], "b0"):  # the op module's own
        MODULES[ctx.op].b0(kw, ctx)
        return
    kw.update(q=kw["q"][:0], k=kw["k"][:0], v=kw["v"][:0], qo_indptr=kw["qo_indptr"][:1],
              kv_indptr=kw["kv_indptr"][:1])


def _all_padding(kw, a, p, ctx):
    for k in args_of(ctx.op, "slots"):
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


def _foreign_format(kw, a, p, ctx):
    """The KV buffers in the other fp8 format: mla's pool reinterpreted (stale bytes), verify's values converted."""
    if args_of(ctx.op, "buffer", only=("kv_buffer",)):  # the pool the prepare writes
        kw["kv_buffer"] = kw["kv_buffer"].view(_swap_fp8(kw["kv_buffer"].dtype))
        return
    other = _swap_fp8(kw["k_buffer"].dtype)
    kb = kw["k_buffer"].float().to(other)
    kw["v_buffer"] = kb[..., : kw["v_buffer"].shape[-1]] if ctx.case.layout == "mla" else \
        kw["v_buffer"].float().to(other)
    kw["k_buffer"] = kb


FLOATS = (torch.float32, torch.float16, torch.float64, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
# (op, arg) -> dtypes its contract takes (its module's DTYPES); every other tensor argument: bf16
ALLOWED = {(op, a): d for op, mod in MODULES.items() for a, d in getattr(mod, "DTYPES", {}).items()}


def _fp8_kv(op: str) -> bool:
    """Whether the op takes KV buffers in fp8."""
    return any(set(FP8) <= set(d) for (o, _), d in ALLOWED.items() if o == op)


def _wrong_float(op, a):
    allowed = ALLOWED.get((op, a), (torch.bfloat16,))
    return st.sampled_from([str(d).removeprefix("torch.") for d in FLOATS if d not in allowed]).map(
        lambda d: {"dtype": d})


def _to_dtype(kw, a, p, ctx):
    kw[a] = kw[a].to(getattr(torch, p["dtype"]))


CLASSES: tuple[BadClass, ...] = (  # in report order
    # ------------------------------------------------------------------ strides
    bad("stride-rows", "rows strided (a slice of a wider tensor whose other columns hold NaN or huge junk), "
        "unit innermost stride: the layout the contract takes", ANSWER,
        lambda op: tuple(a.name for a in ARGS[op] if a.kind in ("data", "buffer") and a.layout in ("rows", "any")),
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: rows_view(t, p["junk"])), params=junk_params("nan", "huge"),
        prepare=two_rows),
    bad("stride-inner", "innermost stride 2 (every other element of an interleaved tensor, junk between): qk and "
        "verify take a unit innermost stride only; mla's contract takes any strides",
        {op: ANSWER if args_of(op, "data", layout=("any",)) else ERROR for op in OPS},
        lambda op: tuple(a.name for a in ARGS[op] if a.kind in ("data", "buffer") and a.layout in ("rows", "any")),
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: interleaved_view(t, p["junk"])),
        params=junk_params("nan", "huge"), error=checks.LayoutError, prepare=two_rows),
    bad("stride-contiguous-only", "a non-contiguous view (rows strided, or interleaved for 1-D) of a tensor the "
        "contract wants contiguous: weights, rope tables, the ring, caller-provided outputs", ERROR,
        lambda op: args_of(op, "param", "table", "buffer", "out", layout=("contiguous",)),
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: interleaved_view(t, p["junk"]) if t.dim() == 1
                                      else rows_view(t, p["junk"])), params=junk_params("nan", "huge"),
        error=checks.LayoutError, prepare=two_rows),
    bad("stride-index", "an index tensor as a non-contiguous view (stack([t, junk], -1)[..., 0], junk huge or "
        "negative): index tensors must be contiguous, as kv_indices already is", ERROR,
        lambda op: args_of(op, *INDEX_KINDS),
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: interleaved_view(t, p["junk"])),
        params=junk_params("huge", "negative"), prepare=two_rows, error=checks.LayoutError),
    bad("stride-offset", "every tensor argument may sit at a storage offset (contiguous, after junk elements)", ANSWER,
        tensor_args, lambda kw, a, p, ctx: set_arg(kw, a, lambda t: offset_view(t, p["junk"])),
        params=lambda op, a: st.sampled_from(("nan", "huge") if arg(op, a).kind in FLOAT_DATA_KINDS
                                             else ("huge", "negative")).map(lambda j: {"junk": j}),
        prepare=two_rows),
    # ------------------------------------------------------------------ dtypes
    bad("dtype-wrong-float", "a float dtype the argument does not take (fp32 / fp16 / fp64 / bf16 / fp8 e4m3fn / "
        "e5m2 where another is due)", ERROR, lambda op: args_of(op, *FLOAT_DATA_KINDS), _to_dtype, params=_wrong_float,
        error=checks.DTypeError),
    bad("dtype-int-for-float", "an int32 tensor for a float one", ERROR, lambda op: args_of(op, *FLOAT_DATA_KINDS),
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: t.float().nan_to_num().clamp(-1e6, 1e6).to(torch.int32)),
        error=checks.DTypeError),
    bad("dtype-float-for-int", "a float32 index tensor", ERROR, lambda op: args_of(op, *INDEX_KINDS),
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: t.float()), error=checks.DTypeError),
    bad("dtype-narrow-index", "an index tensor as int16, uint8 or bool", ERROR, lambda op: args_of(op, *INDEX_KINDS),
        _to_dtype, params=lambda op, a: st.sampled_from(("int16", "uint8", "bool")).map(lambda d: {"dtype": d}),
        error=checks.DTypeError),
    bad("dtype-fp8-foreign-format", "the KV buffers in the other fp8 e4m3 format (e4m3fnuz on NVIDIA, e4m3fn on "
        "gfx942; either on the CPU): legal; a kernel that has no conversion for it refuses with a typed error", ANSWER,
        lambda op: ("*",) if _fp8_kv(op) else (), _foreign_format,
        prepare=lambda op, a, case, p: replace_fields(case, kv_dtype="e4m3fn")
        if getattr(case, "kv_dtype", None) == "bf16" else case,
        names=lambda op, a: ("kv_buffer", "k_buffer", "v_buffer")),
    bad("dtype-fp8-mixed", "k_buffer and v_buffer in different fp8 formats", ERROR,
        lambda op: args_of(op, "data", only=("v_buffer",)),
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: t.view(_swap_fp8(t.dtype))),
        prepare=lambda op, a, case, p: replace_fields(case, kv_dtype="e4m3fn" if case.kv_dtype == "bf16"
                                                      else case.kv_dtype),
        error=checks.DTypeError),
    # ------------------------------------------------------------------ ranks and shapes
    bad("rank-extra-dim", "a leading axis of size 1 added", ERROR, tensor_args,
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: t.unsqueeze(0)), error=checks.RankError),
    bad("rank-missing-dim", "the last two axes flattened into one", ERROR,
        lambda op: tuple(a for a in tensor_args(op) if a not in ("positions", "loc", "out_cache_loc", "slot_map",
                                                                 "decode_kernel_loc", "qo_indptr", "kv_indptr",
                                                                 "kv_indices", "draft_tokens", "kv_norm_weight",
                                                                 "q_norm_weight")),
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: t.flatten(-2)), error=checks.RankError),
    bad("rank-0d", "a 0-d tensor for a tensor argument", ERROR, tensor_args,
        lambda kw, a, p, ctx: set_arg(kw, a, lambda t: t.reshape(-1)[0].clone() if t.numel() else t.new_zeros(())),
        error=checks.RankError),
    bad("shape-token-mismatch", "one more token row than the other per-token arguments", ERROR,
        _mismatched("token"), lambda kw, a, p, ctx: set_arg(kw, a, lambda t: cat([t, t[:1]], 0)),
        names=lambda op, a: (a, *getattr(MODULES[op], "MISMATCHED", {}).get("token-names", ()))),
    bad("shape-head-mismatch", "one more head than the other arguments have", ERROR,
        _mismatched("head"), lambda kw, a, p, ctx: set_arg(kw, a, lambda t: cat([t, t[:, :1]], 1))),
    bad("shape-dim-mismatch", "one more element on the last axis than the other arguments have", ERROR,
        _mismatched("dim"), lambda kw, a, p, ctx: set_arg(kw, a, lambda t: cat([t, t[..., :1]], -1))),
    bad("shape-gqa-indivisible", "num_heads not a multiple of num_kv_heads (H + 1 KV heads)", ERROR,
        lambda op: ("*",) if _per_request(op) else (), _gqa_indivisible, names=lambda op, a: ("k",)),
    bad("shape-v-wider", "v_head_dim larger than head_dim", ERROR, lambda op: ("*",) if _per_request(op) else (),
        _v_wider, names=lambda op, a: ("v",)),
    # ------------------------------------------------------------------ sizes
    bad("size-t0", "no tokens: legal for qk and mla (empty outputs, nothing written); verify needs a draft token "
        "per request", {op: ERROR if _per_request(op) else ANSWER for op in OPS}, lambda op: ("*",), _t0,
        names=lambda op, a: ("qo_indptr",)),
    bad("size-b0", "no requests (qo_indptr of one entry)", ERROR,
        lambda op: ("*",) if _per_request(op) or hasattr(MODULES[op], "b0") else (), _b0,
        names=lambda op, a: ("qo_indptr",)),
    bad("size-empty-prefix", "every request with an empty prefix (kv_indptr all zero): legal", ANSWER,
        lambda op: ("*",) if _per_request(op) else (),
        lambda kw, a, p, ctx: kw.update(kv_indptr=torch.zeros_like(kw["kv_indptr"]))),
    bad("size-all-padding", "every write slot padding (-1): legal, nothing written", ANSWER,
        lambda op: ("*",) if args_of(op, "slots") else (), _all_padding,
        prepare=lambda op, a, case, p: replace_fields(case, mode="decode")),
    bad("size-head-dim-0", "an empty head dim (Dn = 0 or R = 0)", ERROR,
        lambda op: ("*",) if len(args_of(op, "data", only=("q_nope", "q_rope"))) == 2 else (), _head_dim0,
        params=lambda op, a: st.sampled_from(("Dn", "R")).map(lambda w: {"which": w}),
        names=lambda op, a: ("q_nope", "q_rope")),
)
