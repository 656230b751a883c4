"""Classes of the layout families: strides, dtypes, ranks and shapes, sizes."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from harness.fuzz.args import ARGS, FLOAT_DATA_KINDS, FP8, INDEX_KINDS, MODULES, OPS, arg, args_of, tensor_args
from harness.fuzz.badclass import BadClass, _A, _E, _any_tensor, _c, _junks, _replace, _set, \
    _two_rows
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
    _c("stride-rows", "rows strided (a slice of a wider tensor whose other columns hold NaN or huge junk), "
       "unit innermost stride: the layout the contract takes", _A,
       lambda op: tuple(a.name for a in ARGS[op] if a.kind in ("data", "buffer") and a.layout in ("rows", "any")),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: rows_view(t, p["junk"])), params=_junks("nan", "huge"), prepare=_two_rows),
    _c("stride-inner", "innermost stride 2 (every other element of an interleaved tensor, junk between): qk and "
       "verify take a unit innermost stride only; mla's contract takes any strides",
       {op: _A if args_of(op, "data", layout=("any",)) else _E for op in OPS},
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
       lambda op: ("*",) if _fp8_kv(op) else (), _foreign_format,
       prepare=lambda op, a, case, p: _replace(case, kv_dtype="e4m3fn") if getattr(case, "kv_dtype", None) == "bf16"
       else case, names=lambda op, a: ("kv_buffer", "k_buffer", "v_buffer")),
    _c("dtype-fp8-mixed", "k_buffer and v_buffer in different fp8 formats", _E,
       lambda op: args_of(op, "data", only=("v_buffer",)),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.view(_swap_fp8(t.dtype))),
       prepare=lambda op, a, case, p: _replace(case, kv_dtype="e4m3fn" if case.kv_dtype == "bf16" else case.kv_dtype),
       error=checks.DTypeError),
    # ------------------------------------------------------------------ ranks and shapes
    _c("rank-extra-dim", "a leading axis of size 1 added", _E, _any_tensor,
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.unsqueeze(0)), error=checks.RankError),
    _c("rank-missing-dim", "the last two axes flattened into one", _E,
       lambda op: tuple(a for a in tensor_args(op) if a not in ("positions", "loc", "out_cache_loc", "slot_map",
                                                                "decode_kernel_loc", "qo_indptr", "kv_indptr",
                                                                "kv_indices", "draft_tokens", "kv_norm_weight",
                                                                "q_norm_weight")),
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.flatten(-2)), error=checks.RankError),
    _c("rank-0d", "a 0-d tensor for a tensor argument", _E, _any_tensor,
       lambda kw, a, p, ctx: _set(kw, a, lambda t: t.reshape(-1)[0].clone()), error=checks.RankError),
    _c("shape-token-mismatch", "one more token row than the other per-token arguments", _E,
       _mismatched("token"), lambda kw, a, p, ctx: _set(kw, a, lambda t: cat([t, t[:1]], 0)),
       names=lambda op, a: (a, *getattr(MODULES[op], "MISMATCHED", {}).get("token-names", ()))),
    _c("shape-head-mismatch", "one more head than the other arguments have", _E,
       _mismatched("head"), lambda kw, a, p, ctx: _set(kw, a, lambda t: cat([t, t[:, :1]], 1))),
    _c("shape-dim-mismatch", "one more element on the last axis than the other arguments have", _E,
       _mismatched("dim"), lambda kw, a, p, ctx: _set(kw, a, lambda t: cat([t, t[..., :1]], -1))),
    _c("shape-gqa-indivisible", "num_heads not a multiple of num_kv_heads (H + 1 KV heads)", _E,
       lambda op: ("*",) if _per_request(op) else (), _gqa_indivisible, names=lambda op, a: ("k",)),
    _c("shape-v-wider", "v_head_dim larger than head_dim", _E, lambda op: ("*",) if _per_request(op) else (),
       _v_wider, names=lambda op, a: ("v",)),
    # ------------------------------------------------------------------ sizes
    _c("size-t0", "no tokens: legal for qk and mla (empty outputs, nothing written); verify needs a draft token "
       "per request", {op: _E if _per_request(op) else _A for op in OPS}, lambda op: ("*",), _t0,
       names=lambda op, a: ("qo_indptr",)),
    _c("size-b0", "no requests (qo_indptr of one entry)", _E,
       lambda op: ("*",) if _per_request(op) or hasattr(MODULES[op], "b0") else (), _b0,
       names=lambda op, a: ("qo_indptr",)),
    _c("size-empty-prefix", "every request with an empty prefix (kv_indptr all zero): legal", _A,
       lambda op: ("*",) if _per_request(op) else (),
       lambda kw, a, p, ctx: kw.update(kv_indptr=torch.zeros_like(kw["kv_indptr"]))),
    _c("size-all-padding", "every write slot padding (-1): legal, nothing written", _A,
       lambda op: ("*",) if args_of(op, "slots") else (), _all_padding,
       prepare=lambda op, a, case, p: _replace(case, mode="decode")),
    _c("size-head-dim-0", "an empty head dim (Dn = 0 or R = 0)", _E,
       lambda op: ("*",) if len(args_of(op, "data", only=("q_nope", "q_rope"))) == 2 else (), _head_dim0,
       params=lambda op, a: st.sampled_from(("Dn", "R")).map(lambda w: {"which": w}),
       names=lambda op, a: ("q_nope", "q_rope")),
)
