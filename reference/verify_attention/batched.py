"""The verify reference chain over the whole batch at once as an entry point of its own
(registered as ``reference-batched``): ``reference.verify_attention.chain.batched_chain``, the same three
launches as the per-request loop of ``reference.verify_attention.chain`` (prefix split partials, draft
partial, combine), each over every request, its prefix padded to the longest one and the padding keys
masked, for any batch of uniform widths without a tree mask (no ``BATCHED_SCORE_BYTES`` cap).

Roundings: those of ``reference.verify_attention.chain`` (``bf16_p``, ``bf16_partials``, ``fp8_q``),
applied at the same places. Up to the order of its fp32 sums the output is the loop's.
"""
from __future__ import annotations

from reference.verify_attention import chain as r
from reference.checks import UnsupportedError


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
    rnd = r.Roundings.of(k_buffer.dtype, bf16_p=bf16_p, bf16_partials=bf16_partials, fp8_q=fp8_q)
    res = r.batched_chain(q, k, v, k_buffer, v_buffer, qo, kvp, kv_indices, scale=float(sm_scale),
                          k_scale=float(k_scale), v_scale=float(v_scale), num_kv_splits=int(num_kv_splits),
                          is_causal=bool(is_causal), rnd=rnd)
    return r.finish(res, q, o)
