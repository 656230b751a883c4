"""Mutants of verify_attention (seeds 002, 003).

Kernel-level bugs that an argument can express wrap the real Triton kernels (or the real
backend dispatcher) with the wrong argument; bugs inside a loop bound or a mask are expressed
as the reference chain with one launch replaced by its buggy twin (``_stages``), which is
where the same bug would sit in any implementation of the chain.
"""
from __future__ import annotations

from harness.registry import Impl


def _dispatch(**kw):
    from fused.verify_attention import wrapper as f

    return f.verify_attention(**kw)


def _drafts_not_causal(**kw):
    """The backend with the causal mask among drafts dropped (IS_CAUSAL=False always)."""
    return _dispatch(**{**kw, "is_causal": False})


def _is_causal_ignored(**kw):
    """The backend with IS_CAUSAL hard-wired on: DSpark's non-causal drafts get a causal mask."""
    return _dispatch(**{**kw, "is_causal": True})


def _k_scale_on_drafts(**kw):
    """Draft scores multiplied by k_scale too (drafts are bf16, never quantised)."""
    from reference.verify_attention import chain as r

    def draft(qh, kd, vd, *, scale, mask):
        return r.draft_partial(qh, kd, vd, scale=scale * kw["k_scale"], mask=mask)

    return r.verify_attention(_stages=(r.prefix_split_partials, draft, r.combine), **kw)


def _kv_head_offset_straddling(**kw):
    """The real shared-KV kernel launched with BLOCK_H > KV_GROUP_NUM and the can_handle check
    off: one KV-head offset (head_start // KV_GROUP_NUM) for a block spanning two groups."""
    from fused.verify_attention import wrapper as f

    H, Hkv = kw["q"].shape[1], kw["k_buffer"].shape[1]
    group = H // Hkv
    bh = 2
    while bh <= group:
        bh *= 2
    return f.launch("shared_kv", block_h=bh, check=False, **kw)


def _kv_head_can_handle(case, device):
    from cases.verify_attention import catalog as c

    if case.topk != 1 or case.ragged or sum(c.prefix_lengths(case.prefix, case.B, case.seed)) == 0:
        return "the straddling launch needs uniform widths, a prefix and topk 1"
    return True


