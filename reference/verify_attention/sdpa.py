"""An independent baseline of verify attention: torch SDPA per request on dense fp64 K/V with the
explicit (L, n + L) verify mask (``reference.verify_attention.masks.dense_mask``): not a reference chain,
registered as the external implementation ``sdpa``."""
from __future__ import annotations

import torch

from reference.verify_attention.chain import finish, validate
from reference.verify_attention.masks import dense_mask, tree_masks

SDPA_CHUNK_BYTES = 1 << 31  # expanded K/V per SDPA call of verify_attention_sdpa


def _sdpa_row_groups(mask: torch.Tensor, kh: torch.Tensor):
    """Draft rows in groups that each take one SDPA call: [(rows, keys, mask rows)] with rows a
    slice or an index tensor, keys (Hkv, n + L, D). SDPA adds its mask to the scores, so a key
    with a NaN / ±Inf element poisons the rows it is hidden from (−inf + NaN, −inf + Inf are
    NaN); the oracle's softmax never sees such a score. Rows are grouped by which of those keys
    they do not see, and each group's call gets them zeroed (masked there, so never weighted).
    Finite keys (every well-formed case): one group, the keys as they are."""
    hidden = ~mask & ~torch.isfinite(kh).all(-1).all(0)  # (L, n + L): a non-finite key this row must not see
    if not bool(hidden.any()):
        return [(slice(None), kh, mask)]
    patterns, which = torch.unique(hidden, dim=0, return_inverse=True)
    return [(torch.nonzero(which == i).flatten(), torch.where(pat[None, :, None], 0.0, kh), mask[which == i])
            for i, pat in enumerate(patterns)]


def verify_attention_sdpa(*, q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale,
                          is_causal=True, k_scale=1.0, v_scale=1.0, custom_mask=None, o=None, **kw):
    """torch SDPA per request on dense fp64 K/V (prefix pre-scaled by k_scale / v_scale) with the
    explicit (L, n + L) mask — an independent implementation, not a reference. fp64, not fp32: on
    the H200 (torch 2.11, CUDA 13) SDPA's fp32 math path gave 5.364e-4 where a plain fp32
    softmax(q·kᵀ)·v on the same GPU gives 5.040e-4 and fp64 5.046e-4 (an output that cancels terms
    of ~0.5; K3 fp8 case with q_scale 4, 2.8x the allowed error, nightly of 2026-11-29); the
    memory-efficient backend does not take this call (enable_gqa with a mask).

    Non-finite inputs follow the oracle, not SDPA's conventions: a key the mask hides is never
    seen whatever its score (``_sdpa_row_groups``), and a row whose every visible score is −inf
    (q = ±Inf against keys of the opposite sign) is 0/0 = NaN, where SDPA's safe softmax gives 0.
    Both only where some q or key element is not finite; otherwise one SDPA call per head chunk."""
    validate(q=q, k=k, v=v, k_buffer=k_buffer, v_buffer=v_buffer, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
             kv_indices=kv_indices, sm_scale=sm_scale, is_causal=is_causal, k_scale=k_scale, v_scale=v_scale,
             custom_mask=custom_mask, o=o, **kw)
    sm_scale, k_scale, v_scale, is_causal = float(sm_scale), float(k_scale), float(v_scale), bool(is_causal)
    T, H, _ = q.shape
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    trees = tree_masks(custom_mask, qo)
    res = torch.empty(T, H, v.shape[2], dtype=torch.float64, device=q.device)
    for b in range(len(qo) - 1):
        t0, t1 = qo[b], qo[b + 1]
        idx = kv_indices[kvp[b]: kvp[b + 1]].long()
        keys = torch.cat((k_buffer[idx].double() * k_scale, k[t0:t1].double()))  # (n+L, Hkv, D)
        vals = torch.cat((v_buffer[idx].double() * v_scale, v[t0:t1].double()))  # (n+L, Hkv, Dv)
        mask = dense_mask(idx.numel(), t1 - t0, is_causal, trees[b], q.device)
        qh, kh, vh = q[t0:t1].double().transpose(0, 1), keys.transpose(0, 1), vals.transpose(0, 1)
        # only a non-finite q or key makes a score ±Inf / NaN (bf16 / fp8 values times normal fp32 scales stay
        # far inside fp64), and only then can every score of a row be -inf (or a tree row sees no key at all)
        maybe_dead = not (bool(torch.isfinite(qh).all()) and bool(torch.isfinite(kh).all())
                          and bool(mask.any(-1).all()))
        out_b = res[t0:t1]  # (L, H, Dv), a view
        # SDPA expands K/V to every query head it is given: heads go in chunks of one KV head's group
        # whose expanded fp64 K/V stay within SDPA_CHUNK_BYTES (K3 at 200K tokens, 128 heads: 1.7 GB a head)
        g = H // kh.shape[0]
        chunk = max(1, min(g, SDPA_CHUNK_BYTES // (8 * keys.shape[0] * (keys.shape[2] + vals.shape[2]))))
        for rows, kg, mg in _sdpa_row_groups(mask, kh):
            qg = qh[:, rows]  # (H, L_g, D)
            for h0 in range(0, H, chunk):
                h1, j = min(h0 + chunk, (h0 // g + 1) * g), h0 // g
                y = torch.nn.functional.scaled_dot_product_attention(
                    qg[None, h0:h1], kg[None, j: j + 1], vh[None, j: j + 1], attn_mask=mg, scale=sm_scale,
                    enable_gqa=True)[0]  # (h1 - h0, L_g, Dv)
                if maybe_dead:
                    x = (qg[h0:h1] @ kg[j].T).masked_fill(~mg, float("-inf"))  # (h1 - h0, L_g, n + L)
                    y = torch.where((x.amax(-1) == float("-inf"))[..., None], float("nan"), y)
                out_b[rows, h0:h1] = y.transpose(0, 1)
    return finish(res, q, o)
