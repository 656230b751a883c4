"""Typed input errors and the validators shared by every implementation of an op.

The reference defines each op's contract, so the argument checks live beside it and the
fused wrappers call the very same functions: a reference and a kernel can never disagree
about what is legal input. Every error names the offending argument and the value seen.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


class VerifyParityInputError(ValueError):
    """Base class: bad input to an op. ``arg`` names the offending argument."""

    def __init__(self, arg: str, message: str):
        self.arg = arg
        super().__init__(f"{arg}: {message}")


class RankError(VerifyParityInputError):
    """A tensor has the wrong number of dimensions."""


class ShapeError(VerifyParityInputError):
    """A tensor's extent disagrees with the op's axes or with another argument."""


class DTypeError(VerifyParityInputError):
    """A tensor has a dtype the op does not accept."""


class LayoutError(VerifyParityInputError):
    """A tensor's strides are not supported (e.g. a non-unit innermost stride)."""


class RangeError(VerifyParityInputError):
    """An index or scalar lies outside its legal range (positions past the table, loc past the pool)."""


class DeviceError(VerifyParityInputError):
    """Tensors live on different devices."""


def check_rank(arg: str, t: torch.Tensor, rank: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise DTypeError(arg, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise RankError(arg, f"expected {rank} dims, got shape {tuple(t.shape)}")


def check_shape(arg: str, t: torch.Tensor, shape: Sequence[int | None]) -> None:
    """``shape`` entries of None are free; the rank must match."""
    check_rank(arg, t, len(shape))
    for axis, (got, want) in enumerate(zip(t.shape, shape)):
        if want is not None and got != want:
            raise ShapeError(arg, f"expected shape {tuple(shape)} (None = any), got {tuple(t.shape)}; axis {axis} differs")


def check_dtype(arg: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise DTypeError(arg, f"dtype {str(t.dtype).removeprefix('torch.')} not in ({names})")


def check_inner_contiguous(arg: str, t: torch.Tensor) -> None:
    """Rows may be strided (a slice of a wider tensor); the last axis must have unit stride."""
    if t.numel() > 0 and t.stride(-1) != 1:
        raise LayoutError(arg, f"last axis must have stride 1, got strides {t.stride()}")


def check_contiguous(arg: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise LayoutError(arg, f"must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    devs = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devs.values())) > 1:
        first = next(iter(devs))
        for name, dev in devs.items():
            if dev != devs[first]:
                raise DeviceError(name, f"on {dev}, but {first} is on {devs[first]}")


def check_index_range(arg: str, idx: torch.Tensor, *, low: int, high: int, allow_negative_padding: bool = False) -> None:
    """Every entry in [low, high); with ``allow_negative_padding`` any negative entry means 'skip'."""
    if idx.numel() == 0:
        return
    vals = idx[idx >= 0] if allow_negative_padding else idx
    if vals.numel() == 0:
        return
    lo, hi = int(vals.min()), int(vals.max())
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        raise RangeError(arg, f"entry {bad} outside [{low}, {high})")


def check_unique(arg: str, idx: torch.Tensor, *, ignore_negative: bool = True) -> None:
    vals = idx[idx >= 0] if ignore_negative else idx
    if vals.numel() != torch.unique(vals).numel():
        raise RangeError(arg, "duplicate entries: two tokens would write the same slot")
