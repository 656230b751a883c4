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
]


# The kill matrix's targeted catalog subset and timelines per op: its OpSpec.kill (cases/<op>/spec.py).
PATH_TIMELINE = "accept-0-to-L"  # a path mutant runs its families' timeline of this script
