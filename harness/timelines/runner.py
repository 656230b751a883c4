"""Store-timing timeline runner: a *path under test* lives through a timeline, and every step of
every layer is compared with the logical truth (DESIGN.md, "Store-timing timelines").

A path = the implementations per op (any registered ``Impl``: fused, reference, external,
mutant; for prepare, attention and acceptance) + the backend (``harness.backend.Backend``: its
store policy, rollback, positions, slots and gates). The truth comes from the timeline script and
the reference model only: the positions, the accepted count (``V:r.a``) and the history of each
request, never from the path. What the backend hands each launch is checked against it.

Checks per (step, layer), each a ``harness.compare.Record`` tagged with its family:
  timeline  input:positions     the positions the prepare op is handed equal the request's;
            input:out_cache_loc the slots written: on a ring where the layout puts each position,
                                in a paged pool fresh slots (no committed row overwritten, none twice);
            input:loc-physical  the physical rows written are the pool's translation of those slots;
            input:attn-indptr   attention's qo/kv indptr: each chunk's width and history length;
            prepare:*  the prepare op's outputs against its fp64 oracle at the request's positions
                       (exact bytes for fp8);
            finite:*   before each numeric check (prepare:*, attn): the oracle's NaN/±Inf placement;
            visible_kv every row attention read from the pool equals the logical history, row
                       count included (rejected drafts, stale or mistranslated slots show here);
            attn       the attention output against the fp64 oracle over the *logical* history +
                       the chunk, under the family's draft rule (tolerance: harness.tolerance);
            accept:n   (verify steps, layer -1) the path's acceptance op on target logits whose greedy
                       acceptance is the script's: the n the backend then rolls back to;
            accept:path, input:tree-mask  (a tree family's verify: ``harness.timelines.tree``) the
                       tree acceptance op's accepted rows are the script's path, the path whose slots
                       the backend then commits in path order; the mask attention is handed is each
                       node's ancestors (the oracle takes the truth's);
            state      after the step, every committed row in the window sits where the slot
                       table says, byte-exact (and in a non-unified layer's own cache); the slot table
                       holds exactly the committed tokens (``state:table``).
  gate      gate:branch: the fused branch each layer took (``harness.backend.BRANCHES``) is the one its
            layer needs; what the prepare launch wrote (nothing in extend/verify, kv handed back; each
            row exactly once in decode and for fp8 MLA; on a non-unified qk layer its rows' records
            of the paged fp8 SWA cache in every mode, no other byte) and that verify attention was
            2-source (a non-unified layer's chunk is read back from its cache, decoded: as ``pre``).
The KV rows are teacher-forced: layer k's oracle takes the path's own inputs to layer k, and the
committed rows are the path's once its prepare matched the oracle at the request's positions, so
rounding differences do not compound while a wrong KV row is still caught at the first read.

The ops enter by role (``harness.timelines.prepare``): a family's prepare step is the op its
``Family.prepare`` names, through that op's ``Prepare`` adapter; attention is the registry's one op
of role ``attn``, acceptance its one op of role ``accept``. Here: the runner (``TimelineRun``,
``run_timeline``). The path and its records are ``harness.timelines.path``, the attention and
acceptance launches with their checks ``harness.timelines.launches``; their names are re-exported.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from cases import timelines as tl
from cases import timeline_family
from harness import compare
from harness.timelines import truth as timeline_truth
from harness.backend import CLEAN, VERIFY_STORES, Backend, truth_branch  # noqa: F401  (CLEAN, Backend: re-export)
from harness.timelines.prepare import (  # noqa: F401  (re-exported: the adapters' and older callers' names)
    PROJECTION,
    OneRowPrepare,
    Prepare,
    accept_spec,
    attention_spec,
    chunk_kv,
    exact,
    exact_check,
    kv_views,
    prepare_of,
    row_shape,
)
from harness.timelines.launches import ACCEPT_VOCAB, accept, accept_tree, attend  # noqa: F401  (ACCEPT_VOCAB: re-export)
from harness.timelines import tree as tree_mod
from harness.timelines.path import Path, StepRecord, clean_path, failures  # noqa: F401  (clean_path: re-export)
from reference import kv_model


# ----------------------------------------------------------------------------- the model

class _Weights:
    def __init__(self, fam: timeline_family.Family, t: tl.Timeline, max_pos: int, device):
        g = torch.Generator().manual_seed(1000 + t.seed)
        dm = fam.d_model
        r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(device)  # noqa: E731
        outs = prepare_of(fam).projections(fam)
        self.proj = [{k: r(dm, n, scale=1.5 / math.sqrt(dm)) for k, n in outs.items()} for _ in range(fam.layers)]
        self.wo = [r(fam.H * fam.Dv, dm, scale=1.0 / math.sqrt(fam.H * fam.Dv)) for _ in range(fam.layers)]
        self.kv_norm = [(1.0 + 0.2 * r(fam.D)).to(torch.bfloat16) for _ in range(fam.layers)]
        gq = torch.Generator().manual_seed(4000 + t.seed)  # its own stream: the others' draws stay as they are
        self.q_norm = [(0.5 + torch.rand(fam.D, generator=gq)).to(torch.bfloat16).to(device) if fam.q_weight
                       else None for _ in range(fam.layers)]
        if fam.rope_dim:
            half = fam.rope_dim // 2
            inv = 1.0 / (1000.0 ** (torch.arange(half, dtype=torch.float64) / half))
            ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None]
            self.cos, self.sin = ang.cos().float().to(device), ang.sin().float().to(device)
        self.g = g


# ----------------------------------------------------------------------------- the runner

class TimelineRun:
    def __init__(self, path: Path, t: tl.Timeline, device="cpu", fp8_dtype=torch.float8_e4m3fn):
        tl.validate(t)
        self.path, self.t, self.device = path, t, torch.device(device)
        self.backend = path.backend
        self.fam = fam = tl.FAMILIES[t.family]
        store = self.backend.verify_store(fam)
        if store not in VERIFY_STORES:
            raise ValueError(f"verify_store: expected one of {VERIFY_STORES}, got {store!r}")
        self.B = tl.num_requests(t)
        top = tl.max_len(t)
        dtype = fp8_dtype if prepare_of(fam).fp8_rows else torch.bfloat16
        self.kv = kv_model.KVModel(kv_model.KVLayout(fam.layout, self.B, t.window, t.L, row_shape(fam), dtype,
                                                     translated=fam.translated and t.translated, seed=t.seed),
                                   fam.layers, top, self.device)
        self.w = _Weights(fam, t, top + 1, self.device)
        # non-unified layers (Family.non_unified_layers): the prepare's own cache per layer
        self.layer_caches = prepare_of(fam).layer_caches(self)
        self.records: list[StepRecord] = []
        self.n = [0] * self.B  # the truth: committed tokens per request (the script's accepts)
        self.held = [0] * self.B  # the backend's: tokens it keeps per request (its acceptance op's n)
        self.accept_g = torch.Generator().manual_seed(3000 + t.seed)  # drafts and target logits only
        self.tree_g = tree_mod.generator(t)  # a tree family's trees and accepted paths
        self._batch = compare.Batch()  # the step's staged checks, made together at its end (``_flush``)
        self._slots: list[tuple[int, int]] = []  # (index in records, index in the batch)
        self._loc: list[int] = []  # the step's physical write slots then its padding (-1), on the host
        self._valid: dict = {}  # per step: index tensors of the valid slots (``valid_index``)

    # -- helpers
    def record(self, step, mode, layer, family, r: compare.Record | compare.Check | int):
        """Record ``r``: a record; a staged check (``compare.Check``: made at the end of the step with
        its other checks, one host transfer per stage for all of them); or the ``_batch`` index of one
        added before (the same check recorded at several layers)."""
        if isinstance(r, compare.Record):
            self.records.append(StepRecord(step, mode, layer, family, r))
            return
        self._slots.append((len(self.records), r if isinstance(r, int) else self._batch.add(r)))
        self.records.append(StepRecord(step, mode, layer, family, None))

    def _flush(self) -> None:
        """Make the step's staged checks and put their records in place."""
        made = self._batch.resolve()
        for at, k in self._slots:
            self.records[at] = replace(self.records[at], record=made[k])
        self._slots = []

    def record_numeric(self, step, mode, layer, check, got, oracle, ref, tol):
        """``finite:<check>`` (NaN/±Inf placement), then ``<check>`` on the finite elements."""
        self.record(step, mode, layer, "timeline", compare.finite_check(f"finite:{check}", got, oracle))
        self.record(step, mode, layer, "timeline", compare.numeric_check(check, got, oracle, ref, tol))

    def valid_index(self, n: int) -> torch.Tensor:
        """Positions i < n of the step's launch (its tokens, then its padding) whose physical write
        slot is valid (>= 0): the index tensor ``x[:n][loc[:n] >= 0]`` takes, built from the slots on
        the host (a boolean mask would wait for the device in every layer). (k,) int64."""
        if n not in self._valid:
            self._valid[n] = torch.tensor([i for i, s in enumerate(self._loc[:n]) if s >= 0], dtype=torch.int64,
                                          device=self.device)
        return self._valid[n]

    def valid_slots(self) -> list[int]:
        """The step's valid physical write slots in launch order (``loc[loc >= 0]``), on the host."""
        return [s for s in self._loc if s >= 0]

    def valid_rows(self) -> torch.Tensor:
        """``valid_slots`` on the device. (k,) int64."""
        if "rows" not in self._valid:
            self._valid["rows"] = torch.tensor(self.valid_slots(), dtype=torch.int64, device=self.device)
        return self._valid["rows"]

    def _phys(self, logical: torch.Tensor) -> torch.Tensor:
        """The pool's own translation (the truth of where a logical slot lives)."""
        return self.kv.physical(logical)

    def cache(self, layer: int) -> torch.Tensor:
        """The non-unified cache of ``layer`` (made on first use for a layer the family keeps unified,
        when a backend routes it to the non-unified branch; from a generator of its own)."""
        if layer not in self.layer_caches:
            g = torch.Generator().manual_seed(2000 + self.t.seed + layer)
            self.layer_caches[layer] = prepare_of(self.fam).new_cache(self, g)
        return self.layer_caches[layer]

    def run(self, *, stop_on_failure: bool = False) -> list[StepRecord]:
        """Every step; ``stop_on_failure`` ends after the first step with a failing check (mutant runs)."""
        for step, (mode, items) in enumerate(tl.parse_steps(self.t.steps)):
            if stop_on_failure and failures(self.records):
                break
            try:
                self._step(step, mode, items)
                self._flush()
            except Exception as exc:  # a crash is a failure of the path, with its message
                try:
                    self._flush()  # the checks made before it
                except Exception:
                    self.records = [s for s in self.records if s.record is not None]
                    self._batch, self._slots = compare.Batch(), []
                msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                self.record(step, mode, -1, "timeline", compare.Record("run", False, detail=msg))
                break
        return self.records

    # -- one batch
    def _step(self, step: int, mode: str, items: list[tuple[int, int]]):
        fam, t, kv, be = self.fam, self.t, self.kv, self.backend
        widths = [a if mode == "extend" else 1 if mode == "decode" else t.L for _, a in items]
        # a tree family's verify: per request its draft tree (parents over L + 1 nodes, node 0 the last
        # committed token) and the path the script accepts (node ids), both from the timeline's seed
        trees, paths = tree_mod.step_trees(t, items, self.tree_g) if mode == "target_verify" and fam.tree else ({}, {})
        truth, positions, logical, owners = [], [], [], []
        for (r, _), c in zip(items, widths):
            if r in trees:  # a node at level k: position n + k - 1
                truth += [self.n[r] + k - 1 for k in tree_mod.levels(trees[r])[1:]]
                pos = list(be.tree_positions(r, self.held[r], trees[r]))
            else:
                truth += range(self.n[r], self.n[r] + c)
                pos = list(be.positions(r, self.held[r], c))
            if len(pos) != c:
                raise ValueError(f"backend {be.name}: positions of request {r}: {len(pos)} for a chunk of {c}")
            positions += pos
            logical.append(be.alloc(kv, r, self.held[r], c))  # the chunk is not history yet
            owners.append((r, c))
        T = len(truth)
        pos_t = torch.tensor(positions, dtype=torch.int64, device=self.device)
        truth_pos = torch.tensor(truth, dtype=torch.int64, device=self.device)
        loc_logical = torch.cat(logical)
        if fam.layout == "ring" and mode == "extend":  # a prefill longer than the ring keeps its tail
            keep = torch.cat([torch.arange(c, device=self.device) >= c - kv.spec.ring_capacity for _, c in owners])
            loc_logical = torch.where(keep, loc_logical, torch.full_like(loc_logical, -1))
        loc_phys = be.physical(kv, loc_logical)
        # the slots on the host, once a step (one transfer): the valid rows of every layer's launch
        host = torch.cat((loc_logical.reshape(-1).long(), loc_phys.reshape(-1).long())).tolist()
        logical_h = host[: loc_logical.numel()]
        self._loc, self._valid = host[loc_logical.numel():] + [-1] * t.pad, {}
        slot_checks = [self._batch.add(c) for c in timeline_truth.launch_checks(
            kv, mode, owners, self.n, truth_pos, pos_t, loc_logical, loc_phys, logical_h)]
        x = (torch.randn(T, fam.d_model, generator=self.w.g) * t.act_scale).to(torch.bfloat16).to(self.device)
        pad = t.pad
        xp = (torch.randn(pad, fam.d_model, generator=self.w.g) * t.act_scale).to(torch.bfloat16).to(self.device)
        chunk_rows = []
        tree = None
        if trees:  # the mask the backend hands attention, and the truth's (each token: itself + its ancestors)
            got_mask, topk = be.tree_mask(fam, [trees[r] for r, _ in items], self.device)
            want_mask = torch.cat([tree_mod.truth_mask(trees[r]).reshape(-1) for r, _ in items]).to(self.device)
            tree = (got_mask, topk, want_mask)
        for layer in range(fam.layers):
            for r in slot_checks:
                self.record(step, mode, layer, "timeline", r)
            o, rows = self._layer(step, mode, layer, x, xp, pos_t, truth_pos, loc_logical, loc_phys, owners, tree)
            chunk_rows.append(rows)
            x = (x.float() + o.reshape(T, -1).float() @ self.w.wo[layer]).to(torch.bfloat16)
        if trees:
            kept = accept_tree(self, step, items, trees, paths)
        else:
            kept = accept(self, step, items) if mode == "target_verify" else widths
        # the truth commits the script's accepts; the backend keeps its acceptance op's n and rolls back
        off = 0
        for (r, a), c, k in zip(items, widths, kept):
            if r in trees:  # the truth: the path's rows in path order; the backend: the op's path's slots
                for layer in range(fam.layers):
                    kv.commit(layer, r, chunk_rows[layer][[off + u - 1 for u in paths[r]]])
                self.n[r] += len(paths[r])
                be.commit_path(kv, r, self.held[r], k)
                self.held[r] += len(k)
                off += c
                continue
            keep_n = a if mode == "target_verify" else c
            for layer in range(fam.layers):
                kv.commit(layer, r, chunk_rows[layer][off: off + keep_n])
            self.n[r] += keep_n
            self.held[r] += k
            be.rollback(kv, r, self.held[r])
            off += c
        prep = prepare_of(fam)
        for layer in range(fam.layers):  # state: committed rows where the table says
            for r in {r for r, _ in items}:
                slots = self._phys(kv.truth_slots(r))
                got = kv.buffers[layer][slots]
                truth_rows = kv.truth_history(layer, r)
                self.record(step, mode, layer, "timeline", exact_check(f"state:r{r}", got, truth_rows))
                for rec in prep.state_checks(self, layer, r, slots, truth_rows):
                    self.record(step, mode, layer, "timeline", rec)
                ok = len(kv.table[r]) == kv.visible_len[r] == self.n[r]
                self.record(step, mode, layer, "timeline", compare.Record(
                    f"state:table:r{r}", ok, detail="" if ok else f"slot table {len(kv.table[r])} entries, visible "
                                                                  f"{kv.visible_len[r]}, committed {self.n[r]}"))

    def _layer(self, step, mode, layer, x, xp, pos_t, truth_pos, loc_logical, loc_phys, owners, tree=None):
        fam, be = self.fam, self.backend
        buf = self.kv.buffers[layer]
        T, pad = x.shape[0], xp.shape[0]
        xa = torch.cat((x, xp))
        W = self.w.proj[layer]
        proj = {k: (xa.float() @ w).to(torch.bfloat16) for k, w in W.items()}
        pad_loc = torch.full((pad,), -1, dtype=torch.int64, device=self.device)
        branch, want = be.branch(fam, mode, layer), truth_branch(fam, mode, layer)
        self.record(step, mode, layer, "gate", compare.Record(
            "gate:branch", branch == want, detail="" if branch == want else f"took {branch}, the layer needs {want}"))
        non_unified = branch == "non-unified"
        rows, q, kv_returned = prepare_of(fam).run(self, step, mode, layer, proj, pos_t, loc_logical, loc_phys,
                                                   pad_loc, buf, branch=branch, truth_pos=truth_pos)
        # --- backend store policy + attention
        pol = be.policy(fam, mode, kv_returned, non_unified)
        if mode == "target_verify":
            ok = pol.policy in ("pre", "post", "none")
            self.record(step, mode, layer, "gate", compare.Record(
                "gate:verify-2-source", ok, detail="" if ok else f"verify attended 1-source ({pol.policy})"))
        if pol.backend_stores and pol.store_first:
            be.store(buf, loc_phys, rows)
        if pol.one_source:  # the chunk read back from the pool
            k_d, v_d = chunk_kv(fam, buf[loc_phys.clamp(min=0)])
        else:
            k_d, v_d = chunk_kv(fam, rows)
        o = attend(self, step, mode, layer, q, k_d, v_d, rows, buf, owners, loc_logical,
                   as_history=pol.policy == "as-history", one_source=pol.one_source, tree=tree)
        if pol.backend_stores and not pol.store_first and pol.policy != "none":
            be.store(buf, loc_phys, rows)
        return o, rows


def run_timeline(path: Path, t: tl.Timeline, device="cpu", fp8_dtype=torch.float8_e4m3fn, *,
                 stop_on_failure: bool = False) -> list[StepRecord]:
    return TimelineRun(path, t, device, fp8_dtype).run(stop_on_failure=stop_on_failure)
