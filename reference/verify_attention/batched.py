"""The verify reference chain over the whole batch at once: the same three launches as the
per-request loop of ``reference.verify_attention.chain`` (prefix split partials, draft partial, combine),
each over every request, its prefix padded to the longest one and the padding keys masked.

The loop's chain takes this form when the widths are uniform, there is no tree mask and no mutant
stage, and the padded score tensor stays within ``BATCHED_SCORE_BYTES`` (``batchable``): the
end-to-end engine calls the reference with a hundred requests per step, one set of launches
instead of a hundred. ``verify_attention_batched`` is the same chain as an entry point of its own
(registered as ``reference-batched``), for any batch of uniform widths without a tree mask.

Roundings: those of ``reference.verify_attention.chain`` (``bf16_p``, ``bf16_partials``, ``fp8_q``),
applied at the same places. Up to the order of its fp32 sums the output is the loop's.
"""
from __future__ import annotations

import torch

from reference.verify_attention import chain as r
from reference.checks import UnsupportedError

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
                  is_causal, rnd: r._Roundings = r._Roundings()) -> torch.Tensor:
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
    parts = rnd.prefix(prefix_split_partials_batched(r._rounded(qh, rnd.q_prefix), kp, vp, lens,
                                                     scale=scale * k_scale, v_scale=v_scale,
                                                     num_kv_splits=num_kv_splits, p_dtype=rnd.p_prefix))
    kd = k.float().view(B, L, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, L, D)
    vd = v.float().view(B, L, Hkv, -1).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, L, Dv)
    parts.append(draft_partial_batched(qh, kd, vd, scale=scale, mask=r.draft_mask(L, is_causal, None, dev),
                                       p_dtype=rnd.p_draft))
    return r.combine(parts).transpose(1, 2).reshape(T, H, -1)  # (B, H, L, Dv) -> (T, H, Dv)


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
        m, l_, acc = r._partial(x, v_s, in_split[:, None, None, :], p_dtype)
        out.append((m, l_, acc * v_scale))
    return out


def draft_partial_batched(qh, kd, vd, *, scale, mask, p_dtype=None):
    """Launch 2 over the batch. qh, kd (B, H, L, D); vd (B, H, L, Dv); mask (L, L) -> (m, l, acc).
    ``p_dtype``: P rounded to it before P·V."""
    return r._partial((qh @ kd.transpose(-1, -2)) * scale, vd, mask, p_dtype)


def verify_attention_batched(*, q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale,
                             is_causal=True, k_scale=1.0, v_scale=1.0, num_kv_splits=1, custom_mask=None, o=None,
                             topk=1, model_family="generic", splitkv_switch=True, bf16_p=False, bf16_partials=False,
                             fp8_q=False):
    """The batched chain as an entry point: the contract of ``reference.verify_attention.chain.verify_attention``
    for batches of one verify width without a tree mask (any size: no ``BATCHED_SCORE_BYTES`` cap);
    a ragged batch or a tree mask is an ``UnsupportedError``. Returns {"o": (T, H, Dv) bf16}."""
    B, T, H, Hkv, D, Dv = r.validate(
        q=q, k=k, v=v, k_buffer=k_buffer, v_buffer=v_buffer, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
        kv_indices=kv_indices, sm_scale=sm_scale, is_causal=is_causal, k_scale=k_scale, v_scale=v_scale,
        num_kv_splits=num_kv_splits, custom_mask=custom_mask, o=o, topk=topk, model_family=model_family,
        splitkv_switch=splitkv_switch)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    if custom_mask is not None:
        raise UnsupportedError("custom_mask", "the batched chain computes no tree mask (topk 1 only); "
                                              "reference.verify_attention.chain loops over tree requests")
    if len({qo[b + 1] - qo[b] for b in range(B)}) != 1:
        raise UnsupportedError("qo_indptr", f"the batched chain takes one verify width for every request, got {qo}")
    rnd = r._Roundings.of(k_buffer.dtype, bf16_p=bf16_p, bf16_partials=bf16_partials, fp8_q=fp8_q)
    res = batched_chain(q, k, v, k_buffer, v_buffer, qo, kvp, kv_indices, scale=float(sm_scale),
                        k_scale=float(k_scale), v_scale=float(v_scale), num_kv_splits=int(num_kv_splits),
                        is_causal=bool(is_causal), rnd=rnd)
    return r._finish(res, q, o)
