"""Planted backend bugs for ``python -m harness timelines --backend tests.plugins.backends_buggy:NAME``
(``tests/test_backends.py``): one per decision a ``harness.backend.Backend`` makes, each wrong in the
same way at every layer and step, so that only checks against the logical request can see it. Every
kernel they run is a clean, registered one.

Also two kernel plugins (``--impl``): ``ACCEPT``, an acceptance implementation that keeps one token
too few whenever a draft was accepted (``--path fused+fused+accept-one-short``), and ``Q_WEIGHT``, a
qk prepare that never applies the q norm weight (only the q-weighted families can see it)."""
from __future__ import annotations

from dataclasses import dataclass

from harness.backend import Backend
from harness.registry import Impl

CLEAN = Backend("clean-plugin", doc="the clean backend, loaded as a plugin")


@dataclass(frozen=True)
class DecodeAttendsFirst(Backend):
    """store timing: 1-source decode attends before storing its token (reads its slot's stale row)."""
    name: str = "decode-attends-first"

    def decode_store_first(self, fam):
        return False


@dataclass(frozen=True)
class RollbackKeepsFreedSlots(Backend):
    """rollback: frees the rejected drafts' slots but leaves them in the page table, visible: the
    next allocation hands the same slots out again while they still read as history."""
    name: str = "rollback-keeps-freed"

    def rollback(self, kv, r, new_len):
        dropped = kv.table[r][new_len:]
        if kv.spec.layout == "paged":
            kv.free.extend(reversed(dropped))
        kv.visible_len[r] = len(kv.table[r])


@dataclass(frozen=True)
class PositionsOffByOne(Backend):
    """positions: every token handed to the prepare op (RoPE) one position late."""
    name: str = "positions-off-by-one"

    def positions(self, r, start, width):
        return list(range(start + 1, start + 1 + width))


@dataclass(frozen=True)
class RingSlotShifted(Backend):
    """slots: each position written one ring slot late, and its table entry with it (consistent
    everywhere: the reads follow the table)."""
    name: str = "ring-slot-shifted"

    def alloc(self, kv, r, start, width):
        out = super().alloc(kv, r, start, width)
        C = kv.spec.ring_capacity
        shifted = r * C + (out - r * C + 1) % C
        for p, s in zip(range(start, start + width), shifted.tolist()):
            kv.table[r][p] = s
        return shifted


@dataclass(frozen=True)
class UntranslatedWrite(Backend):
    """slots: the logical out_cache_loc handed over as the physical write location (seed 001's
    pool without its translation)."""
    name: str = "untranslated-write"

    def physical(self, kv, logical):
        return logical.clone()


@dataclass(frozen=True)
class DecodeOnVerifyBranch(Backend):
    """gate: decode launched on the unified verify branch (no in-kernel store, kv handed back)."""
    name: str = "decode-on-verify-branch"

    def branch(self, fam, mode, layer):
        b = super().branch(fam, mode, layer)
        return "unified-verify" if b == "unified-decode" else b


@dataclass(frozen=True)
class VerifyOnDecodeBranch(Backend):
    """gate: verify launched on the unified decode branch (the in-kernel store before attention)."""
    name: str = "verify-on-decode-branch"

    def branch(self, fam, mode, layer):
        b = super().branch(fam, mode, layer)
        return "unified-decode" if b == "unified-verify" else b


@dataclass(frozen=True)
class NonUnifiedAsUnified(Backend):
    """gate: the non-unified layers run the unified branch (the ring, not the paged fp8 SWA store)."""
    name: str = "non-unified-as-unified"

    def branch(self, fam, mode, layer):
        b = super().branch(fam, mode, layer)
        return {"extend": "unified-extend", "decode": "unified-decode",
                "target_verify": "unified-verify"}[mode] if b == "non-unified" else b


@dataclass(frozen=True)
class UnifiedAsNonUnified(Backend):
    """gate: every layer of a mixed stack on the non-unified branch (the paged fp8 SWA store)."""
    name: str = "unified-as-non-unified"

    def branch(self, fam, mode, layer):
        return "non-unified" if fam.non_unified_layers else super().branch(fam, mode, layer)


def _accept_one_short(**kw):
    from reference.verify_accept import chain as r

    out = r.verify_accept(**kw)
    n = (out["accept_length"] - 1).clamp(min=0)
    return {"output_ids": out["output_ids"], "accept_length": n}


ACCEPT = Impl("verify_accept", "accept-one-short", "external", _accept_one_short,
              doc="keeps one accepted draft too few")


def _drops_q_weight(**kw):
    from reference.qk_norm_rope import chain as r

    return r.qk_norm_rope_step(**{**kw, "q_norm_weight": None})


Q_WEIGHT = Impl("qk_norm_rope", "drops-q-weight", "external", _drops_q_weight,
                doc="a prepare that never applies the q norm weight (right wherever a model passes none)")
