"""The serving backend around the kernels of the target-verify path: every decision a server makes
between two kernel launches, as one object (``Backend``) that the store-timing timelines
(``harness.timelines.runner``) and the end-to-end engine (``harness.e2e.engine``) run through. A user's
backend plugs in like an ``Impl``: ``--backend module:attr`` (``load``), a subclass overriding the
decisions it makes differently (docs/plugins.md, "Checking your own backend").

Decisions (each one method, so that a wrong one is one override):
  store policy   ``verify_store``: when the verify chunk is stored — ``pre`` (before attention,
                 causally indexed), ``post`` (after), ``as-history`` (before, then attended 1-source
                 over the ring: every draft sees every other), ``none``; ``decode_store_first``: a
                 1-source decode stores its token before attending;
  rollback       ``rollback(kv, r, n)`` after accept(n): the rejected drafts leave the slot table;
  positions      ``positions(r, start, width)``: what the prepare op (RoPE) is handed;
  draft trees    (``Family.topk`` > 1) ``tree_positions`` (committed length + depth − 1),
                 ``tree_mask`` (attention's custom_mask), ``commit_path`` (the accepted path's slots
                 kept in path order, the rest freed);
  slots          ``alloc`` (the logical ``out_cache_loc`` of new tokens), ``physical`` (where they are
                 written: the pool's translation), ``read_slots`` / ``read_meta`` (the page table
                 attention reads: qo_indptr, kv_indptr, kv_indices);
  gates          ``branch(fam, mode, layer)``: which fused branch a layer's prepare takes — one of
                 ``BRANCHES``: unified extend, unified decode (in-kernel store), unified verify (no
                 store, kv handed back), non-unified (DeepSeek-V4's paged fp8 SWA store in every mode).

What the backend decides is checked against the logical request (``truth_branch`` and the
checks of ``harness.timelines.runner``); nothing here is a truth.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from cases import timeline_family

if TYPE_CHECKING:  # annotations only: reading the declarations imports no torch (python -m harness list)
    import torch

VERIFY_STORES = ("pre", "post", "as-history", "none")
BRANCHES = ("unified-extend", "unified-decode", "unified-verify", "non-unified")
_UNIFIED = {"extend": "unified-extend", "decode": "unified-decode", "target_verify": "unified-verify"}


def truth_branch(fam: timeline_family.Family, mode: str, layer: int) -> str:
    """The branch a layer must take: the family's non-unified layers the paged fp8 SWA store,
    every other layer the unified branch of the step's forward mode."""
    return "non-unified" if layer in fam.non_unified_layers else _UNIFIED[mode]


def branch_mode(branch: str, mode: str) -> str:
    """The forward mode the prepare op is launched with on ``branch`` (non-unified: the step's)."""
    return {v: k for k, v in _UNIFIED.items()}.get(branch, mode)


class Policy(NamedTuple):
    """One layer call's store decisions."""
    policy: str  # post (extend) | decode | pre | post | as-history | none
    backend_stores: bool  # the backend writes the chunk's rows (else the prepare op did)
    store_first: bool  # ... before attention
    one_source: bool  # attention reads the chunk back from the pool


