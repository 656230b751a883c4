"""Store-timing timeline runner: a *path under test* lives through a timeline, and every step of
every layer is compared with the logical truth (DESIGN.md, "Store-timing timelines").

A path = the implementations per op (any registered ``Impl``: fused, reference, external,
mutant) + the backend's store policy:
  decode   1-source: store the token, then attend over the ring (its own row read back);
  verify   2-source: attend over history (from the pool) + the chunk as k/v, with the chunk
           stored either ``pre`` (before attention, causally indexed: attention never reads
           the chunk's slots as history) or ``post`` (after attention);
           ``as-history`` is seed 000's bug: store first, then attend 1-source over the ring,
           every chunk token seen as history by every other one.
The op's own gate decides what the prepare launch stores (e.g. the qk prepare's gate); when
a verify prepare hands no kv back the backend has nothing to attend to but the ring, which is
exactly the seed's failure mode, so the runner follows it (and the gate check says so).

Checks per (step, layer), each a ``harness.compare.Record`` tagged with its family:
  timeline  prepare:*  the prepare op's outputs against its fp64 oracle (exact bytes for fp8);
            finite:*   before each numeric check (prepare:*, attn): the oracle's NaN/±Inf placement;
            visible_kv every row attention read from the pool equals the logical history, row
                       count included (rejected drafts, stale or mistranslated slots show here);
            attn       the attention output against the fp64 oracle over the *logical* history +
                       the chunk, under the family's draft rule (tolerance: harness.tolerance);
            state      after the step, every committed row in the window sits where the slot
                       table says, byte-exact.
  gate      dispatch decisions observed at the step: what the prepare launch wrote (nothing in
            extend/verify, kv handed back; each row exactly once in decode and for fp8 MLA; on a
            non-unified qk layer its rows' records of the paged fp8 SWA cache in every mode, no
            other byte) and that verify attention was 2-source (a non-unified layer's chunk is read
            back from its cache, decoded: causally indexed, as ``pre``).
The truth is teacher-forced: layer k's oracle takes the path's own inputs to layer k, so
rounding differences do not compound while a wrong KV row is still caught at the first read.

The ops enter by role: a family's prepare step is the op its ``Family.prepare`` names, run through
that op's ``Prepare`` adapter (``OpSpec.timeline``, in ``harness/prepares/<op>.py``); attention is
the registry's one op of role ``attn``. ``Prepare`` itself is the family without a fused prepare
(plain q/k/v projections).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from cases import timelines as tl
from harness import compare
from harness.ops import builtin_specs
from harness.registry import Impl, OpSpec, Registry
from reference import kv_model

VERIFY_STORES = ("pre", "post", "as-history", "none")


@dataclass(frozen=True)
class Path:
    name: str
    family: str
    prepare: Impl | None  # implementation of the family's prepare op (None: plain projections)
    attn: Impl  # implementation of the attention op (role "attn") for decode and verify steps
    verify_store: str = ""  # "" = the family's clean policy
    decode_store_first: bool = True  # 1-source decode: store, then attend
    keep_rejected: bool = False  # rollback leaves rejected drafts in the slot table (stale KV)
    translate_reads: bool = True  # attention reads physical rows (False: the logical slot ids)
    doc: str = ""


@dataclass(frozen=True)
class StepRecord:
    step: int
    mode: str
    layer: int
    family: str  # check family: timeline | gate
    record: compare.Record


def _exact(check: str, got: torch.Tensor, want: torch.Tensor) -> compare.Record:
    """``compare.exact`` that also takes two empty tensors of one shape (an empty history)."""
    if got is not None and got.numel() == 0 and tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype:
        return compare.Record(check, True, detail="empty")
    return compare.exact(check, got, want)


class Prepare:
    """How a family's prepare step enters the model: the projections it takes, the pool rows it
    makes, who stores them, and its call with its checks at one (step, layer). This base is the
    family without a fused prepare (plain q/k/v projections, k and v stacked in a row, the backend
    storing them); an op of role ``prepare`` provides a subclass (``OpSpec.timeline``)."""
    fp8_rows = False  # pool rows in the run's fp8 dtype (else bf16)
    writes_rows = False  # the prepare writes every pool row itself: the backend stores none, and
    # attention reads the chunk back from the pool (1-source)

    def projections(self, fam: tl.Family) -> dict[str, int]:
        """Projection name -> output width (the columns of its d_model x width weight)."""
        return {"q": fam.H * fam.D, "k": fam.Hkv * fam.D, "v": fam.Hkv * fam.Dv}

    def row_shape(self, fam: tl.Family) -> tuple[int, ...]:
        """One pool row."""
        return (2, fam.Hkv, fam.D)  # k and v stacked

    def kv_views(self, fam: tl.Family, buf: torch.Tensor):
        """Pool rows -> (k_buffer (S, Hkv, D), v_buffer (S, Hkv, Dv)) as attention reads them."""
        return buf[:, 0], buf[:, 1, :, : fam.Dv]

    def chunk_kv(self, fam: tl.Family, rows: torch.Tensor):
        """Logical KV rows of chunk tokens -> bf16 (k (T, Hkv, D), v (T, Hkv, Dv)) as drafts."""
        return rows[:, 0].contiguous(), rows[:, 1, :, : fam.Dv].contiguous()

    def backend_stores(self, mode: str, kv_returned: bool) -> bool:
        """Whether the backend stores the chunk's rows (the rest: the prepare op does)."""
        return not self.writes_rows

    def layer_caches(self, tr: TimelineRun) -> dict[int, torch.Tensor]:
        """The family's non-unified layers (``Family.non_unified_layers``) -> the cache of its own the
        prepare stores their rows into, made once per run (after ``tr.w``, drawing from ``tr.w.g``);
        ``tr.kv``'s buffer of such a layer mirrors what attention reads from it. Here: none."""
        if fam_layers := tr.fam.non_unified_layers:
            raise ValueError(f"family {tr.fam.name!r}: non_unified_layers {fam_layers} but its prepare "
                             f"{tr.fam.prepare!r} has no store of its own")
        return {}

    def run(self, tr: TimelineRun, step, mode, layer, proj, pos_t, loc_logical, loc_phys, pad_loc, buf):
        """The prepare at one layer, recording its checks on ``tr`` -> (chunk rows (T, *row_shape),
        q (T, H, D) bf16, kv_returned: whether rows were handed back rather than only stored)."""
        fam, T = tr.fam, pos_t.shape[0]
        q = proj["q"][:T].view(T, fam.H, fam.D)
        rows = torch.stack((proj["k"][:T].view(T, fam.Hkv, fam.D),
                            torch.nn.functional.pad(proj["v"][:T].view(T, fam.Hkv, fam.Dv),
                                                    (0, fam.D - fam.Dv))), 1)  # (T, 2, Hkv, D)
        return rows, q, True

    def serve(self, engine, mode, layer, pr, pos_t, loc_logical, loc_phys, buf):
        """The prepare in the end-to-end engine (``harness.e2e.engine``) on the micro-model's
        projections ``pr`` -> (rows (T, *row_shape) or None when the op wrote them all, q (T, H, D)
        bf16, kv_returned)."""
        fam, m, T = engine.fam, engine.model, pos_t.shape[0]
        q = m.rope(pr["q"].view(T, fam.H, fam.D), pos_t)
        k = m.rope(pr["k"].view(T, fam.Hkv, fam.D), pos_t)
        v = torch.nn.functional.pad(pr["v"].view(T, fam.Hkv, fam.Dv), (0, fam.D - fam.Dv))
        return torch.stack((k, v), 1), q, True  # rows (T, 2, Hkv, D)

    def train(self, model, pr, pos, layer):
        """The micro-model's training forward (fp32, dense: ``harness.e2e.model.Micro.forward``) of
        the projections ``pr`` at positions ``pos`` -> (q (N, H, D), k (N, Hkv, D), v (N, Hkv, Dv))."""
        from reference.qk_norm_rope import _rope_fp32

        fam = model.fam
        q = _rope_fp32(pr["q"].view(-1, fam.H, fam.D), model.cos[pos], model.sin[pos], model.rope_dim, model.rope_style)
        k = _rope_fp32(pr["k"].view(-1, fam.Hkv, fam.D), model.cos[pos], model.sin[pos], model.rope_dim,
                       model.rope_style)
        return q, k, pr["v"].view(-1, fam.Hkv, fam.Dv)


