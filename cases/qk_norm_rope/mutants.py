"""Mutants of qk_norm_rope (seed 000), the unified ring's and the non-unified paged store's."""
from __future__ import annotations

from harness.registry import Impl


def _rope_swapped_on(side: str):
    """The chain with ``side`` ("q" or "kv") rotated with the other rope style (neox <-> interleaved),
    the other side correct."""
    def step(*, forward_mode, ring, loc, q, q_norm_weight, eps, cos, sin, positions, rope_dim, rope_style, q_out, kv,
             kv_norm_weight):
        from reference.qk_norm_rope import chain as r

        other = "neox" if rope_style == "interleaved" else "interleaved"
        q_res = r.q_norm_rope(q, q_norm_weight, eps, cos, sin, positions, rope_dim,
                              other if side == "q" else rope_style, q_out)
        kv_res = r.kv_norm_rope(kv, kv_norm_weight, eps, cos, sin, positions, rope_dim,
                                other if side == "kv" else rope_style)
        if forward_mode == "decode":
            r.ring_store(kv_res, ring, loc)
        return {"q_out": q_res, "kv_out": kv_res}

    step.__doc__ = f"{side} rotated with the other rope style (neox <-> interleaved); the other side correct."
    return step


def _eps_outside_sqrt(*, forward_mode, ring, loc, q, q_norm_weight, eps, cos, sin, positions, rope_dim,
                      rope_style, q_out, kv, kv_norm_weight):
    """x / (sqrt(mean(x²)) + eps) instead of x * rsqrt(mean(x²) + eps)."""
    from reference.qk_norm_rope import chain as r

    def norm_rope(x, w):
        xf = x.float()
        y = xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps)
        y = y if w is None else y * w.float()
        return r.rope_fp32(y, cos[positions], sin[positions], rope_dim, rope_style).to(x.dtype)

    q_res = norm_rope(q, q_norm_weight)
    if q_out is not None:
        q_res = q_out.copy_(q_res)
    kv_res = norm_rope(kv, kv_norm_weight).contiguous()
    if forward_mode == "decode":
        r.ring_store(kv_res, ring, loc)
    return {"q_out": q_res, "kv_out": kv_res}


def _store_left_on_in_verify(**kw):
    """The real fused kernel behind a gate that keeps the in-kernel ring store in target-verify
    (and so hands no kv back): the 0.950 -> 0.027 GSM8K bug of seed 000."""
    from fused.qk_norm_rope import wrapper as f

    def bad_gate(*, unified, forward_mode, verify_switch, fused_non_unified=True):
        use = unified and forward_mode in ("decode", "target_verify")
        return f.QkNormRopeDecision(use_fused=use, in_kernel_store=use, return_kv=not use)

    return f.qk_norm_rope_step(gate_fn=bad_gate, **kw)


def _verify_gate_drops_unified(*, unified, forward_mode, verify_switch, fused_non_unified=True):
    """``fused.qk_norm_rope.wrapper.gate`` with ``unified and`` dropped from the verify test: a non-unified
    layer in target-verify is sent down the unified-verify branch (no in-kernel store) and, not
    being unified, hands no kv back either, so nobody stores its chunk."""
    from fused.qk_norm_rope import wrapper as f

    fuse_verify = verify_switch and forward_mode == "target_verify"
    use = (unified and (forward_mode == "decode" or fuse_verify)) or (not unified and fused_non_unified)
    in_kernel = use and not fuse_verify  # BUG: should be `not (unified and fuse_verify)`
    return f.QkNormRopeDecision(use_fused=use, in_kernel_store=in_kernel,
                                return_kv=not use or (unified and fuse_verify))


def _nonunified_skips_paged_store(**kw):
    """The real fused step behind that gate: non-unified verify leaves its pages stale."""
    from fused.qk_norm_rope import wrapper as f

    return f.qk_norm_rope_step(gate_fn=_verify_gate_drops_unified, **kw)


def _chain_with_store(kw, store):
    """The reference chain's two launches, then ``store(kv_out, swa_cache, loc, layout)`` on a
    non-unified layer (the chain's own store otherwise)."""
    from reference.qk_norm_rope import chain as r
    from reference.qk_norm_rope import swa

    kw = dict(kw)
    forward_mode, ring, loc = kw.pop("forward_mode"), kw.pop("ring"), kw.pop("loc")
    swa_cache, page_size = kw.pop("swa_cache", None), kw.pop("swa_page_size", None)
    if swa_cache is None:
        return r.qk_norm_rope_step(forward_mode=forward_mode, ring=ring, loc=loc, **kw)
    r.validate(ring=None, loc=loc, swa_cache=swa_cache, swa_page_size=page_size, **kw)
    q_out, kv_out = r.qk_norm_rope(**kw)
    store(kv_out, swa_cache, loc, swa.SwaLayout(kv_out.shape[1], int(kw["rope_dim"]), int(page_size)))
    return {"q_out": q_out, "kv_out": kv_out}