@dataclass(frozen=True)
class Backend:
    """The clean backend: every decision as the family's server makes it. Subclass and override
    one method per decision made differently; ``name`` shows in the path name and the repro line.

    Mutants (``cases/mutants/timelines.py``) are subclasses too: ``families`` (where the bug is
    reachable; the kill matrix runs them in order), ``uses`` (roles of the registered kernels they
    run), ``catches`` (checks expected to flag them)."""
    name: str = "clean"
    doc: str = ""
    families: tuple[str, ...] = ()
    uses: tuple[str, ...] = ("prepare", "attn")
    catches: tuple[str, ...] = ()
    source: str = ""  # "module:attr" when loaded by --backend (``load``); "" for the built-in ones

    # ------------------------------------------------------------------ store policy
    def verify_store(self, fam: timeline_family.Family) -> str:
        """When the verify chunk is stored (``VERIFY_STORES``)."""
        return fam.verify_store

    def decode_store_first(self, fam: timeline_family.Family) -> bool:
        """1-source decode: store the token, then attend (its own row read back)."""
        return True

    def policy(self, fam: timeline_family.Family, mode: str, kv_returned: bool, non_unified: bool = False) -> Policy:
        """The store decisions of one layer call. A non-unified layer's prepare stores its chunk in
        every mode (in a cache of its own: ``Prepare.layer_caches``), and its verify attention reads
        the chunk from there causally indexed: the ``pre`` policy with the chunk read back. A verify
        prepare that handed no kv back leaves the backend nothing to attend to but the ring."""
        from harness.timelines.prepare import prepare_of

        prep = prepare_of(fam)
        store = self.verify_store(fam)
        if store not in VERIFY_STORES:
            raise ValueError(f"backend {self.name}: verify_store: expected one of {VERIFY_STORES}, got {store!r}")
        backend_stores = False if non_unified else prep.backend_stores(mode, kv_returned)
        policy = {"extend": "post", "decode": "decode", "target_verify": store}[mode]
        if mode == "target_verify" and not kv_returned and not non_unified:
            policy = "as-history"
        store_first = policy in ("pre", "as-history") or (policy == "decode" and self.decode_store_first(fam))
        one_source = prep.writes_rows or policy in ("decode", "as-history")
        return Policy(policy, backend_stores, store_first, one_source)

    def store(self, buf: torch.Tensor, loc_phys: torch.Tensor, rows: torch.Tensor) -> None:
        """The backend's own store of chunk rows at their physical slots (padding, loc < 0, skipped)."""
        valid = loc_phys >= 0
        buf[loc_phys[valid]] = rows[valid].to(buf.dtype)

    # ------------------------------------------------------------------ gates
    def branch(self, fam: timeline_family.Family, mode: str, layer: int) -> str:
        """Which fused branch ``layer``'s prepare takes in ``mode`` (``BRANCHES``)."""
        return truth_branch(fam, mode, layer)

    # ------------------------------------------------------------------ positions and slots
    def positions(self, r: int, start: int, width: int) -> list[int]:
        """Positions of request r's new tokens, ``start`` = the tokens it holds (its committed length)."""
        return list(range(start, start + width))

    def alloc(self, kv, r: int, start: int, width: int) -> torch.Tensor:
        """Logical slots (out_cache_loc) of request r's positions [start, start + width), appended
        to its slot table (``reference.kv_model.KVModel.alloc``). (width,) int64."""
        return kv.alloc(r, list(range(start, start + width)))

    def physical(self, kv, logical: torch.Tensor) -> torch.Tensor:
        """Where the rows of ``logical`` slots are written (-1 stays -1)."""
        return kv.physical(logical)

    def read_slots(self, kv, logical: torch.Tensor) -> torch.Tensor:
        """The rows attention reads for ``logical`` history slots."""
        return kv.physical(logical)

    def read_meta(self, kv, owners: list[tuple[int, int]], loc_logical: torch.Tensor, as_history: bool, device
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(qo_indptr int32 (G + 1,), kv_indptr int32 (G + 1,), kv_indices int32 (N,)) of one forward:
        each chunk (``owners``: (request, width) in batch order) reads its request's history — the
        last W of its visible table — plus, when the chunk is history (``as_history``), the other
        chunk tokens, one query group per token. Built on the host, one copy to the device."""
        import torch

        chunk_all = loc_logical.tolist()
        ends, lens, flat, off = [], [], [], 0
        for r, c in owners:
            h = kv.history_list(r)
            chunk = chunk_all[off: off + c]
            for s, e in ([(off + i, off + i + 1) for i in range(c)] if as_history else [(off, off + c)]):
                extra = [x for x in chunk[: s - off] + chunk[e - off:] if x >= 0] if as_history else []
                ends.append(e)
                lens.append(len(h) + len(extra))
                flat += h + extra
            off += c
        idx = self.read_slots(kv, torch.tensor(flat, dtype=torch.int64, device=device))
        kv_indptr = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
        return torch.tensor([0] + ends, dtype=torch.int32, device=device), kv_indptr, idx.to(torch.int32)

    # ------------------------------------------------------------------ draft trees (Family.topk > 1)
    def tree_positions(self, r: int, start: int, parents: list[int]) -> list[int]:
        """Positions of a draft tree's chunk (nodes 1 … L of ``parents``, node 0 the last committed
        token at ``start`` − 1): the committed length + the node's depth − 1."""
        depth = [0] * len(parents)
        for i in range(1, len(parents)):
            depth[i] = depth[parents[i]] + 1
        return [start + d - 1 for d in depth[1:]]

    def tree_mask(self, fam: timeline_family.Family, trees: list[list[int]], device) -> tuple[torch.Tensor | None, int]:
        """(custom_mask (Σ L_b²,) bool, topk) that verify attention is handed for a batch of draft
        trees: chunk token i sees chunk token j when j is i or an ancestor of i (row-major per request,
        verify_attention's layout); the history is seen by every token."""
        import torch

        out = []
        for parents in trees:
            L = len(parents) - 1
            m = torch.zeros(L + 1, L + 1, dtype=torch.bool)
            for i in range(1, L + 1):  # a parent's row is complete before its children's
                m[i] = m[parents[i]]
                m[i, i] = True
            out.append(m[1:, 1:].reshape(-1))
        return torch.cat(out).to(device), fam.topk

    def commit_path(self, kv, r: int, start: int, nodes: list[int]) -> None:
        """After a draft tree's accept: request r's table from ``start`` holds the chunk's slots in
        chunk order; it keeps the accepted path's (``nodes``: chunk indices in path order) and frees
        the others (``reference.kv_model.KVModel.keep_path``)."""
        kv.keep_path(r, start, nodes)

    # ------------------------------------------------------------------ rollback
    def rollback(self, kv, r: int, new_len: int) -> None:
        """After accept: request r keeps ``new_len`` tokens; the rejected drafts leave its table
        (paged: their slots are freed) and its visible length."""
        kv.rollback(r, new_len)


CLEAN = Backend()


class BackendLoadError(ValueError):
    """``--backend module:attr`` names nothing that gives a ``Backend``."""


def load(spec: str) -> Backend:
    """``module:attr`` -> the Backend it names: an instance, a subclass (instantiated with no
    arguments) or a zero-argument callable returning one. Its ``source`` is set to ``spec``, so a
    repro line and a worker process load it again the same way."""
    from dataclasses import replace

    from harness.registry import cwd_on_path

    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise BackendLoadError(f"--backend: expected module:attr, got {spec!r}")
    cwd_on_path()
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, type) and issubclass(obj, Backend):
        obj = obj()
    elif callable(obj) and not isinstance(obj, Backend):
        obj = obj()
    if not isinstance(obj, Backend):
        raise BackendLoadError(f"--backend {spec}: expected a harness.backend.Backend (an instance, a subclass "
                               f"or a callable returning one), got {type(obj).__name__}")
    return replace(obj, source=spec)
