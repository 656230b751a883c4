"""How a family's prepare step enters the timeline model and the end-to-end engine: ``Prepare``
(the family without a fused prepare: plain q/k/v projections, the backend storing the rows) and the
adapters of the ops of role ``prepare`` (``cases/<op>/prepare.py``, ``OpSpec.timeline``), looked
up by ``prepare_of``; ``attention_spec`` is the registry's one op of role ``attn``, ``accept_spec``
its one op of role ``accept`` (the timelines' accept(n) step) or ``tree-accept`` (a tree family's)."""
from __future__ import annotations

import functools

import torch

from cases import timeline_family
from harness import compare
from harness.ops import builtin_specs
from harness.registry import OpSpec


def exact(check: str, got: torch.Tensor, want: torch.Tensor) -> compare.Record:
    """``compare.exact`` that also takes two empty tensors of one shape (an empty history)."""
    return compare.resolve_one(exact_check(check, got, want))


def exact_check(check: str, got: torch.Tensor, want: torch.Tensor) -> compare.Check:
    """``exact`` staged (``compare.Batch``)."""
    if got is not None and got.numel() == 0 and tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype:
        return compare.Record(check, True, detail="empty")
    return (yield from compare.exact_check(check, got, want))


class Prepare:
    """How a family's prepare step enters the model: the projections it takes, the pool rows it
    makes, who stores them, and its call with its checks at one (step, layer). This base is the
    family without a fused prepare (plain q/k/v projections, k and v stacked in a row, the backend
    storing them); an op of role ``prepare`` provides a subclass (``OpSpec.timeline``)."""
    fp8_rows = False  # pool rows in the run's fp8 dtype (else bf16)
    writes_rows = False  # the prepare writes every pool row itself: the backend stores none, and
    # attention reads the chunk back from the pool (1-source)

    def projections(self, fam: timeline_family.Family) -> dict[str, int]:
        """Projection name -> output width (the columns of its d_model x width weight)."""
        return {"q": fam.H * fam.D, "k": fam.Hkv * fam.D, "v": fam.Hkv * fam.Dv}

    def row_shape(self, fam: timeline_family.Family) -> tuple[int, ...]:
        """One pool row."""
        return (2, fam.Hkv, fam.D)  # k and v stacked

    def kv_views(self, fam: timeline_family.Family, buf: torch.Tensor):
        """Pool rows -> (k_buffer (S, Hkv, D), v_buffer (S, Hkv, Dv)) as attention reads them."""
        return buf[:, 0], buf[:, 1, :, : fam.Dv]

    def chunk_kv(self, fam: timeline_family.Family, rows: torch.Tensor):
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

    def new_cache(self, tr: TimelineRun, g: torch.Generator) -> torch.Tensor:
        """A fresh cache of the non-unified branch (a backend routing a unified layer there)."""
        raise ValueError(f"family {tr.fam.name!r}: its prepare {tr.fam.prepare!r} has no non-unified branch")

    def state_checks(self, tr: TimelineRun, layer: int, r: int, slots: torch.Tensor, truth: torch.Tensor) -> list:
        """Records (``compare.Record``) of a layer's own cache after a step: request r's committed
        rows ``truth`` at physical ``slots``. Here: none (the pool is all there is)."""
        return []

    def run(self, tr: TimelineRun, step, mode, layer, proj, pos_t, loc_logical, loc_phys, pad_loc, buf, *,
            branch: str, truth_pos: torch.Tensor):
        """The prepare at one layer, recording its checks on ``tr`` -> (chunk rows (T, *row_shape),
        q (T, H, D) bf16, kv_returned: whether rows were handed back rather than only stored).
        ``pos_t``, the slots and ``branch`` are what the backend hands the op (``harness.backend``);
        its oracle takes the logical request's positions ``truth_pos`` (T,) int64."""
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
        from reference.qk_norm_rope.chain import rope_fp32

        fam = model.fam
        q = rope_fp32(pr["q"].view(-1, fam.H, fam.D), model.cos[pos], model.sin[pos], model.rope_dim, model.rope_style)
        k = rope_fp32(pr["k"].view(-1, fam.Hkv, fam.D), model.cos[pos], model.sin[pos], model.rope_dim,
                      model.rope_style)
        return q, k, pr["v"].view(-1, fam.Hkv, fam.Dv)


class OneRowPrepare(Prepare):
    """A prepare op whose pool row is one vector of D per token, read as k (and its first Dv as v)."""

    def row_shape(self, fam: timeline_family.Family) -> tuple[int, ...]:
        return (fam.D,)

    def kv_views(self, fam: timeline_family.Family, buf: torch.Tensor):
        return buf[:, None, :], buf[:, None, : fam.Dv]


PROJECTION = Prepare()


def prepare_of(fam: timeline_family.Family) -> Prepare:
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


@functools.cache
def accept_spec(role: str = "accept") -> OpSpec:
    """The acceptance after every verify step: the built-in op of role ``accept`` (``tree-accept``: after
    a tree family's, ``accept_role``)."""
    (spec,) = [s for s in builtin_specs().values() if s.role == role]
    return spec


def accept_role(fam: timeline_family.Family) -> str:
    """The role of the op that accepts ``fam``'s verify steps: ``tree-accept`` for a draft tree."""
    return "tree-accept" if fam.tree else "accept"


def row_shape(fam: timeline_family.Family) -> tuple[int, ...]:
    """One pool row of ``fam``."""
    return prepare_of(fam).row_shape(fam)


def kv_views(fam: timeline_family.Family, buf: torch.Tensor):
    """Pool rows -> (k_buffer, v_buffer) as attention reads them."""
    return prepare_of(fam).kv_views(fam, buf)


def chunk_kv(fam: timeline_family.Family, rows: torch.Tensor):
    """Logical KV rows of chunk tokens -> (k, v) as drafts."""
    return prepare_of(fam).chunk_kv(fam, rows)
