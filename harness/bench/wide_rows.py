"""What an op benchmark's shapes and wide rows share: ``VerifyShape`` (a verify batch), the batch x
vocabulary grids of the acceptance benchmarks (``batch_vocab_shapes``) and their LM-head logits
(``lm_head_logits``), ``Measured`` (one shape's timings and bytes), and the wide-row columns every op
has (``FUSED_VS_CHAIN_COLUMNS``, ``wide_row_type``, ``fused_vs_chain``) with the progress line's head
(``fused_line``). ``harness.bench.perf`` re-exports them."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.bench.perf_rows import Timing
from reports.rows import PerfRow


@dataclass(frozen=True)
class VerifyShape:
    """A verify batch of the prepare benchmarks: B requests × L tokens (3 drafts + 1 bonus), H local
    q heads; ``suffix`` completes the case id (e.g. ",D=512")."""
    B: int  # requests
    H: int  # local q heads
    L: int = 4
    suffix: str = ""

    @property
    def T(self) -> int:
        return self.B * self.L

    @property
    def case(self) -> str:
        return f"B={self.B},L={self.L},H={self.H}{self.suffix}"


@dataclass(frozen=True)
class ChainShape:
    """B requests, each a chain of L drafts (L + 1 target rows), over a vocabulary of V: the chain
    acceptance benches' shape (each names its own L as the default)."""
    B: int  # requests
    V: int  # vocabulary
    L: int  # drafts per request

    @property
    def T(self) -> int:  # target rows
        return self.B * (self.L + 1)

    @property
    def case(self) -> str:
        return f"B={self.B},L={self.L},V={self.V}"


def batch_vocab_shapes(make: Callable[[int, int], Any], quick_set: tuple, b_full: tuple, v_full: tuple, quick: bool,
                       b: list[int] | None = None, v: list[int] | None = None) -> list:
    """An acceptance benchmark's shapes, ``make(B, V)`` each: ``quick_set``'s (B, V) pairs with ``quick``,
    else every B of ``b_full`` with every V of ``v_full``; ``b`` / ``v`` replace the batch / vocabulary
    lists (the quick set's are the ones its pairs use)."""
    if quick and not b and not v:
        return [make(B, V) for B, V in quick_set]
    bq, vq = sorted({B for B, _ in quick_set}), sorted({V for _, V in quick_set})
    return [make(B, V) for B in (b or (bq if quick else b_full)) for V in (v or (vq if quick else v_full))]


ROW_PAD = 128  # an LM head's logits buffer is this much wider than the vocabulary


def lm_head_logits(rows: int, V: int, *, seed: int, device, scale: float = 1.0) -> torch.Tensor:
    """(rows, V) bf16 logits as an LM head hands them over: ``randn · scale`` drawn on ``device``
    (``torch.Generator`` seeded with ``seed``), a slice of a buffer whose rows are V + ROW_PAD wide
    (row stride > V)."""
    g = torch.Generator(device=device).manual_seed(seed)
    buf = torch.randn(rows, V + ROW_PAD, device=device, generator=g)
    return buf.mul_(scale).bfloat16()[:, :V]


@dataclass(frozen=True)
class Measured:
    """One shape of an op's run: its timings per impl, the bytes the op must move there, and what
    else the op's wide row needs (``extra``: numbers, no tensors)."""
    shape: Any  # has a ``case`` id
    timings: dict[str, Timing]
    bytes_moved: int
    extra: Mapping[str, Any] = field(default_factory=dict)


# the columns fused_vs_chain fills, in a wide row's order (the *_us: p50)
FUSED_VS_CHAIN_COLUMNS = (("fused_us", float), ("reference_us", float), ("compiled_us", float),
                          ("reference_over_fused", float), ("compiled_over_fused", float), ("fused_gbps", float),
                          ("fused_frac_of_copy", float), ("fused_launches", int), ("reference_launches", int),
                          ("compiled_launches", int))


def wide_row_type(module: str, shape_columns: tuple, own_columns: tuple) -> type:
    """The frozen dataclass ``BenchRow`` of ``module``'s wide rows: ``shape_columns`` ((name, type)
    pairs), then ``FUSED_VS_CHAIN_COLUMNS``, then ``own_columns``."""
    return dataclasses.make_dataclass("BenchRow", [*shape_columns, *FUSED_VS_CHAIN_COLUMNS, *own_columns],
                                      frozen=True, namespace={"__module__": module})


def fused_vs_chain(m: Measured, fused: PerfRow) -> dict:
    """The wide-row columns every op has: the fused impl's p50, ratios, bandwidth and launches beside
    the reference chain's and torch.compile's."""
    t = m.timings
    return dict(fused_us=t["fused"].p50_us, reference_us=t["reference"].p50_us, compiled_us=t["compiled"].p50_us,
                reference_over_fused=fused.speedup_vs_reference, compiled_over_fused=fused.speedup_vs_compiled,
                fused_gbps=fused.gbps, fused_frac_of_copy=fused.frac_of_copy, fused_launches=t["fused"].launches,
                reference_launches=t["reference"].launches, compiled_launches=t["compiled"].launches)


def mismatch_line(case: str, n: int, who: str = "the fused kernel") -> str:
    """The progress line's tail when ``who``'s outputs differ from the chain's in ``n`` elements (n > 0),
    else nothing: the line a mismatching benchmark shape ends with."""
    return f"\n  MISMATCH {case}: {n} output elements of {who} differ from the chain's" if n > 0 else ""


def fused_line(m: Measured, fused: PerfRow) -> str:
    """The progress line's head: the fused p50, its share of the copy roof, its ratios to the chain
    and to torch.compile."""
    return (f"fused {fused.p50_us:7.2f} us (launches {fused.launches}, {fused.frac_of_copy:5.1%} of copy) | "
            f"x{fused.speedup_vs_reference:5.2f} vs reference (launches {m.timings['reference'].launches}) | "
            f"x{fused.speedup_vs_compiled:5.2f} vs compiled")