class OneRowPrepare(Prepare):
    """A prepare op whose pool row is one vector of D per token, read as k (and its first Dv as v)."""

    def row_shape(self, fam: tl.Family) -> tuple[int, ...]:
        return (fam.D,)

    def kv_views(self, fam: tl.Family, buf: torch.Tensor):
        return buf[:, None, :], buf[:, None, : fam.Dv]


PROJECTION = Prepare()


def prepare_of(fam: tl.Family) -> Prepare:
    """The family's prepare step: the adapter of the op ``fam.prepare`` names, or ``PROJECTION``."""
    return _prepare(fam.prepare)


@functools.cache
def _prepare(op: str) -> Prepare:
    if op == "projection":
        return PROJECTION
    spec = builtin_specs()[op]
    if spec.role != "prepare" or spec.timeline is None:
        raise ValueError(f"op {op!r} has no timeline prepare adapter (OpSpec.timeline)")
    return spec.timeline()


@functools.cache
def attention_spec() -> OpSpec:
    """The attention of every family: the built-in op of role ``attn``."""
    (spec,) = [s for s in builtin_specs().values() if s.role == "attn"]
    return spec


def _row_shape(fam: tl.Family) -> tuple[int, ...]:
    return prepare_of(fam).row_shape(fam)


def _kv_views(fam: tl.Family, buf: torch.Tensor):
    return prepare_of(fam).kv_views(fam, buf)


