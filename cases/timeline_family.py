"""One model family of the store-timing timelines (``cases.timelines``): its attention layer stack.

Every family is in ``cases.timelines.FAMILIES``; one whose prepare step is a fused op is declared
by that op, in its ``cases/<op>/catalog.py`` (``TIMELINE_FAMILIES``), the others in ``cases.timelines``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One model family's attention layer stack (tiny shapes: CI runs it on the interpreter)."""
    name: str
    layout: str  # ring | paged (reference.kv_model)
    # the op of role ``prepare`` its layers run (a family of that op's ``cases/<op>/catalog.py``
    # TIMELINE_FAMILIES), or ``projection``: plain q/k/v matmuls, no fused op
    prepare: str
    H: int  # num_heads
    Hkv: int  # num_kv_heads
    D: int  # head_dim (mla: Dn + R)
    Dv: int  # v_head_dim
    rope_dim: int  # qk: rotated dims; mla: the k_rope width R
    causal: bool  # draft rule in verify
    model_family: str  # what verify_attention's gate sees
    verify_store: str  # the clean backend's verify store: pre (causally indexed, before attention) | post
    translated: bool = False  # logical out_cache_loc -> another physical row
    kv_descale: float = 1.0  # mla fp8 scale (a power of two: dequantised rows are exact in bf16)
    layers: int = 2
    d_model: int = 32
    splits: int = 2  # num_kv_splits
    # qk_norm_rope: the non-unified layers (the paged fp8 SWA cache, ``page_size`` tokens a page,
    # instead of the ring; the kernel stores in every mode and attention reads the rows decoded)
    non_unified_layers: tuple[int, ...] = ()
    page_size: int = 4
    # qk_norm_rope: an RMSNorm weight on q too (DeepSeek-V4 passes none; a model that does runs the
    # q-side weight path, whose bugs only this shows)
    q_weight: bool = False
    # the nightly's timeline workers for it relative to the other families (harness.nightly.plan.parity_jobs)
    nightly_weight: float = 1.0
    # a small twin of another family: the nightly runs it in that family's step, with its workers
    nightly_with: str = ""
