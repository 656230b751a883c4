"""Target-verify attention over a paged prefix plus the draft chunk (seeds 002, 003) — the
unfused per-head split-KV chain (its masks: ``reference.verify_attention.masks``; its dense fp64
oracle: ``reference.verify_attention.oracle``). A batch of one verify width takes the same
launches over every request at once (the batched form, at the end of this module; as an entry point of
its own: ``reference.verify_attention.batched``); the SDPA baseline is ``reference.verify_attention.sdpa``.

Launches of the unfused chain, per query head h (the structure of the per-head kernel):
  1. ``prefix_split_partials``  the prefix of request b cut into ``num_kv_splits`` chunks;
     per chunk s, in fp32: m_s = max_j x_j, l_s = Σ_j exp(x_j − m_s),
     acc_s = v_scale · Σ_j exp(x_j − m_s)·v_j, with x_j = (q·k_j)·(sm_scale·k_scale).
  2. ``draft_partial``  the L draft keys of request b, unscaled by k/v scales:
     x_j = (q·k_j)·sm_scale, masked causally (j ≤ i), fully (non-causal) or by a tree mask.
  3. ``combine``  log-sum-exp merge: M = max(m_*), o = Σ acc_* e^{m_*−M} / Σ l_* e^{m_*−M},
     rounded once to bf16.

Split partition (shared with the kernels): split_len = cdiv(n, S); split s covers
[s·split_len, min((s+1)·split_len, n)); a split may be empty (m = −inf, l = 0, acc = 0).

Roundings (keyword flags, all off by default: the chain above, bitwise): the roundings real
kernels make on purpose, emulated so that ``harness.tolerance.PRECISION_CLASSES`` can derive
an allowance from them (``Roundings``; the per-request loop and its batched form both apply them):
  ``bf16_p``         P = exp(x − m) rounded to bf16 before every P·V product (prefix splits and
                     the draft partial); the row sums l use the unrounded p, as kernels do.
  ``bf16_partials``  each prefix split's normalised partial acc/l rounded to bf16 (a kernel
                     storing bf16 split partials; m and l stay fp32): acc' = bf16(acc/l)·l.
  ``fp8_q``          fp8 KV only: q rounded to the KV fp8 dtype before q·K over the prefix and P
                     rounded to it before P·V over the prefix (SGLang's ``q.to(K_Buffer.dtype)``,
                     ``p.to(v.dtype)``); drafts unaffected. No effect on bf16 KV.
  ``cache_drafts``   fp8 KV only: the drafts stored in the cache dtype before attention and read back
                     from there, as the prefix is (an engine that writes the step's K/V into its cache
                     first, vLLM's backends): k' = fp8(sat(k / k_scale)), v' = fp8(sat(v / v_scale)),
                     saturated to the fp8 dtype's largest finite value; their scores are then scaled by
                     sm_scale·k_scale and their values by v_scale, exactly as the prefix's. No effect on
                     bf16 KV.
All casts are torch's round-to-nearest-even; q and P stay inside the fp8 range (0 ≤ P ≤ 1).

Partition of the P rounding (``online_tile``, keyword, None by default): P is rounded relative to a
maximum, so which weights round depends on where the maxima are taken. The chain takes them per split
and for the draft part; a one-pass kernel keeps one running maximum over the prefix and then the drafts,
updated per tile of keys. ``online_tile=n`` emulates that kernel instead: one pass over the request's
keys (prefix, then drafts) in tiles of n, each key's P = exp(x − m_t) with m_t the running maximum
after its tile, rounded as the roundings say, and rescaled by exp(m_t − M) in fp32 (``online_weights``).
``online_segments=s`` cuts that pass into s segments, each with its own running maximum, merged in fp32
(a split-KV one-pass kernel). The tolerance's variants (``cases/verify_attention/spec.py``) run the
chain with tiles of 16, 32, 64 and 128, and with 16 segments of 16-key tiles, so that an allowance
covers every such kernel by construction.

Layouts: GQA (``D == Dv``, query head h reads KV head h // (H / Hkv)) and MLA (Hkv = 1,
D = 576 = 512 + 64, Dv = 512, V = the first 512 dims of K, passed as a strided view).
fp8 buffers are upcast exactly to fp32; k_scale / v_scale apply to the prefix only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.checks import (
    ShapeError,
    VerifyParityInputError,
    check_bool,
    check_choice,
    check_contiguous,
    check_dtype,
    check_fp32_scale,
    check_index,
    check_index_range,
    check_inner_contiguous,
    check_int,
    check_rank,
    check_same_device,
    check_shape,
    values_read,
)
from reference.launches import launch
from reference.verify_attention.masks import draft_mask, tree_masks

ACT_DTYPES = (torch.bfloat16,)
KV_DTYPES = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz)
INDEX_DTYPES = (torch.int32, torch.int64)
MODEL_FAMILIES = ("generic", "kimi-k3", "qwen3.5", "minimax", "dspark-draft")
# num_kv_splits: at most this many. The kernels launch B·H·S prefix programs and keep (T, H, S, Dv)
# fp32 partials; the benchmarks use at most 64, SGLang's backends 8-64. A split count above a
# request's prefix length is legal (its trailing splits are empty).
MAX_KV_SPLITS = 256


def validate(*, q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale, is_causal=True,
             k_scale=1.0, v_scale=1.0, num_kv_splits=1, custom_mask=None, o=None, topk=1,
             model_family="generic", splitkv_switch=True) -> tuple[int, int, int, int, int, int]:
    """Check every argument; return (B, T, H, Hkv, D, Dv). Shared by every implementation.

    Shapes: q (T, H, D) bf16; k (T, Hkv, D), v (T, Hkv, Dv) bf16; k_buffer (S, Hkv, D),
    v_buffer (S, Hkv, Dv) bf16 or fp8; qo_indptr, kv_indptr (B+1,) int; kv_indices (N,) int;
    custom_mask (Σ_b L_b²,) bool or None; o (T, H, Dv) bf16 or None. Index tensors and the mask
    contiguous. Every request has at least one draft (B ≥ 1, T ≥ B).
    Scalars: sm_scale, k_scale, v_scale and the score scale sm_scale·k_scale normal fp32 numbers;
    num_kv_splits an int in [1, MAX_KV_SPLITS]; topk an int ≥ 1; is_causal, splitkv_switch bools.
    """
    check_rank("q", q, 3)
    T, H, D = q.shape
    check_dtype("q", q, ACT_DTYPES)
    check_inner_contiguous("q", q)
    check_rank("k", k, 3)
    Hkv = k.shape[1]
    check_shape("k", k, (T, Hkv, D))
    check_dtype("k", k, ACT_DTYPES)
    check_inner_contiguous("k", k)
    if Hkv < 1 or H % Hkv:
        raise VerifyParityInputError("k", f"num_heads {H} must be a multiple of num_kv_heads {Hkv}")
    check_rank("v", v, 3)
    Dv = v.shape[2]
    check_shape("v", v, (T, Hkv, Dv))
    check_dtype("v", v, ACT_DTYPES)
    check_inner_contiguous("v", v)
    if Dv > D:
        raise VerifyParityInputError("v", f"v_head_dim {Dv} exceeds head_dim {D}")
    if min(H, Dv) < 1:
        raise ShapeError("q" if H < 1 else "v", f"empty heads: num_heads {H}, head_dim {D}, v_head_dim {Dv}")
    check_rank("k_buffer", k_buffer, 3)
    check_shape("k_buffer", k_buffer, (None, Hkv, D))
    check_dtype("k_buffer", k_buffer, KV_DTYPES)
    check_inner_contiguous("k_buffer", k_buffer)
    check_shape("v_buffer", v_buffer, (k_buffer.shape[0], Hkv, Dv))
    check_dtype("v_buffer", v_buffer, (k_buffer.dtype,))
    check_inner_contiguous("v_buffer", v_buffer)
    check_index("qo_indptr", qo_indptr, (None,), INDEX_DTYPES)
    B = qo_indptr.shape[0] - 1
    if B < 1:
        raise VerifyParityInputError("qo_indptr", f"needs at least 2 entries, got shape {tuple(qo_indptr.shape)}")
    check_index("kv_indptr", kv_indptr, (B + 1,), INDEX_DTYPES)
    check_index("kv_indices", kv_indices, (None,), INDEX_DTYPES)
    if custom_mask is not None:
        check_index("custom_mask", custom_mask, (None,), (torch.bool,))
    # the scalars (no device values needed) before the checks that read the index tensors
    for arg, val in (("sm_scale", sm_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        check_fp32_scale(arg, val)
    check_fp32_scale("k_scale", k_scale, value=float(sm_scale) * float(k_scale))  # the prefix's score scale
    check_bool("is_causal", is_causal)
    check_bool("splitkv_switch", splitkv_switch)
    check_int("num_kv_splits", num_kv_splits, low=1, high=MAX_KV_SPLITS)
    topk = check_int("topk", topk, low=1)
    check_choice("model_family", model_family, MODEL_FAMILIES)
    if values_read():  # outside a call as a CUDA graph runs it (after a validated eager call): host copies
        _check_batch(T=T, B=B, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                     k_buffer=k_buffer, custom_mask=custom_mask, topk=topk)
    if o is not None:
        check_shape("o", o, (T, H, Dv))
        check_dtype("o", o, ACT_DTYPES)
        check_contiguous("o", o)
    check_same_device(q=q, k=k, v=v, k_buffer=k_buffer, v_buffer=v_buffer, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                      kv_indices=kv_indices, custom_mask=custom_mask, o=o)
    return B, T, H, Hkv, D, Dv


def _check_batch(*, T, B, qo_indptr, kv_indptr, kv_indices, k_buffer, custom_mask, topk) -> None:
    """``validate``'s checks of the batch's index values (host copies of the indptrs: one sync)."""
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    if qo[0] != 0 or qo[-1] != T or any(b < a for a, b in zip(qo, qo[1:])):
        raise VerifyParityInputError("qo_indptr", f"must rise from 0 to num_tokens {T}, got {qo}")
    if any(qo[i + 1] == qo[i] for i in range(B)):
        raise VerifyParityInputError("qo_indptr", f"every request needs at least one draft token, got {qo}")
    if kvp[0] != 0 or kvp[-1] > kv_indices.shape[0] or any(b < a for a, b in zip(kvp, kvp[1:])):
        raise VerifyParityInputError("kv_indptr", f"must rise from 0 to at most len(kv_indices) "
                                                  f"{kv_indices.shape[0]}, got {kvp}")
    check_index_range("kv_indices", kv_indices[: kvp[-1]], low=0, high=k_buffer.shape[0])
    check_mask_given(custom_mask, topk)
    if custom_mask is not None:
        n_mask = sum((qo[i + 1] - qo[i]) ** 2 for i in range(B))
        check_shape("custom_mask", custom_mask, (n_mask,))


def check_mask_given(custom_mask, topk: int) -> None:
    """A tree mask is given exactly when topk > 1 (no device value read: a device-checked fused call
    checks it on the host while ``validate`` reads no values)."""
    if (custom_mask is not None) != (topk > 1):
        raise VerifyParityInputError("custom_mask", f"a tree mask is required exactly when topk > 1 (topk={topk}, "
                                                    f"mask {'given' if custom_mask is not None else 'missing'})")


def split_bounds(n: int, num_kv_splits: int) -> list[tuple[int, int]]:
    """[start, end) of every split of an n-token prefix (cdiv partition; trailing splits may be empty)."""
    length = -(-n // num_kv_splits)
    return [(min(s * length, n), min((s + 1) * length, n)) for s in range(num_kv_splits)]


FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def _rounded(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """fp32 ``t`` rounded to ``dtype`` (round to nearest even) and back to fp32; ``t`` itself for None."""
    return t if dtype is None else t.to(dtype).float()


@dataclass(frozen=True)
class Roundings:
    """Where the chain rounds on purpose (None / False: it does not)."""
    q_prefix: torch.dtype | None = None  # q before q·K over the prefix
    p_prefix: torch.dtype | None = None  # P before P·V over the prefix
    p_draft: torch.dtype | None = None  # P before P·V over the drafts
    partials: bool = False  # each prefix split's acc/l to bf16
    drafts: torch.dtype | None = None  # the drafts stored in this (fp8 cache) dtype with the k/v scales

    @staticmethod
    def of(kv_dtype: torch.dtype, *, bf16_p: bool, bf16_partials: bool, fp8_q: bool,
           cache_drafts: bool = False) -> Roundings:
        bf16_p, bf16_partials, fp8_q, cache_drafts = (
            check_bool(a, v) for a, v in (("bf16_p", bf16_p), ("bf16_partials", bf16_partials), ("fp8_q", fp8_q),
                                          ("cache_drafts", cache_drafts)))
        kv8 = kv_dtype if fp8_q and kv_dtype in FP8_KV_DTYPES else None
        p16 = torch.bfloat16 if bf16_p else None
        return Roundings(q_prefix=kv8, p_prefix=kv8 or p16, p_draft=p16, partials=bf16_partials,
                         drafts=kv_dtype if cache_drafts and kv_dtype in FP8_KV_DTYPES else None)

    def stored(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """Draft k or v (bf16) as the chain reads it: itself, or (``drafts``) the value the fp8 cache holds
        for it, fp8(sat(x / scale)) upcast exactly to fp32 (NaN kept); the chain then scales it as the
        prefix's values (scores x sm_scale·k_scale, values x v_scale)."""
        if self.drafts is None:
            return x
        top = torch.finfo(self.drafts).max
        return (x.float() / scale).clamp(-top, top).to(self.drafts).float()

    def prefix(self, parts: list) -> list:
        """Split partials as a kernel storing them in bf16 would combine them: acc' = bf16(acc/l)·l
        (empty splits, l = 0, unchanged)."""
        if not self.partials:
            return parts
        out = []
        for m, l, acc in parts:
            den = l[..., None]  # (..., 1)
            seen = den > 0
            norm = acc / torch.where(seen, den, torch.ones_like(den))  # (..., Dv) fp32
            out.append((m, l, torch.where(seen, _rounded(norm, torch.bfloat16) * den, acc)))
        return out