def _bf16_row_store(kv_out, swa_cache, loc, lay):
    """The unified ring's store on the paged pool (``bf16_store`` left on): each token's whole bf16
    row, 2·D bytes, at its value record; no fp8, no scales, and it runs over the next records."""
    import torch

    valid = loc >= 0
    slot_id = loc[valid].long()
    page, slot = slot_id // lay.page_size, slot_id % lay.page_size
    row = kv_out[valid].contiguous().view(torch.uint8)  # (n, 2D)
    flat = swa_cache.view(-1)
    at = page[:, None] * swa_cache.shape[1] + lay.value_offset(slot)[:, None] + torch.arange(row.shape[1],
                                                                                             device=row.device)
    ok = at < flat.numel()
    flat[at[ok]] = row[ok]


def _bf16_row_in_fp8_cache(**kw):
    return _chain_with_store(kw, _bf16_row_store)


def _floor_exponent_store(kv_out, swa_cache, loc, lay):
    """The paged store with the tile exponent floor(log2(amax/448)) instead of the ceiling: every
    tile's largest values scale past 448 and saturate."""
    import torch

    from reference.qk_norm_rope import swa

    def floor_exp(amax):
        return torch.floor(torch.log2(amax.clamp_min(swa.SWA_AMAX_FLOOR) / swa.SWA_FP8_MAX)).to(torch.int32)

    swa.swa_paged_store(kv_out, swa_cache, loc, lay, exponent=floor_exp)  # BUG


def _scale_exponent_floored(**kw):
    return _chain_with_store(kw, _floor_exponent_store)


def _pad_byte_store(kv_out, swa_cache, loc, lay):
    """The paged store writing the whole scale record, its pad byte zeroed too."""
    from reference.qk_norm_rope import swa

    swa.swa_paged_store(kv_out, swa_cache, loc, lay)
    valid = loc >= 0
    slot_id = loc[valid].long()
    page, slot = slot_id // lay.page_size, slot_id % lay.page_size
    swa_cache[page, lay.scale_offset(slot) + lay.tiles] = 0  # BUG: the reader's pad, not ours


def _pad_byte_written(**kw):
    return _chain_with_store(kw, _pad_byte_store)


MUTANTS = [
    Impl("qk_norm_rope", "mutant-rope-style-swapped-q", "mutant", _rope_swapped_on("q"),
         doc="seed 000 class: rope style swapped on q only (GPT-J pairs vs neox halves)",
         catches=("numeric:q_out",)),
    Impl("qk_norm_rope", "mutant-eps-outside-sqrt", "mutant", _eps_outside_sqrt,
         doc="RMSNorm with eps added outside the square root; visible only when mean(x²) ~ eps",
         catches=("numeric:q_out", "numeric:kv_out")),
    Impl("qk_norm_rope", "mutant-store-left-on-in-verify", "mutant", _store_left_on_in_verify,
         doc="seed 000: in-kernel ring store left on in target-verify; drafts become history",
         catches=("untouched:ring", "numeric:kv_out")),
    Impl("qk_norm_rope", "mutant-nonunified-skips-paged-store", "mutant", _nonunified_skips_paged_store,
         doc="gate with `unified and` dropped from the verify branch: a non-unified verify chunk is never stored",
         catches=("effect:swa_cache", "finite:swa_cache")),
    Impl("qk_norm_rope", "mutant-bf16-row-in-fp8-cache", "mutant", _bf16_row_in_fp8_cache,
         doc="the ring's bf16 row store on the paged fp8 pool (bf16_store left on)",
         catches=("effect:swa_cache", "untouched:swa_cache")),
    Impl("qk_norm_rope", "mutant-scale-exponent-floored", "mutant", _scale_exponent_floored,
         doc="tile exponent floor(log2(amax/448)) for the ceiling: each tile's largest values saturate at 448",
         catches=("effect:swa_cache",)),
    Impl("qk_norm_rope", "mutant-pad-byte-written", "mutant", _pad_byte_written,
         doc="the store writes its scale record's pad byte (zero): a byte it does not own",
         catches=("untouched:swa_cache",)),
]


# store-timing: its bug shows in the timelines (the ring holds mis-rotated keys); registered after
# every op's MUTANTS (cases.mutants.register)
TIMELINE_MUTANTS = [
    Impl("qk_norm_rope", "mutant-rope-style-swapped-kv", "mutant", _rope_swapped_on("kv"),
         doc="seed 000 class: rope style swapped on the kv side only, so the ring holds mis-rotated keys",
         catches=("numeric:kv_out", "effect:ring")),
]
