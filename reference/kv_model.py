"""The KV model of a speculative-decoding server: a token pool, per-request slot tables, a
unified ring or a paged layout, an optional logical -> physical translation, and the logical
truth of what every request really has (DESIGN.md, "Store-timing timelines").

Layouts (page size 1):
  ``ring``   the unified sliding-window ring (DeepSeek-V4): request r owns the logical slots
             [r·C, (r+1)·C) and position p lives at r·C + p mod C. C = W + L_max, so storing
             a chunk of up to L_max tokens before attention never overwrites the W history
             tokens that the chunk itself attends to; slots wrap around as the request grows.
  ``paged``  slots come from a free list (LIFO, so freed slots are reused at once); the slot
             table maps position -> logical slot; rollback frees the rejected drafts' slots.
``slot_map`` (S_logical,) translates a logical slot into the physical row attention reads
(seed 001's pool: ``reference.mla_fp8_prepare.chain.KVPool.physical`` is the one translation).

Window semantics: a chunk of c tokens at positions [n, n + c) attends to the committed history
[max(0, n − W), n) (one history per request and step, as ``verify_attention`` takes one prefix
per request) plus the chunk itself under the family's draft rule (causal or not).

Truth: ``truth[layer][r]`` (n_r, *row) holds the KV rows of the tokens request r really has
— appended at accept, never touched by a path. The path's own bookkeeping (``table``,
``visible_len``) is kept apart so that path mutants can get it wrong.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reference.mla_fp8_prepare.chain import KVPool

LAYOUTS = ("ring", "paged")


@dataclass(frozen=True)
class KVLayout:
    layout: str  # ring | paged
    num_requests: int  # requests the pool serves (ring: one region each)
    window: int  # W: committed history a chunk attends to
    max_chunk: int  # L_max: widest chunk stored ahead of attention (verify width; prefill uses paged/truth)
    row_shape: tuple[int, ...]  # one token's KV row, e.g. (D,) or (Hkv, D)
    dtype: torch.dtype
    translated: bool = False  # logical slot -> a permuted physical row
    spare: int = 3  # paged: slots beyond twice what the requests hold (a stale-KV mutant leaks slots)
    seed: int = 0

    @property
    def ring_capacity(self) -> int:
        return self.window + self.max_chunk

    def num_slots(self, max_len: int) -> int:
        if self.layout == "ring":
            return self.num_requests * self.ring_capacity
        return 2 * self.num_requests * max_len + self.spare


@dataclass
class KVModel:
    """Physical buffers (one per layer), slot tables, translation and the logical truth."""
    spec: KVLayout
    num_layers: int
    max_len: int  # longest sequence (positions) a request reaches, chunk included
    device: torch.device | str = "cpu"
    buffers: list = field(init=False)
    slot_map: torch.Tensor | None = field(init=False)
    table: list = field(init=False)  # per request: logical slot of each position the path keeps
    visible_len: list = field(init=False)  # per request: how many table entries the path treats as history
    truth: list = field(init=False)  # [layer][request] -> (n, *row) committed KV rows
    free: list = field(init=False)

    def __post_init__(self):
        s = self.spec
        if s.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {s.layout!r}")
        S = s.num_slots(self.max_len)
        g = torch.Generator().manual_seed(s.seed + 101)
        # canary contents: a row never written reads as noise, never as a plausible zero row
        self.buffers = [self._noise((S, *s.row_shape), g) for _ in range(self.num_layers)]
        self.slot_map = torch.randperm(S, generator=g).to(self.device) if s.translated else None
        self.table = [[] for _ in range(s.num_requests)]
        self.visible_len = [0] * s.num_requests
        self.truth = [[self._empty() for _ in range(s.num_requests)] for _ in range(self.num_layers)]
        self.free = list(range(S - 1, -1, -1))  # pop() gives the lowest slot first

    def _noise(self, shape, g):
        x = torch.randn(shape, generator=g) * 3.0
        return x.to(self.spec.dtype).to(self.device)

    def _empty(self):
        return torch.empty((0, *self.spec.row_shape), dtype=self.spec.dtype, device=self.device)

    # ------------------------------------------------------------------ slots
    def alloc(self, r: int, positions: list[int]) -> torch.Tensor:
        """Logical slots for request r's new positions (appended to its table). (c,) int64."""
        out = []
        for p in positions:
            if self.spec.layout == "ring":
                slot = r * self.spec.ring_capacity + p % self.spec.ring_capacity
            else:
                slot = self.free.pop()
            if p < len(self.table[r]):
                self.table[r][p] = slot  # a position reused after rollback (its old slot was freed)
            else:
                assert p == len(self.table[r]), f"request {r}: position {p} after {len(self.table[r])}"
                self.table[r].append(slot)
            out.append(slot)
        return torch.tensor(out, dtype=torch.int64, device=self.device)

    def history_slots(self, r: int) -> torch.Tensor:
        """Logical slots the path reads as request r's history: the last W of its visible table."""
        return torch.tensor(self.history_list(r), dtype=torch.int64, device=self.device)

    def history_list(self, r: int) -> list[int]:
        """``history_slots`` as a host list (for callers that gather a whole batch's slots first)."""
        n = self.visible_len[r]
        return self.table[r][max(0, n - self.spec.window): n]

    def rollback(self, r: int, new_len: int, *, keep_rejected: bool = False) -> None:
        """Forget positions >= new_len (rejected drafts). ``keep_rejected`` is the stale-KV bug:
        the slots stay in the table and in the visible length."""
        if keep_rejected:
            self.visible_len[r] = max(self.visible_len[r], len(self.table[r]))
            return
        dropped = self.table[r][new_len:]
        del self.table[r][new_len:]
        if self.spec.layout == "paged":
            self.free.extend(reversed(dropped))
        self.visible_len[r] = new_len

    def keep_path(self, r: int, start: int, nodes: list[int]) -> None:
        """After a draft tree's accept (paged only): request r's table entries from ``start`` hold the
        tree's chunk slots in chunk order; keep those of ``nodes`` (chunk indices, the accepted path in
        path order) at ``start``, ``start`` + 1, … and free the rest (SGLang: the accepted nodes'
        ``out_cache_loc`` entries go to the request's token table, the others are evicted)."""
        if self.spec.layout != "paged":
            raise ValueError(f"keep_path: a draft tree needs the paged layout, got {self.spec.layout!r}")
        chunk = self.table[r][start:]
        kept = [chunk[i] for i in nodes]
        dropped = [s for i, s in enumerate(chunk) if i not in set(nodes)]
        self.table[r][start:] = kept
        self.free.extend(reversed(dropped))
        self.visible_len[r] = len(self.table[r])

    def physical(self, logical: torch.Tensor) -> torch.Tensor:
        """(T,) logical slots -> physical rows; negative (padding) stays -1 (seed 001's pool)."""
        return KVPool(self.buffers[0], self.slot_map).physical(logical)

    # ------------------------------------------------------------------ truth
    def commit(self, layer: int, r: int, rows: torch.Tensor) -> None:
        self.truth[layer][r] = torch.cat((self.truth[layer][r], rows.to(self.device)))

    def committed(self, r: int) -> int:
        return self.truth[0][r].shape[0]

    def truth_history(self, layer: int, r: int) -> torch.Tensor:
        """(h, *row): the committed rows a chunk of request r attends to now."""
        t = self.truth[layer][r]
        return t[max(0, t.shape[0] - self.spec.window):]

    def truth_slots(self, r: int) -> torch.Tensor:
        """Logical slots where request r's committed history must live (its own table, truncated
        to the committed length: the truth of *where*, for the state check)."""
        n = self.committed(r)
        return torch.tensor(self.table[r][max(0, n - self.spec.window): n], dtype=torch.int64, device=self.device)
