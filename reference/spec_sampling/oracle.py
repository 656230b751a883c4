"""The fp64 oracle of ``spec_sampling``: the same rule (``reference.spec_sampling.chain``) from NumPy
in float64 and a Python loop per request, independently of torch's softmax, gather and cumsum.

With ``uniforms`` it returns the outputs the chain must give (the catalog keeps every uniform at
least 1e-4 from a decision boundary, so fp32 and fp64 decide alike). Always: the target
distributions ``target_probs`` (B, L + 1, V) and the acceptance probabilities ``accept_probs``
(B, L) = Σ_v min(p_j(v), q_j(v)) in float64 — what the distributional check tests emitted tokens
and accepted lengths against (``cases/spec_sampling/distribution.py``).
"""
from __future__ import annotations

import numpy as np
import torch

PAD_ID = -1


def sampling_tables(target_logits, temperature, draft_probs) -> tuple[np.ndarray, np.ndarray]:
    """(p (B, L + 1, V) float64: softmax(logits / temperature); alpha (B, L) float64: Σ min(p_j, q_j))."""
    x = target_logits.detach().cpu().double().numpy() / temperature.detach().cpu().double().numpy()[:, None, None]
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    p = e / e.sum(axis=-1, keepdims=True)
    q = draft_probs.detach().cpu().double().numpy()
    return p, np.minimum(p[:, :-1], q).sum(axis=-1)


def spec_sampling_oracle(*, target_logits, temperature, draft_probs, draft_tokens, uniforms=None, **_unused):
    """``target_probs`` and ``accept_probs`` always; ``output_ids`` (B, L + 1) int32 and
    ``accept_length`` (B,) int32 from a float64 walk when ``uniforms`` are given."""
    p, alpha = sampling_tables(target_logits, temperature, draft_probs)
    out = {"target_probs": torch.from_numpy(p), "accept_probs": torch.from_numpy(alpha)}
    if uniforms is None:
        return out
    q = draft_probs.detach().cpu().double().numpy()
    d = draft_tokens.detach().cpu().long().numpy()
    u = uniforms.detach().cpu().double().numpy()
    B, L = d.shape
    ids = np.full((B, L + 1), PAD_ID, dtype=np.int32)
    n = np.zeros(B, dtype=np.int32)
    for b in range(B):
        k = 0
        while k < L and u[b, k] * q[b, k, d[b, k]] < p[b, k, d[b, k]]:
            ids[b, k] = d[b, k]
            k += 1
        w = np.maximum(p[b, k] - (q[b, k] if k < L else 0.0), 0.0)
        if w.sum() <= 0:
            w = p[b, k]
        c = np.cumsum(w)
        above = np.nonzero(c > u[b, L] * c[-1])[0]
        ids[b, k] = above[0] if above.size else np.nonzero(w > 0)[0][-1]
        n[b] = k
    out.update(output_ids=torch.from_numpy(ids), accept_length=torch.from_numpy(n))
    return out