def _chunk_kv(fam: tl.Family, rows: torch.Tensor):
    return prepare_of(fam).chunk_kv(fam, rows)


def clean_path(reg: Registry, family: str, *, prepare: str = "fused", attn: str = "fused", **kw) -> Path:
    fam = tl.FAMILIES[family]
    p = None if fam.prepare == "projection" else reg.impls[f"{fam.prepare}/{prepare}"]
    return Path(f"{family}:{prepare}+{attn}", family, p, reg.impls[f"{reg.attention().name}/{attn}"], **kw)


def backend_policy(fam: tl.Family, path: Path, store: str, mode: str, kv_returned: bool, non_unified: bool = False):
    """The backend's decisions for one layer call -> (policy, backend_stores, store_first, one_source).
    Shared by the timeline runner and the end-to-end engine (``harness.e2e.engine``). A non-unified
    layer's prepare stores its chunk in every mode (in a cache of its own: ``Prepare.layer_caches``),
    and its verify attention reads the chunk from there causally indexed: the ``pre`` policy with the
    chunk read back."""
    prep = prepare_of(fam)
    backend_stores = False if non_unified else prep.backend_stores(mode, kv_returned)
    policy = {"extend": "post", "decode": "decode", "target_verify": store}[mode]
    if mode == "target_verify" and not kv_returned and not non_unified:
        policy = "as-history"  # no chunk handed back: the ring is all the backend can attend to
    store_first = policy in ("pre", "as-history") or (policy == "decode" and path.decode_store_first)
    one_source = prep.writes_rows or policy in ("decode", "as-history")
    return policy, backend_stores, store_first, one_source


# ----------------------------------------------------------------------------- the model

