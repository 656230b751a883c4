"""Store-timing mutants: correct kernels used at the wrong time (path mutants), and op
mutants whose bug only a timeline or the KV read side shows.

A path mutant is a ``harness.backend.Backend`` with one wrong decision, run on *clean,
registered* implementations: no per-kernel parity test can see it (the kernels are right); the
timelines must. Op-level store-timing mutants (``Impl``s whose bug only a timeline or the KV read
side shows) are each op's ``TIMELINE_MUTANTS`` in ``cases/<op>/mutants.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from harness.backend import Backend


@dataclass(frozen=True)
class PathMutant(Backend):
    """A backend mutant: ``families`` where the bug is reachable (the kill matrix runs them in
    order), ``uses`` the roles of the registered kernels it runs (``kernels``)."""

    def path(self, reg, family: str):
        from harness.timelines import path as path_mod

        return replace(path_mod.clean_path(reg, family, backend=self), name=f"{family}:{self.name}", doc=self.doc)

    def kernels(self, reg) -> list[str]:
        """Keys of the registered kernels it runs (each must pass per-kernel parity), in registry
        order: its families' clean fused implementations of the roles in ``uses``."""
        from harness.timelines import path as path_mod

        keys = set()
        for family in self.families:
            clean = path_mod.clean_path(reg, family)
            if "prepare" in self.uses and clean.prepare is not None:
                keys.add(clean.prepare.key)
            if "attn" in self.uses:
                keys.add(clean.attn.key)
        return [k for k in reg.impls if k in keys]


class StoreBeforeAttention(PathMutant):
    def verify_store(self, fam):
        return "as-history"


class StaleRejectedKV(PathMutant):
    def rollback(self, kv, r, new_len):
        kv.rollback(r, new_len, keep_rejected=True)


class VerifyStoreSkipped(PathMutant):
    def verify_store(self, fam):
        return "none"


class DecodeAttendBeforeStore(PathMutant):
    def decode_store_first(self, fam):
        return False


class UntranslatedHistoryRead(PathMutant):
    def read_slots(self, kv, logical):
        return logical


# ----------------------------------------------------------------------------- draft-tree commits (Family.topk > 1)

class TreeChainCommit(PathMutant):
    """A chain's rollback after a tree verify: the first a chunk slots stay, whatever the path."""

    def commit_path(self, kv, r, start, nodes):
        kv.rollback(r, start + len(nodes))


class TreePathReversed(PathMutant):
    def commit_path(self, kv, r, start, nodes):
        kv.keep_path(r, start, nodes[::-1])


class TreeRejectedSiblingKept(PathMutant):
    """The evict mask misses one rejected node: a sibling of a path node (or, nothing accepted, a
    rejected first-level node) stays in the table after the path."""

    def commit_path(self, kv, r, start, nodes):
        rejected = [i for i in range(len(kv.table[r]) - start) if i not in nodes]
        kv.keep_path(r, start, nodes + rejected[:1])


class TreeMaskDropped(PathMutant):
    def tree_mask(self, fam, trees, device):
        return None, 1  # the flattened tree under the family's causal rule


class TreePositionsByIndex(PathMutant):
    def tree_positions(self, r, start, parents):
        return list(range(start, start + len(parents) - 1))


PATH_MUTANTS = [
    StoreBeforeAttention(
        "path-store-before-attention", families=("dsv4-mqa-ring", "dspark-noncausal", "qwen35-gqa"),
        uses=("prepare", "attn"),
        doc="seed 000: target-verify stores the chunk into the ring, then attends 1-source over the ring: "
            "drafts become history and see each other (GSM8K 0.950 -> 0.027); every kernel is correct",
        catches=("visible_kv", "attn:o", "gate:verify-2-source")),
    StaleRejectedKV(
        "path-stale-rejected-kv", families=("dsv4-mqa-ring", "k3-mla-fp8", "qwen35-gqa", "dspark-noncausal"),
        uses=("prepare", "attn"),
        doc="rollback keeps the rejected drafts in the slot table and the visible length: later steps read "
            "their stale KV as history",
        catches=("visible_kv", "attn:o", "state:table")),
    VerifyStoreSkipped(
        "path-verify-store-skipped", families=("qwen35-gqa", "dspark-noncausal", "dsv4-mqa-ring"), uses=("attn",),
        doc="seed 001 class on the ring: the backend's own store of the verify chunk never runs (the "
            "fused prepare did not store it either): accepted tokens' rows are missing later",
        catches=("state", "visible_kv")),
    DecodeAttendBeforeStore(
        "path-decode-attend-before-store", families=("qwen35-gqa", "dspark-noncausal"), uses=("attn",),
        doc="seed 000 mirrored: 1-source decode attends before storing, so the token reads its own slot's "
            "stale row (a rejected draft's, or canary bytes)",
        catches=("visible_kv:chunk", "attn:o")),
    UntranslatedHistoryRead(
        "path-untranslated-history-read", families=("k3-mla-fp8",), uses=("prepare", "attn"),
        doc="seed 001 on the read side: attention indexes the pool with logical slots while the prepare "
            "wrote the physical rows",
        catches=("visible_kv", "attn:o")),
    TreeChainCommit(
        "path-tree-chain-commit", families=("qwen35-gqa-tree",), uses=("attn",),
        doc="a chain's rollback after a tree verify: the first a chunk slots are kept instead of the accepted "
            "path's (the path is a root-to-node walk, its nodes rarely the first a)",
        catches=("state", "visible_kv", "attn:o")),
    TreePathReversed(
        "path-tree-path-reversed", families=("qwen35-gqa-tree",), uses=("attn",),
        doc="the accepted path's slots committed in reverse order: the history's rows at the wrong positions",
        catches=("state", "visible_kv", "attn:o")),
    TreeRejectedSiblingKept(
        "path-tree-rejected-sibling-kept", families=("qwen35-gqa-tree",), uses=("attn",),
        doc="the evict mask misses a rejected sibling: its slot stays in the request's table after the path",
        catches=("state:table", "visible_kv", "attn:o")),
    TreeMaskDropped(
        "path-tree-mask-dropped", families=("qwen35-gqa-tree",), uses=("attn",),
        doc="tree verify attended without the tree mask (topk 1, causal over the flattened tree): each node "
            "sees every earlier node, siblings and cousins included",
        catches=("input:tree-mask", "attn:o")),
    TreePositionsByIndex(
        "path-tree-positions-by-index", families=("qwen35-gqa-tree",), uses=("attn",),
        doc="tree nodes positioned by their index in the chunk instead of their depth (RoPE of a chain)",
        catches=("input:positions",)),
]


# The kill matrix's targeted catalog subset and timelines per op: its OpSpec.kill (cases/<op>/spec.py).
PATH_TIMELINE = "accept-0-to-L"  # a path mutant runs its families' timeline of this script