def _p_kw(dtype: torch.dtype | None) -> dict:
    """The ``p_dtype`` keyword of a launch, only when it rounds (mutant stages do not take it)."""
    return {} if dtype is None else {"p_dtype": dtype}


def _grouped(rows: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """rows (H, L, X) @ right (Hkv, X, Y) -> (H, L, Y), query head h with KV head h // (H / Hkv): a group's
    rows stacked into one product with its KV head (GQA groups are contiguous)."""
    H, L, X = rows.shape
    return (rows.reshape(right.shape[0], H // right.shape[0] * L, X) @ right).view(H, L, right.shape[2])


def _partial(x: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor | None, p_dtype: torch.dtype | None = None):
    """x (..., H, L, N) fp32 scores, vals (..., H or Hkv, N, Dv) fp32, mask broadcastable to x, bool
    -> m (..., H, L), l (..., H, L), acc (..., H, L, Dv). With Hkv value heads, query heads
    h·g … h·g+g−1 read value head h (GQA groups are contiguous): their probabilities are stacked as
    rows of one product, no per-head copy. A row that sees no key gives (−inf, 0, 0). ``p_dtype``:
    P rounded to it before P·V (l sums the unrounded p)."""
    if mask is not None:
        x = x.masked_fill(~mask, float("-inf"))
    m = x.amax(dim=-1)  # (..., H, L)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(x - m_safe[..., None])  # (..., H, L, N)
    *lead, H, L, N = p.shape
    pv = _rounded(p, p_dtype)
    acc = (pv.reshape(*lead, vals.shape[-3], -1, N) @ vals).view(*lead, H, L, -1)  # (Hkv, g·L, N) @ (Hkv, N, Dv)
    return m, p.sum(-1), acc


def split_partial(qh, kp, vp, *, scale, v_scale, p_dtype=None):
    """One split of launch 1: qh (H, L, D) fp32; kp (Hkv, n_s, D), vp (Hkv, n_s, Dv) fp32, the split's
    keys (n_s >= 1) -> (m, l, acc) per query head."""
    x = _grouped(qh, kp.transpose(1, 2)) * scale  # (H, L, n_s)
    m, l, acc = _partial(x, vp, None, p_dtype)
    return m, l, acc * v_scale


@launch
def prefix_split_partials(qh, kp, vp, *, scale, v_scale, num_kv_splits, bounds=split_bounds, p_dtype=None,
                          split_fn=split_partial):
    """Launch 1. qh (H, L, D) fp32; kp (Hkv, n, D), vp (Hkv, n, Dv) fp32 (per KV head; query head h
    reads KV head h // (H / Hkv)) -> list over splits of (m, l, acc) per query head; empty splits
    give (−inf, 0, 0). Each score is its own fp32 dot product; a group's queries share one product
    with their KV head instead of a per-head copy of the prefix (200K tokens × 128 heads would not fit).
    ``p_dtype``: P rounded to it before P·V. ``split_fn``: each split's partial (``split_partial``)."""
    H, L, D = qh.shape
    out = []
    for start, end in bounds(kp.shape[1], num_kv_splits):
        if end <= start:
            out.append((torch.full((H, L), float("-inf"), device=qh.device), torch.zeros(H, L, device=qh.device),
                        torch.zeros(H, L, vp.shape[-1], device=qh.device)))
            continue
        out.append(split_fn(qh, kp[:, start:end], vp[:, start:end], scale=scale, v_scale=v_scale, p_dtype=p_dtype))
    return out


@launch
def draft_partial(qh, kd, vd, *, scale, mask, p_dtype=None):
    """Launch 2. qh (H, L, D); kd (H, L, D); vd (H, L, Dv) fp32; mask (L, L) bool -> (m, l, acc).
    ``p_dtype``: P rounded to it before P·V."""
    x = (qh @ kd.transpose(1, 2)) * scale  # (H, L, D) @ (H, D, L) -> (H, L, L)
    return _partial(x, vd, mask, p_dtype)


@launch
def combine(parts) -> torch.Tensor:
    """Launch 3. Log-sum-exp merge of (m, l, acc) partials -> (H, L, Dv) fp32."""
    M = torch.stack([m for m, _, _ in parts]).amax(0)  # (H, L); finite: the draft part always has a key
    num = sum(acc * torch.exp(m - M)[..., None] for m, _, acc in parts)
    den = sum(l * torch.exp(m - M) for m, l, _ in parts)
    return num / den[..., None]


def _per_head(x: torch.Tensor, H: int) -> torch.Tensor:
    """(N, Hkv, X) -> (H, N, X): the KV head each query head reads (GQA groups are contiguous)."""
    return x.transpose(0, 1).repeat_interleave(H // x.shape[1], dim=0)


def verify_attention(*, q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale, is_causal=True,
                     k_scale=1.0, v_scale=1.0, num_kv_splits=1, custom_mask=None, o=None, topk=1,
                     model_family="generic", splitkv_switch=True, bf16_p=False, bf16_partials=False, fp8_q=False,
                     cache_drafts=False, online_tile=None, online_segments=1, _stages=None):
    """The reference chain. Returns {"o": (T, H, Dv) bf16} (written into ``o`` when given).

    ``bf16_p``, ``bf16_partials``, ``fp8_q``, ``cache_drafts``: emulate a kernel's rounding (module
    docstring; the precision classes of ``harness.tolerance``); off, the chain is bitwise the unrounded
    one. ``online_tile``, ``online_segments``: the one-pass partition of the P rounding (module docstring),
    an int ≥ 1 or None, and an int ≥ 1.
    ``_stages`` (prefix, draft, combine) replaces the launches; only mutants pass it. Without them
    a batch that ``batchable`` takes (one width, no tree mask, its padded
    scores small enough) runs the same launches over every request at once; any other, request by request.
    """
    B, T, H, Hkv, D, Dv = validate(
        q=q, k=k, v=v, k_buffer=k_buffer, v_buffer=v_buffer, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
        kv_indices=kv_indices, sm_scale=sm_scale, is_causal=is_causal, k_scale=k_scale, v_scale=v_scale,
        num_kv_splits=num_kv_splits, custom_mask=custom_mask, o=o, topk=topk, model_family=model_family,
        splitkv_switch=splitkv_switch)
    sm_scale, k_scale, v_scale = float(sm_scale), float(k_scale), float(v_scale)  # numpy scalars: their values
    num_kv_splits, is_causal = int(num_kv_splits), bool(is_causal)
    rnd = Roundings.of(k_buffer.dtype, bf16_p=bf16_p, bf16_partials=bf16_partials, fp8_q=fp8_q,
                       cache_drafts=cache_drafts)
    if online_tile is not None:
        online_tile = check_int("online_tile", online_tile, low=1)
        online_segments = check_int("online_segments", online_segments, low=1)
    k, v = rnd.stored(k, k_scale), rnd.stored(v, v_scale)  # bf16, or the fp8-stored drafts in fp32
    draft_scale, draft_v_scale = (sm_scale * k_scale, v_scale) if rnd.drafts is not None else (sm_scale, 1.0)
    prefix_fn, draft_fn, combine_fn = _stages or (prefix_split_partials, draft_partial, combine)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    if online_tile is not None and _stages is None:
        return finish(online_chain(q, k, v, k_buffer, v_buffer, qo, kvp, kv_indices, custom_mask, sm_scale=sm_scale,
                                    k_scale=k_scale, v_scale=v_scale, draft_scale=draft_scale,
                                    draft_v_scale=draft_v_scale, is_causal=is_causal, rnd=rnd, tile=online_tile,
                                    segments=online_segments),
                      q, o)
    if _stages is None and custom_mask is None and batchable(qo, kvp, H, Dv):  # the same chain, batch at once
        res = batched_chain(q, k, v, k_buffer, v_buffer, qo, kvp, kv_indices, scale=sm_scale,
                            k_scale=k_scale, v_scale=v_scale, num_kv_splits=num_kv_splits,
                            is_causal=is_causal, rnd=rnd, draft_scale=draft_scale, draft_v_scale=draft_v_scale)
        return finish(res, q, o)
    trees = tree_masks(custom_mask, qo)
    res = torch.empty(T, H, Dv, dtype=torch.float32, device=q.device)
    for b in range(B):
        t0, t1 = qo[b], qo[b + 1]
        idx = kv_indices[kvp[b]: kvp[b + 1]].long()
        qh = q[t0:t1].float().transpose(0, 1)  # (H, L, D) bf16 -> fp32
        kp = k_buffer[idx].float().transpose(0, 1)  # (Hkv, n, D) bf16/fp8 -> fp32 (exact)
        vp = v_buffer[idx].float().transpose(0, 1)  # (Hkv, n, Dv)
        parts = rnd.prefix(prefix_fn(_rounded(qh, rnd.q_prefix), kp, vp, scale=sm_scale * k_scale, v_scale=v_scale,
                                     num_kv_splits=num_kv_splits, **_p_kw(rnd.p_prefix)))
        mask = draft_mask(t1 - t0, is_causal, trees[b], q.device)
        parts.append(_scaled_v(draft_fn(qh, _per_head(k[t0:t1].float(), H), _per_head(v[t0:t1].float(), H),
                                        scale=draft_scale, mask=mask, **_p_kw(rnd.p_draft)), draft_v_scale))
        res[t0:t1] = combine_fn(parts).transpose(0, 1)  # (H, L, Dv) -> (L, H, Dv)
    return finish(res, q, o)


def _scaled_v(part, v_scale: float):
    """A (m, l, acc) partial with its values scaled by ``v_scale`` (1.0: the partial itself, bitwise)."""
    if v_scale == 1.0:
        return part
    m, l, acc = part
    return m, l, acc * v_scale


def online_weights(x: torch.Tensor, tile: int, segments: int = 1):
    """One pass over the keys in tiles of ``tile`` with a running maximum: x (H, L, N) fp32 scores (−inf
    where masked) -> (m, p, rescale): m (H, L) the final maximum; p (H, L, N) = exp(x_j − m_t), m_t the
    running maximum after key j's tile (what a kernel rounds before P·V); rescale (H, L, N) =
    exp(m_t − m), the factor its accumulator later takes in fp32. A row with no key: m = −inf, p = 0.
    ``segments``: the pass cut into that many segments of cdiv(N, segments·tile) tiles (a split-KV
    one-pass kernel, vLLM's 3D unified attention), the running maximum restarting in each."""
    H, L, N = x.shape
    n_tiles = -(-N // tile)
    per_seg = -(-N // (segments * tile))  # tiles per segment
    xt = torch.nn.functional.pad(x, (0, n_tiles * tile - N), value=float("-inf")).view(H, L, n_tiles, tile)
    tile_max = xt.amax(-1)  # (H, L, n_tiles)
    m_t = torch.cat([tile_max[..., s: s + per_seg].cummax(-1).values for s in range(0, n_tiles, per_seg)], -1)
    m = tile_max.amax(-1)
    m_key = m_t.repeat_interleave(tile, -1)[..., :N]  # (H, L, N)
    safe = torch.where(torch.isfinite(m_key), m_key, torch.zeros_like(m_key))
    p = torch.exp(x - safe)  # (H, L, N) fp32, exp(-inf) = 0 where masked
    rescale = torch.exp(safe - torch.where(torch.isfinite(m), m, torch.zeros_like(m))[..., None])
    return m, p, rescale


def online_chain(q, k, v, k_buffer, v_buffer, qo, kvp, kv_indices, custom_mask, *, sm_scale, k_scale, v_scale,
                  draft_scale, draft_v_scale, is_causal, rnd: Roundings, tile: int, segments: int) -> torch.Tensor:
    """The chain's per-request math as one pass over prefix + drafts in tiles ->
    (T, H, Dv) fp32: the same scores, masks, scales and roundings as the split chain, P rounded relative
    to the running maximum of its tile instead of its split's (``online_weights``)."""
    T, H, _ = q.shape
    res = torch.empty(T, H, v.shape[2], dtype=torch.float32, device=q.device)
    trees = tree_masks(custom_mask, qo)
    for b in range(len(qo) - 1):
        t0, t1 = qo[b], qo[b + 1]
        idx = kv_indices[kvp[b]: kvp[b + 1]].long()
        n = idx.numel()
        qh = q[t0:t1].float().transpose(0, 1)  # (H, L, D)
        # the prefix per KV head, a group's queries stacked as rows of one product (no per-head copy: 200K
        # tokens x 128 heads x 576 in fp32 asked for 55 GiB on the H100, 2026-12-07)
        kp = k_buffer[idx].float().transpose(0, 1)  # (Hkv, n, D)
        vp = v_buffer[idx].float().transpose(0, 1) * v_scale  # (Hkv, n, Dv)
        kd = _per_head(k[t0:t1].float(), H)
        vd = _per_head(v[t0:t1].float(), H) * draft_v_scale
        xp = _grouped(_rounded(qh, rnd.q_prefix), kp.transpose(1, 2)) * (sm_scale * k_scale)  # (H, L, n)
        xd = (qh @ kd.transpose(1, 2)) * draft_scale  # (H, L, L)
        xd = xd.masked_fill(~draft_mask(t1 - t0, is_causal, trees[b], q.device), float("-inf"))
        _, p, rescale = online_weights(torch.cat((xp, xd), -1), tile, segments)
        wp = _rounded(p[..., :n], rnd.p_prefix) * rescale[..., :n]
        wd = _rounded(p[..., n:], rnd.p_draft) * rescale[..., n:]
        acc = _grouped(wp, vp) + wd @ vd  # (H, L, Dv)
        l = (p * rescale).sum(-1)
        res[t0:t1] = (acc / l[..., None]).transpose(0, 1)
    return res


def finish(res: torch.Tensor, q: torch.Tensor, o: torch.Tensor | None) -> dict:
    """The chain's (T, H, Dv) fp32 result as the op's outputs: {"o": bf16}, written into ``o`` when given
    (shared by the loop, the batched entry and the SDPA baseline)."""
    out = res.to(q.dtype)  # fp32 -> bf16, round to nearest even (the only rounding)
    if o is None:
        return {"o": out}
    o.copy_(out)
    return {"o": o}


# ----------------------------------------------------------------------------- the batched form
# The loop's chain takes this form when the widths are uniform, there is no tree mask and no mutant
# stage, and the padded score tensor stays within ``BATCHED_SCORE_BYTES`` (``batchable``): the
# end-to-end engine calls the reference with a hundred requests per step, one set of launches
# instead of a hundred. Up to the order of its fp32 sums the output is the loop's.

BATCHED_SCORE_BYTES = 1 << 28  # padded scores, partials and values of one batched call at most


def score_bytes(B: int, H: int, L: int, n_max: int, Dv: int) -> int:
    """fp32 bytes of one batched call's padded (B, H, L, n_max + L) scores and (B, H, L, Dv) partials."""
    return B * H * L * (n_max + L + Dv) * 4


def batchable(qo: list[int], kvp: list[int], H: int, Dv: int) -> bool:
    """Whether the loop's chain takes the batch at once: at least two requests of one width whose
    ``score_bytes`` fit ``BATCHED_SCORE_BYTES``."""
    B = len(qo) - 1
    widths = {qo[b + 1] - qo[b] for b in range(B)}
    if len(widths) != 1 or B < 2:
        return False
    L, n_max = widths.pop(), max(kvp[b + 1] - kvp[b] for b in range(B))
    return score_bytes(B, H, L, n_max, Dv) <= BATCHED_SCORE_BYTES


def batched_chain(q, k, v, k_buffer, v_buffer, qo, kvp, kv_indices, *, scale, k_scale, v_scale, num_kv_splits,
                  is_causal, rnd: Roundings = Roundings(), draft_scale=None, draft_v_scale=1.0) -> torch.Tensor:
    """The chain over the whole batch -> (T, H, Dv) fp32: the same three launches as the loop, each
    over every request (``prefix_split_partials_batched``, ``draft_partial_batched``, ``combine``).
    Shape: q (T, H, D), k (T, Hkv, D), v (T, Hkv, Dv) bf16, T = B·L; qo, kvp host lists of B + 1."""
    dev = q.device
    B, L = len(qo) - 1, qo[1] - qo[0]
    T, H, D = q.shape
    Hkv = k.shape[1]
    lens = torch.tensor([kvp[b + 1] - kvp[b] for b in range(B)], device=dev)  # (B,)
    n_max = int(lens.max())
    pos = torch.arange(n_max, device=dev)
    valid = pos[None, :] < lens[:, None]  # (B, N)
    start = torch.tensor(kvp[:-1], device=dev)[:, None]
    idx = torch.where(valid, kv_indices[(start + pos).clamp(max=max(kv_indices.numel() - 1, 0))].long(), 0)
    qh = q.float().view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
    kp = k_buffer[idx].float().transpose(1, 2)  # (B, Hkv, N, D), exact upcast
    vp = v_buffer[idx].float().transpose(1, 2)  # (B, Hkv, N, Dv)
    parts = rnd.prefix(prefix_split_partials_batched(_rounded(qh, rnd.q_prefix), kp, vp, lens,
                                                     scale=scale * k_scale, v_scale=v_scale,
                                                     num_kv_splits=num_kv_splits, p_dtype=rnd.p_prefix))
    kd = k.float().view(B, L, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, L, D)
    vd = v.float().view(B, L, Hkv, -1).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, L, Dv)
    parts.append(_scaled_v(draft_partial_batched(qh, kd, vd, scale=scale if draft_scale is None else draft_scale,
                                                 mask=draft_mask(L, is_causal, None, dev), p_dtype=rnd.p_draft),
                           draft_v_scale))
    return combine(parts).transpose(1, 2).reshape(T, H, -1)  # (B, H, L, Dv) -> (T, H, Dv)


@launch
def prefix_split_partials_batched(qh, kp, vp, lens, *, scale, v_scale, num_kv_splits, p_dtype=None):
    """Launch 1 over the batch. qh (B, H, L, D); kp (B, Hkv, N, D), vp (B, Hkv, N, Dv) fp32, each
    request's prefix padded to N; lens (B,) its true length -> per split, (m, l, acc) of every
    request with the keys outside its split (the cdiv partition of ``split_bounds``) masked.
    ``p_dtype``: P rounded to it before P·V."""
    B, H, L, D = qh.shape
    Hkv, n_max = kp.shape[1], kp.shape[2]
    if n_max == 0:
        return []
    pos = torch.arange(n_max, device=qh.device)
    x = (qh.reshape(B, Hkv, -1, D) @ kp.transpose(-1, -2)).view(B, H, L, n_max) * scale
    split_len = -(-lens // num_kv_splits)  # (B,)
    out = []
    for s in range(num_kv_splits):
        lo = torch.minimum(s * split_len, lens)[:, None]
        hi = torch.minimum(lo + split_len[:, None], lens[:, None])
        in_split = (pos[None, :] >= lo) & (pos[None, :] < hi)  # (B, N)
        # the values outside the split are zeroed as well as their scores masked: P = 0 there, but
        # 0·NaN (a pool row only the padding points at) or 0·Inf (a row of another split) is NaN
        v_s = torch.where(in_split[:, None, :, None], vp, 0.0)  # (B, Hkv, N, Dv)
        m, l_, acc = _partial(x, v_s, in_split[:, None, None, :], p_dtype)
        out.append((m, l_, acc * v_scale))
    return out


@launch
def draft_partial_batched(qh, kd, vd, *, scale, mask, p_dtype=None):
    """Launch 2 over the batch. qh, kd (B, H, L, D); vd (B, H, L, Dv); mask (L, L) -> (m, l, acc).
    ``p_dtype``: P rounded to it before P·V."""
    return _partial((qh @ kd.transpose(-1, -2)) * scale, vd, mask, p_dtype)