class _Weights:
    def __init__(self, fam: tl.Family, t: tl.Timeline, max_pos: int, device):
        g = torch.Generator().manual_seed(1000 + t.seed)
        dm = fam.d_model
        r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(device)  # noqa: E731
        outs = prepare_of(fam).projections(fam)
        self.proj = [{k: r(dm, n, scale=1.5 / math.sqrt(dm)) for k, n in outs.items()} for _ in range(fam.layers)]
        self.wo = [r(fam.H * fam.Dv, dm, scale=1.0 / math.sqrt(fam.H * fam.Dv)) for _ in range(fam.layers)]
        self.kv_norm = [(1.0 + 0.2 * r(fam.D)).to(torch.bfloat16) for _ in range(fam.layers)]
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
        self.fam = fam = tl.FAMILIES[t.family]
        self.store = path.verify_store or fam.verify_store
        if self.store not in VERIFY_STORES:
            raise ValueError(f"verify_store: expected one of {VERIFY_STORES}, got {self.store!r}")
        self.B = tl.num_requests(t)
        top = tl.max_len(t)
        dtype = fp8_dtype if prepare_of(fam).fp8_rows else torch.bfloat16
        self.kv = kv_model.KVModel(kv_model.KVLayout(fam.layout, self.B, t.window, t.L, _row_shape(fam), dtype,
                                                     translated=fam.translated and t.translated, seed=t.seed),
                                   fam.layers, top, self.device)
        self.w = _Weights(fam, t, top + 1, self.device)
        # non-unified layers (Family.non_unified_layers): the prepare's own cache per layer
        self.layer_caches = prepare_of(fam).layer_caches(self)
        self.records: list[StepRecord] = []
        self.n = [0] * self.B  # committed tokens per request (the truth's length)

    # -- helpers
    def _rec(self, step, mode, layer, family, r: compare.Record):
        self.records.append(StepRecord(step, mode, layer, family, r))

    def _rec_numeric(self, step, mode, layer, check, got, oracle, ref, tol):
        """``finite:<check>`` (NaN/±Inf placement), then ``<check>`` on the finite elements."""
        self._rec(step, mode, layer, "timeline", compare.finite(f"finite:{check}", got, oracle))
        self._rec(step, mode, layer, "timeline", compare.numeric(check, got, oracle, ref, tol))

    def _phys(self, logical: torch.Tensor) -> torch.Tensor:
        return self.kv.physical(logical)

    def _read_slots(self, logical: torch.Tensor) -> torch.Tensor:
        return self._phys(logical) if self.path.translate_reads else logical

    def run(self, *, stop_on_failure: bool = False) -> list[StepRecord]:
        """Every step; ``stop_on_failure`` ends after the first step with a failing check (mutant runs)."""
        for step, (mode, items) in enumerate(tl.parse_steps(self.t.steps)):
            if stop_on_failure and failures(self.records):
                break
            try:
                self._step(step, mode, items)
            except Exception as exc:  # a crash is a failure of the path, with its message
                msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                self._rec(step, mode, -1, "timeline", compare.Record("run", False, detail=msg))
                break
        return self.records

    # -- one batch
    def _step(self, step: int, mode: str, items: list[tuple[int, int]]):
        fam, t, kv = self.fam, self.t, self.kv
        widths = [a if mode == "extend" else 1 if mode == "decode" else t.L for _, a in items]
        positions, logical, owners = [], [], []
        for (r, _), c in zip(items, widths):
            pos = list(range(self.n[r], self.n[r] + c))
            logical.append(kv.alloc(r, pos))  # the chunk is not history yet: visible_len unchanged
            positions += pos
            owners.append((r, c))
        T = len(positions)
        pos_t = torch.tensor(positions, dtype=torch.int64, device=self.device)
        loc_logical = torch.cat(logical)
        if fam.layout == "ring" and mode == "extend":  # a prefill longer than the ring keeps its tail
            keep = torch.cat([torch.arange(c, device=self.device) >= c - kv.spec.ring_capacity for _, c in owners])
            loc_logical = torch.where(keep, loc_logical, torch.full_like(loc_logical, -1))
        loc_phys = self._phys(loc_logical)
        x = (torch.randn(T, fam.d_model, generator=self.w.g) * t.act_scale).to(torch.bfloat16).to(self.device)
        pad = t.pad
        xp = (torch.randn(pad, fam.d_model, generator=self.w.g) * t.act_scale).to(torch.bfloat16).to(self.device)
        chunk_rows = []
        for layer in range(fam.layers):
            o, rows = self._layer(step, mode, layer, x, xp, pos_t, loc_logical, loc_phys, owners)
            chunk_rows.append(rows)
            x = (x.float() + o.reshape(T, -1).float() @ self.w.wo[layer]).to(torch.bfloat16)
        # accept / commit / rollback
        off = 0
        for (r, a), c in zip(items, widths):
            keep_n = a if mode == "target_verify" else c
            for layer in range(fam.layers):
                kv.commit(layer, r, chunk_rows[layer][off: off + keep_n])
            self.n[r] += keep_n
            kv.rollback(r, self.n[r], keep_rejected=self.path.keep_rejected)
            off += c
        for layer in range(fam.layers):  # state: committed rows where the table says
            for r in {r for r, _ in items}:
                slots = self._phys(kv.truth_slots(r))
                got = kv.buffers[layer][slots]
                self._rec(step, mode, layer, "timeline", _exact(f"state:r{r}", got, kv.truth_history(layer, r)))

    def _layer(self, step, mode, layer, x, xp, pos_t, loc_logical, loc_phys, owners):
        fam, t, kv = self.fam, self.t, self.kv
        buf = kv.buffers[layer]
        T, pad = x.shape[0], xp.shape[0]
        xa = torch.cat((x, xp))
        W = self.w.proj[layer]
        proj = {k: (xa.float() @ w).to(torch.bfloat16) for k, w in W.items()}
        pad_loc = torch.full((pad,), -1, dtype=torch.int64, device=self.device)
        non_unified = layer in self.layer_caches
        rows, q, kv_returned = prepare_of(fam).run(self, step, mode, layer, proj, pos_t, loc_logical, loc_phys,
                                                   pad_loc, buf)
        # --- backend store policy + attention
        policy, backend_stores, store_first, one_source = backend_policy(fam, self.path, self.store, mode,
                                                                         kv_returned, non_unified)
        if mode == "target_verify":
            ok = policy in ("pre", "post", "none")
            self._rec(step, mode, layer, "gate", compare.Record(
                "gate:verify-2-source", ok, detail="" if ok else f"verify attended 1-source ({policy})"))
        if backend_stores and store_first:
            self._store(buf, loc_phys, rows)
        if one_source:  # the chunk read back from the pool
            k_d, v_d = _chunk_kv(fam, buf[loc_phys.clamp(min=0)])
        else:
            k_d, v_d = _chunk_kv(fam, rows)
        o = self._attend(step, mode, layer, q, k_d, v_d, rows, buf, owners, loc_logical,
                         as_history=policy == "as-history", one_source=one_source)
        if backend_stores and not store_first and policy != "none":
            self._store(buf, loc_phys, rows)
        return o, rows

    def _store(self, buf, loc_phys, rows):
        valid = loc_phys >= 0
        buf[loc_phys[valid]] = rows[valid].to(buf.dtype)

    # -- attention
    def _attend(self, step, mode, layer, q, k_d, v_d, chunk_rows, buf, owners, loc_logical, *, as_history,
                one_source):
        fam, kv = self.fam, self.kv
        kb, vb = _kv_views(fam, buf)
        # what attention reads from the pool: per request, or per token when the chunk is history
        groups, read, whose = [], [], []
        off = 0
        for r, c in owners:
            h = kv.history_slots(r)
            chunk = loc_logical[off: off + c]
            for s, e in ([(off + i, off + i + 1) for i in range(c)] if as_history else [(off, off + c)]):
                extra = torch.cat((chunk[: s - off], chunk[e - off:])) if as_history else chunk[:0]
                groups.append((s, e))
                read.append(self._read_slots(torch.cat((h, extra[extra >= 0]))))
                whose.append(r)
            off += c
        qo = torch.tensor([0] + [e for _, e in groups], dtype=torch.int32, device=self.device)
        kvp = torch.tensor([0] + [len(x) for x in read], device=self.device).cumsum(0).to(torch.int32)
        idx = torch.cat(read).to(torch.int32)
        args = dict(q=q.contiguous(), k=k_d.contiguous(), v=v_d.contiguous(), k_buffer=kb, v_buffer=vb,
                    qo_indptr=qo, kv_indptr=kvp, kv_indices=idx.contiguous(), sm_scale=1.0 / math.sqrt(fam.D),
                    is_causal=fam.causal, k_scale=fam.kv_descale, v_scale=fam.kv_descale, num_kv_splits=fam.splits,
                    custom_mask=None, o=None, topk=1, model_family=fam.model_family, splitkv_switch=True)
        attention = attention_spec()
        if mode == "extend":
            out = attention.reference(**args)  # prefill is setup, not the path under test
        else:
            out = self.path.attn.fn(**args)
        o = out["o"]
        # visible KV: every row read equals the request's logical history, row count included
        for r, rows_read in zip(whose, read):
            ok_idx = (rows_read >= 0) & (rows_read < buf.shape[0])
            got = buf[rows_read[ok_idx]]
            self._rec(step, mode, layer, "timeline", _exact(f"visible_kv:r{r}", got, kv.truth_history(layer, r)))
        if one_source:  # the chunk itself came from the pool: it must be the chunk's logical rows
            self._rec(step, mode, layer, "timeline", _exact("visible_kv:chunk", k_d, _chunk_kv(fam, chunk_rows)[0]))
        # attention against the oracle over the logical history + the logical chunk
        lk, lv = _chunk_kv(fam, chunk_rows)
        hist_rows = [kv.truth_history(layer, r) for r, _ in owners]
        lbuf = torch.cat(hist_rows) if hist_rows else buf[:0]
        lkb, lvb = _kv_views(fam, lbuf)
        lens = [h.shape[0] for h in hist_rows]
        qo_l = torch.tensor([0] + [c for _, c in owners], device=self.device).cumsum(0).to(torch.int32)
        largs = dict(args, k=lk.contiguous(), v=lv.contiguous(), k_buffer=lkb, v_buffer=lvb, qo_indptr=qo_l,
                     kv_indptr=torch.tensor([0] + lens, device=self.device).cumsum(0).to(torch.int32),
                     kv_indices=torch.arange(sum(lens), dtype=torch.int32, device=self.device))
        oracle = attention.oracle(**largs)["o"]
        ref = attention.reference(**largs)["o"]
        tol = attention.tolerance("o", torch.bfloat16)
        self._rec_numeric(step, mode, layer, "attn:o", o, oracle, ref, tol)
        return o


def run_timeline(path: Path, t: tl.Timeline, device="cpu", fp8_dtype=torch.float8_e4m3fn, *,
                 stop_on_failure: bool = False) -> list[StepRecord]:
    return TimelineRun(path, t, device, fp8_dtype).run(stop_on_failure=stop_on_failure)


def failures(records: list[StepRecord]) -> list[StepRecord]:
    return [s for s in records if not s.record.passed]
