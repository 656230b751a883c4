"""Classes of the value families: values in tensors (NaN, ±Inf, subnormal, huge, masked, unread),
float scalars, index ranges."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from harness.fuzz.args import MODULES, args_of
from harness.fuzz.badclass import ANSWER, ERROR, BadClass, bad, first_real, junk_params, replace_fields, set_arg, \
    two_rows, with_tokens
from harness.fuzz.declared import FP8
from harness.fuzz.surgery import element_at, fill_, fill_rows_nan, junk_value
from reference import checks


def _index_high(op: str, a: str, kw: dict) -> int:
    """One past the largest legal entry of index argument ``a`` (the op module's ``index_high`` where it has one)."""
    if hasattr(MODULES[op], "index_high"):
        return MODULES[op].index_high(a, kw)
    if a == "positions":
        return kw["cos"].shape[0]
    if a == "loc":
        return kw["ring"].shape[0]
    if a == "kv_indices":
        return kw["k_buffer"].shape[0]
    if a == "out_cache_loc":
        return kw["kv_buffer"].shape[0] if kw["slot_map"] is None else kw["slot_map"].shape[0]
    return kw["kv_buffer"].shape[0]  # slot_map, decode_kernel_loc


def fill_unread_nan(t: torch.Tensor, used: torch.Tensor, size: int) -> None:
    """NaN in every row of ``t`` (``size`` rows) that ``used`` (row indices, negative = padding) does not name."""
    keep = torch.ones(size, dtype=torch.bool)
    keep[used[used >= 0]] = False
    fill_rows_nan(t, torch.nonzero(keep).flatten())


def _nan_unread(kw, a, p, ctx):
    """NaN in every row of ``a`` the call must not read: the op module's ``nan_unread``."""
    MODULES[ctx.op].nan_unread(kw, a, p, ctx)


def _value_at(kind: str):
    """Value classes: one element (nan, inf) or one row (subnormal, huge) of a data tensor."""
    def apply(kw, a, p, ctx):
        t = kw[a]
        if a in ("cos", "sin"):  # a row the positions read
            rows = (int(kw["positions"][first_real(kw["positions"])]),)
        elif a in ("k_buffer", "v_buffer"):  # a pool row the prefix reads
            rows = (int(kw["kv_indices"][0]),)
        else:
            rows = (min(int(p["at"] * t.shape[0]), t.shape[0] - 1),)
        if kind in ("nan", "inf"):
            sub = t[rows]
            idx = rows + element_at(sub, p["at"])
            val = float("nan") if kind == "nan" else p["sign"] * float("inf")
            fill_(t[idx], val)
            return
        if kind == "subnormal":  # bf16: 2^-3 of the smallest normal; fp8: 2^-9
            val = p["sign"] * (torch.finfo(t.dtype).tiny / 8 if t.dtype not in FP8 else 2.0 ** -9)
        else:
            big = float(torch.finfo(t.dtype).max) if getattr(MODULES[ctx.op], "HUGE_IS_MAX", False) else 1e15
            val = p["sign"] * (float(torch.finfo(t.dtype).max) if t.dtype in FP8 else big)
        fill_(t[rows], val)
    return apply


def _nan_masked_key(kw, a, p, ctx):
    """k of the last draft of request 0 gets a NaN in its last dim (the rope part under MLA, where
    v is k's first Dv dims; under GQA v is its own tensor)."""
    last = int(kw["qo_indptr"][1]) - 1
    fill_(kw["k"][last, 0, -1], float("nan"))


def _value_args(op: str, kind: str) -> tuple[str, ...]:
    """The arguments a value class of ``kind`` breaks: the op module's ``value_args``, else its data."""
    mod = MODULES[op]
    return mod.value_args(kind) if hasattr(mod, "value_args") else args_of(op, "data")


def _values_params(op, a):
    return st.fixed_dictionaries({"at": st.floats(0, 1), "sign": st.sampled_from((1.0, -1.0))})


def _dup_write(kw, a, p, ctx):
    t = kw[a].clone()
    if a == "slot_map":
        t[2] = t[1]
    else:
        i, j = first_real(t, 0), first_real(t, 1)
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
        i = first_real(t) if t.numel() else 0
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
    case = with_tokens(case)
    return replace_fields(case, padding=min(getattr(case, "padding", 0), case.T - 1)) if hasattr(case, "T") else case


def _padding_prepare(op, a, case, p):
    return replace_fields(with_tokens(case), padding=max(1, case.padding))


def _indptr_non_monotone(kw, a, p, ctx):
    t = kw[a].clone()
    t[1] = t[2] + 1
    kw[a] = t


def _indptr_ends(kw, a, p, ctx):
    t = kw[a].clone()
    if p["end"] == "first":
        t[0] = 1
    else:
        rows = getattr(MODULES[ctx.op], "indptr_rows", None)  # the rows it indexes, where the op module says
        t[-1] = (rows(a, kw) if rows else kw["q"].shape[0] if a == "qo_indptr" else kw["kv_indices"].shape[0]) + 1
    kw[a] = t


def _unused_tail(kw, a, p, ctx):
    t = kw["kv_indices"]
    kw["kv_indices"] = torch.cat([t, torch.full((3,), junk_value(t.dtype, p["junk"]), dtype=t.dtype, device=t.device)])


CLASSES: tuple[BadClass, ...] = (  # in report order
    # ------------------------------------------------------------------ values in tensors
    bad("value-nan-data", "a NaN in an input tensor (an element the op reads): propagates as the oracle says", ANSWER,
        lambda op: _value_args(op, "nan"), _value_at("nan"), params=_values_params, prepare=two_rows),
    bad("value-inf-data", "a ±Inf in an input tensor", ANSWER, lambda op: _value_args(op, "inf"), _value_at("inf"),
        params=_values_params, prepare=two_rows),
    bad("value-subnormal-data", "a row of subnormals", ANSWER, lambda op: _value_args(op, "subnormal"),
        _value_at("subnormal"), params=_values_params, prepare=two_rows),
    bad("value-huge-data", "a row of huge values (bf16 max for mla's casts, 1e15 where fp32 sums of squares and "
        "scores must stay finite, the fp8 max in fp8 pools)", ANSWER, lambda op: _value_args(op, "huge"),
        _value_at("huge"), params=_values_params, prepare=two_rows),
    bad("value-nan-masked-key", "NaN in the score of a draft key the causal mask hides from every draft but the last "
        "(a dim of k that v does not share): only the last draft's output is NaN", ANSWER,
        lambda op: args_of(op, "data", only=("k",)) if args_of(op, "indptr") else (), _nan_masked_key,
        prepare=lambda op, a, case, p: replace_fields(case, L=max(2, case.L), is_causal=True)),
    bad("value-nan-unread", "NaN in every row a call must not read (rope-table rows off the positions, pool rows "
        "off the prefix: slot 0 included, ring / KV rows it does not write)", ANSWER,
        lambda op: MODULES[op].UNREAD, _nan_unread,
        prepare=lambda op, a, case, p: getattr(MODULES[op], "nan_unread_case", lambda case: case)(case),
        canon=lambda kw, a, p, ctx: getattr(MODULES[ctx.op], "nan_unread_canon", lambda kw: None)(kw)),
    # ------------------------------------------------------------------ scalars
    bad("value-nan-scale", "NaN for a float scalar (eps, kv_descale, sm_scale, k_scale, v_scale)", ERROR,
        lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: float("nan")}), value=lambda p: "nan"),
    bad("value-inf-scale", "+Inf for a float scalar (eps=inf included)", ERROR, lambda op: args_of(op, "float"),
        lambda kw, a, p, ctx: kw.update({a: float("inf")}), value=lambda p: "inf"),
    bad("value-negative-scale", "a negative float scalar", ERROR, lambda op: args_of(op, "float"),
        lambda kw, a, p, ctx: kw.update({a: -0.5}), value=lambda p: "-0.5"),
    bad("value-zero-scale", "0.0 for a float scalar", ERROR, lambda op: args_of(op, "float"),
        lambda kw, a, p, ctx: kw.update({a: 0.0}), value=lambda p: "0.0"),
    bad("value-subnormal-scale", "a float scalar subnormal in fp32, the dtype it is applied in (a GPU may flush it "
        "to 0; kv_descale's reciprocal overflows)", ERROR, lambda op: args_of(op, "float"),
        lambda kw, a, p, ctx: kw.update({a: p["v"]}), params=lambda op, a: st.sampled_from((1e-40, 3e-39)).map(
           lambda v: {"v": v}), value=lambda p: repr(p["v"])),
    bad("value-scale-past-fp32", "a float scalar finite as a Python float, infinite in fp32 (1e39)", ERROR,
        lambda op: args_of(op, "float"), lambda kw, a, p, ctx: kw.update({a: 1e39}), value=lambda p: "1e+39"),
    # ------------------------------------------------------------------ index ranges
    bad("index-negative", "a negative entry where negative is not padding", ERROR,
        lambda op: args_of(op, "index", "map"), _entry("negative"), prepare=_real_entry,
        value=lambda p: p["_value"]),
    bad("index-past-end", "an entry one past the table / pool", ERROR, lambda op: args_of(op, "index", "slots", "map"),
        _entry("past-end"), prepare=_real_entry, value=lambda p: p["_value"]),
    bad("index-huge", "an entry near the index dtype's max (2**31 - 1, 2**40)", ERROR,
        lambda op: args_of(op, "index", "slots", "map"), _entry("huge"), prepare=_real_entry,
        value=lambda p: p["_value"]),
    bad("index-duplicate-writes", "two tokens write the same slot", ERROR, lambda op: args_of(op, "slots", "map"),
        _dup_write, prepare=lambda op, a, case, p: replace_fields(with_tokens(case), padding=0),
        error=checks.RangeError),
    bad("index-duplicate-reads", "two tokens read the same position / pool row: legal", ANSWER,
        lambda op: args_of(op, "index"), _dup_read, prepare=lambda op, a, case, p: with_tokens(case)),
    bad("index-padding-junk", "padding write slots as the dtype's most negative value instead of -1: legal", ANSWER,
        lambda op: args_of(op, "slots"), _padding_junk, prepare=_padding_prepare,
        canon=lambda kw, a, p, ctx: set_arg(kw, a, lambda t: torch.where(t < 0, torch.full_like(t, -1), t))),
    bad("index-unused-tail", "kv_indices longer than kv_indptr[-1], the unused tail junk: legal", ANSWER,
        lambda op: args_of(op, "index", only=("kv_indices",)), _unused_tail,
        params=junk_params("huge", "negative"), canon=lambda kw, a, p, ctx: None),
    bad("index-indptr-non-monotone", "an indptr that falls", ERROR, lambda op: args_of(op, "indptr"),
        _indptr_non_monotone, prepare=lambda op, a, case, p: replace_fields(case, B=max(2, getattr(case, "B", 1)))),
    bad("index-indptr-ends", "an indptr not starting at 0 or ending past the tokens / indices", ERROR,
        lambda op: args_of(op, "indptr"), _indptr_ends,
        params=lambda op, a: st.sampled_from(("first", "last")).map(lambda e: {"end": e})),
)
