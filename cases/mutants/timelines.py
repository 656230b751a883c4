"""Store-timing mutants: correct kernels used at the wrong time (path mutants), and op
mutants whose bug only a timeline or the KV read side shows.

A path mutant is a ``harness.timeline.Path`` built from *clean, registered* implementations
with one wrong backend decision: no per-kernel parity test can see it (the kernels are
right); the timelines must. ``MUTANTS`` holds op-level ``Impl``s registered like every other
mutant (``cases.mutants.register`` loads this module after the per-op ones).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from harness.registry import Impl
from reference import qk_norm_rope as r


@dataclass(frozen=True)
class PathMutant:
    name: str
    families: tuple[str, ...]  # where the bug is reachable; the kill matrix runs them in order
    change: dict  # Path fields that differ from the family's clean fused path
    uses: tuple[str, ...]  # the registered kernels it runs (each must pass per-kernel parity)
    doc: str
    catches: tuple[str, ...]

    def path(self, reg, family: str):
        from harness import timeline

        return replace(timeline.clean_path(reg, family, **self.change), name=f"{family}:{self.name}", doc=self.doc)


PATH_MUTANTS = [
    PathMutant(
        "path-store-before-attention", ("dsv4-mqa-ring", "dspark-noncausal", "qwen35-gqa"),
        {"verify_store": "as-history"}, ("qk_norm_rope/fused", "verify_attention/fused"),
        doc="seed 000: target-verify stores the chunk into the ring, then attends 1-source over the ring: "
            "drafts become history and see each other (GSM8K 0.950 -> 0.027); every kernel is correct",
        catches=("visible_kv", "attn:o", "gate:verify-2-source")),
    PathMutant(
        "path-stale-rejected-kv", ("dsv4-mqa-ring", "k3-mla-fp8", "qwen35-gqa", "dspark-noncausal"),
        {"keep_rejected": True}, ("qk_norm_rope/fused", "mla_fp8_prepare/fused", "verify_attention/fused"),
        doc="rollback keeps the rejected drafts in the slot table and the visible length: later steps read "
            "their stale KV as history",
        catches=("visible_kv", "attn:o")),
    PathMutant(
        "path-verify-store-skipped", ("qwen35-gqa", "dspark-noncausal", "dsv4-mqa-ring"),
        {"verify_store": "none"}, ("verify_attention/fused",),
        doc="seed 001 class on the ring: the backend's own store of the verify chunk never runs (the "
            "fused prepare did not store it either): accepted tokens' rows are missing later",
        catches=("state", "visible_kv")),
    PathMutant(
        "path-decode-attend-before-store", ("qwen35-gqa", "dspark-noncausal"),
        {"decode_store_first": False}, ("verify_attention/fused",),
        doc="seed 000 mirrored: 1-source decode attends before storing, so the token reads its own slot's "
            "stale row (a rejected draft's, or canary bytes)",
        catches=("visible_kv:chunk", "attn:o")),
    PathMutant(
        "path-untranslated-history-read", ("k3-mla-fp8",),
        {"translate_reads": False}, ("mla_fp8_prepare/fused", "verify_attention/fused"),
        doc="seed 001 on the read side: attention indexes the pool with logical slots while the prepare "
            "wrote the physical rows",
        catches=("visible_kv", "attn:o")),
]


def _rope_swapped_on_kv(*, forward_mode, ring, loc, q, q_norm_weight, eps, cos, sin, positions, rope_dim,
                        rope_style, q_out, kv, kv_norm_weight):
    """kv rotated with the other rope style (neox <-> interleaved); q correct."""
    other = "neox" if rope_style == "interleaved" else "interleaved"
    q_res = r.q_norm_rope(q, q_norm_weight, eps, cos, sin, positions, rope_dim, rope_style, q_out)
    kv_res = r.kv_norm_rope(kv, kv_norm_weight, eps, cos, sin, positions, rope_dim, other)
    if forward_mode == "decode":
        r.ring_store(kv_res, ring, loc)
    return {"q_out": q_res, "kv_out": kv_res}


MUTANTS = [
    Impl("qk_norm_rope", "mutant-rope-style-swapped-kv", "mutant", _rope_swapped_on_kv,
         doc="seed 000 class: rope style swapped on the kv side only, so the ring holds mis-rotated keys",
         catches=("numeric:kv_out", "effect:ring")),
]

# Targeted catalogs for the kill matrix: one fixed subset per op (the same for every
# implementation of that op, clean or not), chosen to contain each per-op proof case.
PARITY_CASES: dict[str, tuple[str, ...]] = {
    "qk_norm_rope": ("dsv4-verify-b1-l3-h16", "dsv4-decode-b1-h16", "tiny-rows-eps-visible", "neox-decode-q-weight",
                     "dsv4-nonunified-verify-b2-l3-h16"),
    "mla_fp8_prepare": ("k3-verify-b1-l3-h8", "translated-pool", "translated-pool-no-capture-loc",
                        "nan-policy-overflow", "descale-0.37"),
    "verify_attention": ("qwen35-tp-h4-l2", "dspark-hkv2-h8-noncausal", "k3-mla-h4-l2-e4m3fnuz", "gqa-hkv2-h4-d128",
                         "tile-boundary-pm1", "tile-boundary-split2", "dspark-hkv4-h8-l7-noncausal",
                         "tree-topk2-qwen35", "many-splits-short-prefix"),
}

# Timelines per op for an op-level implementation: the families that use the op, one
# short named timeline each (plus the one that makes a value-dependent bug reachable).
OP_TIMELINES: dict[str, tuple[str, ...]] = {
    "qk_norm_rope": ("dsv4-mqa-mixed/mixed-padded", "dsv4-mqa-ring/accept-0-to-L", "dsv4-mqa-ring/tiny-activations"),
    "mla_fp8_prepare": ("k3-mla-fp8/accept-0-to-L", "k3-mla-fp8/fallback-write"),
    "verify_attention": ("dspark-noncausal/accept-0-to-L", "qwen35-gqa/accept-0-to-L", "dsv4-mqa-ring/accept-0-to-L",
                         "k3-mla-fp8/accept-0-to-L"),
}
PATH_TIMELINE = "accept-0-to-L"  # a path mutant runs its families' timeline of this script