def _last_partial_tile_dropped(**kw):
    """Each split's prefix loop runs over whole BLOCK_N tiles only: the partial last tile is lost."""
    from fused.verify_attention import config as vc
    from reference.verify_attention import chain as r

    block_n = vc.block_config(kw["q"].shape[2])[1]

    def bounds(n, splits):
        return [(lo, lo + (hi - lo) // block_n * block_n) for lo, hi in r.split_bounds(n, splits)]

    def prefix(qh, kp, vp, **a):
        return r.prefix_split_partials(qh, kp, vp, bounds=bounds, **a)

    return r.verify_attention(_stages=(prefix, r.draft_partial, r.combine), **kw)


def _split_boundary_overlap(**kw):
    """Off-by-one split partition: split s > 0 starts one token early, so every boundary key is
    counted in two splits."""
    from reference.verify_attention import chain as r

    def bounds(n, splits):
        return [(max(0, lo - 1) if s and hi > lo else lo, hi) for s, (lo, hi) in enumerate(r.split_bounds(n, splits))]

    def prefix(qh, kp, vp, **a):
        return r.prefix_split_partials(qh, kp, vp, bounds=bounds, **a)

    return r.verify_attention(_stages=(prefix, r.draft_partial, r.combine), **kw)


def _padded_draft_keys_unmasked(**kw):
    """Seed 002 class: the draft tile padded to 16 rows/keys for tl.dot, the padding not masked —
    padded keys (k = 0, v = 0) get score 0 and join the softmax denominator wherever the draft
    rule lets them (non-causal drafts see every column of the tile)."""
    import torch

    from reference.verify_attention import chain as r

    def draft(qh, kd, vd, *, scale, mask):
        L = kd.shape[1]
        pad = max(16, 1 << (L - 1).bit_length()) - L
        kd = torch.nn.functional.pad(kd, (0, 0, 0, pad))  # (H, L_pad, D), zero keys
        vd = torch.nn.functional.pad(vd, (0, 0, 0, pad))
        causal_like = bool(torch.equal(mask, torch.ones_like(mask).tril()))
        extra = torch.full((L, pad), not causal_like, dtype=torch.bool, device=mask.device)
        return r.draft_partial(qh, kd, vd, scale=scale, mask=torch.cat((mask, extra), 1))

    return r.verify_attention(_stages=(r.prefix_split_partials, draft, r.combine), **kw)


def _shared_kv_at_topk_gt_1(**kw):
    """The backend behind a gate that forgets topk == 1: trees go to the shared-KV kernel, which
    reads no tree mask and applies the causal chain rule instead. The kernel's wrapper refuses a
    tree, so the mutant does what such a backend's launch does: hands the kernel the request
    without its mask, as a chain."""
    from fused.verify_attention import wrapper as f

    if kw.get("topk", 1) > 1:
        chain = {**kw, "topk": 1, "custom_mask": None}
        if f.can_handle("shared_kv", **chain) is True:
            return f.verify_shared_kv(**chain)
    return f.verify_attention(**kw)


def active_splits(lengths: list[int], splits: int) -> int:
    """Splits holding a key of some request: max over requests of cdiv(n, cdiv(n, S)), 0 for
    n = 0 (the cdiv partition of ``reference.verify_attention.chain.split_bounds``)."""
    return max((-(-n // -(-n // splits)) if n else 0 for n in lengths), default=0)


def _unwritten_split_scratch(**kw):
    """The real kernels (shared-KV where it runs, else split-KV) with the prefix launch's grid cut
    to the splits some request fills (``active_splits``) while the combine is told
    num_kv_splits = S: nobody writes the partials of splits >= that count, and the combine
    merges their m/l/acc straight from torch.empty scratch. Zeroed scratch (m = 0, l = 0, acc = 0)
    happens to contribute nothing; NaN scratch turns every output row into NaN. Where neither
    kernel runs (ragged widths, no prefix...), the reference chain, as in the backend."""
    from fused.verify_attention import wrapper as f
    from reference.verify_attention import chain as r

    kind = next((k for k in ("shared_kv", "split_kv") if f.can_handle(k, **kw) is True), None)
    if kind is None:
        return r.verify_attention(**kw)
    lengths = (kw["kv_indptr"][1:] - kw["kv_indptr"][:-1]).tolist()
    return f.launch(kind, prefix_splits=active_splits(lengths, kw["num_kv_splits"]), **kw)


def _unwritten_split_can_handle(case, device):
    from cases.verify_attention import catalog as c
    from cases.verify_attention.spec import kernel_can_handle

    verdict = kernel_can_handle("split_kv")(case, device)
    if verdict is not True:
        return verdict
    lengths = c.prefix_lengths(case.prefix, case.B, case.seed)
    if not any(lengths):  # prefix_splits = 0 reads as "all of them": the mutant would be the real kernel
        return "no request has a prefix: there is no split to leave out of the prefix grid"
    if active_splits(lengths, case.splits) == case.splits:
        return f"each of the {case.splits} splits holds keys of some request: no split is left unwritten"
    return True


def _m(name, fn, doc, catches=("numeric:o",), **extra):
    return Impl("verify_attention", name, "mutant", fn, doc=doc, catches=catches, **extra)


MUTANTS = [
    _m("mutant-drafts-not-causal", _drafts_not_causal,
       "seeds 002/003, mask class: causal mask among drafts missing (draft i sees j > i)"),
    _m("mutant-is-causal-ignored", _is_causal_ignored,
       "seed 003, mask class: IS_CAUSAL ignored, non-causal DSpark drafts masked causally"),
    _m("mutant-k-scale-on-drafts", _k_scale_on_drafts,
       "seeds 002/003, scale class: k_scale applied to bf16 draft scores (only fp8 prefix is scaled)"),
    _m("mutant-kv-head-offset-straddling", _kv_head_offset_straddling,
       "seed 003, addressing class: BLOCK_H does not divide KV_GROUP_NUM, heads of a block use one KV head",
       can_handle=_kv_head_can_handle),
    _m("mutant-last-partial-tile-dropped", _last_partial_tile_dropped,
       "tiling class: the partial last prefix tile of each split is skipped"),
    _m("mutant-split-boundary-overlap", _split_boundary_overlap,
       "split-KV class: off-by-one split partition, boundary keys counted twice"),
    _m("mutant-padded-draft-keys-unmasked", _padded_draft_keys_unmasked,
       "seed 002, padding class: draft tile padded to >= 16 for tl.dot without masking the padding"),
    _m("mutant-shared-kv-at-topk-gt-1", _shared_kv_at_topk_gt_1,
       "seed 002, gate class: shared-KV enabled at topk > 1, tree mask silently replaced by the causal chain"),
    _m("mutant-unwritten-split-scratch", _unwritten_split_scratch,
       "split-KV scratch class (SGLang's combine, 0 x stale NaN): the prefix grid covers only the splits some "
       "request fills, the combine merges all num_kv_splits, reading partials nobody wrote",
       catches=("finite:o@poisoned-alloc",), can_handle=_unwritten_split_can_handle),
]
