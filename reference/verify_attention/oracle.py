"""The fp64 oracle of ``verify_attention``: a dense softmax over [prefix ; drafts] per request and KV
head, with the explicit mask of ``reference.verify_attention.masks``."""
from __future__ import annotations

import torch

from reference.verify_attention.masks import dense_mask, tree_masks


def verify_attention_oracle(*, q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale,
                            is_causal=True, k_scale=1.0, v_scale=1.0, custom_mask=None, **_unused):
    """fp64 oracle: dense softmax over [prefix ; drafts] with an explicit mask, per-column score
    scale (sm_scale·k_scale on the prefix, sm_scale on drafts) and v_scale on prefix values.
    Returns {"o": (T, H, Dv) f64}."""
    T, H, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[2]
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    trees = tree_masks(custom_mask, qo)
    dev = q.device  # fp64 where the inputs live: the 200K-token GPU cases would take minutes on the CPU
    out = torch.empty(T, H, Dv, dtype=torch.float64, device=dev)
    g = H // Hkv
    for b in range(len(qo) - 1):
        t0, t1 = qo[b], qo[b + 1]
        L = t1 - t0
        idx = kv_indices[kvp[b]: kvp[b + 1]].long().to(dev)
        n = idx.numel()
        keys = torch.cat((k_buffer[idx].double(), k[t0:t1].double()))  # (n+L, Hkv, D)
        vals = torch.cat((v_buffer[idx].double() * v_scale, v[t0:t1].double()))  # (n+L, Hkv, Dv)
        col_scale = torch.cat((torch.full((n,), sm_scale * k_scale, dtype=torch.float64, device=dev),
                               torch.full((L,), sm_scale, dtype=torch.float64, device=dev)))
        mask = dense_mask(n, L, is_causal, None if trees[b] is None else trees[b].to(dev), dev)
        qb = q[t0:t1].double().reshape(L, Hkv, g, D)  # query head h = kv head h // g, member h % g
        for kh in range(Hkv):
            x = (qb[:, kh].reshape(L * g, D) @ keys[:, kh].T).view(L, g, -1) * col_scale  # (L, g, n+L)
            w = torch.softmax(x.masked_fill(~mask[:, None], float("-inf")), dim=-1)
            out[t0:t1, kh * g:(kh + 1) * g] = (w.reshape(L * g, -1) @ vals[:, kh]).view(L, g, Dv)
    return {"o": out.cpu()}
