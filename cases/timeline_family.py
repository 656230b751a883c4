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
    # a draft *tree* (EAGLE-2/3 at top-k > 1): each verify chunk of L nodes is a tree of this depth, at most
    # ``topk`` children a node, attended under its tree mask and accepted by the op of role ``tree-accept``
    # (the accepted root-to-node path is what the backend commits). 1: a chain (the accept role, L drafts)
    topk: int = 1
    depth: int = 0  # a tree family's tree depth (its longest acceptable path); 0 for a chain

    def __post_init__(self):
        if self.topk < 1:
            raise ValueError(f"family {self.name!r}: topk: expected >= 1, got {self.topk}")
        if self.topk > 1:
            # a ring puts each token at the slot of its position (r·C + p mod C): the siblings of a tree
            # share positions, so they would share (overwrite) one slot. A tree needs slots of its own
            # per node: the paged layout, where every node gets a fresh slot and the accepted path's slots
            # are kept in path order (reference.kv_model.KVModel.keep_path)
            if self.layout != "paged":
                raise ValueError(f"family {self.name!r}: a draft tree (topk={self.topk}) needs the paged layout: "
                                 f"on a {self.layout!r} layout siblings at one position share one slot")
            if self.depth < 1:
                raise ValueError(f"family {self.name!r}: a draft tree (topk={self.topk}) needs depth >= 1, "
                                 f"got {self.depth}")
        elif self.depth:
            raise ValueError(f"family {self.name!r}: depth {self.depth} without a tree (topk 1): a chain's depth is L")

    @property
    def tree(self) -> bool:
        """Whether its verify chunks are draft trees (topk > 1)."""
        return self.topk > 1

    def max_nodes(self) -> int:
        """The most nodes a tree of ``depth`` levels and at most ``topk`` children a node holds (its L)."""
        return sum(self.topk ** k for k in range(1, self.depth + 1))
