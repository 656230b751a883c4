"""Typed input errors and the validators shared by every implementation of an op.

The reference defines each op's contract, so the argument checks live beside it and the
fused wrappers call the very same functions: a reference and a kernel can never disagree
about what is legal input. Every error names the offending argument and the value seen.

Tensors: every one must hold data (no meta tensor) in the strided layout; index and pointer
tensors (positions, loc, indptr, indices, masks) must be contiguous, because the kernels read
them as ``ptr + i`` (a strided view would pass every value check, then be read as raw memory).
Scalars: flags are bools (or ``numpy.bool_``), integer knobs ints, scales and epsilons real
numbers (Python or numpy, converted with ``float``/``int``; never bool, str or tensor), each in a
documented range; a scale is checked in fp32, the dtype the ops apply it in. None of these checks
reads a tensor's values, so none syncs a device; the value checks (``check_index_range``,
``check_unique``) do, and ``check_index_values`` does all of one call's in one host sync.

Value checks and the fused wrappers (``values_checked``): by default every call checks the
values of its index tensors (ranges, uniqueness), one host sync per call on a GPU. A caller on
the hot path that guarantees them itself (indices from its own allocator, checked once per
plan) passes ``checked=False`` to a fused wrapper or sets ``VP_CHECK_VALUES=0``: the wrapper then
checks everything that needs no device value (shapes, dtypes, strides, devices, scalars) and
launches without syncing; bad index values are then the caller's to rule out. While a CUDA
graph is being captured the values are never read (the captured values are not the replayed
ones, and a sync would break the capture).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import os
import struct
from collections.abc import Sequence

import numpy as np
import torch

INDEX_DTYPES = (torch.int32, torch.int64)
FP32 = torch.finfo(torch.float32)


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
    """Tensors live on different devices, or on one that holds no data (meta)."""


class ChoiceError(VerifyParityInputError):
    """A named option (a string) is not one of its legal values; the message lists them."""


class UnsupportedError(VerifyParityInputError):
    """Legal input that this implementation does not cover (a kernel's own limits)."""


def check_tensor(arg: str, t) -> None:
    """A dense tensor with data: not a list, not a meta tensor (no values to check or read), not sparse."""
    if not isinstance(t, torch.Tensor):
        raise DTypeError(arg, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.is_meta:
        raise DeviceError(arg, f"is a meta tensor (shape {tuple(t.shape)}): it holds no data")
    if t.layout != torch.strided:
        raise LayoutError(arg, f"must be a dense (strided) tensor, got layout {t.layout}")


def check_rank(arg: str, t: torch.Tensor, rank: int) -> None:
    check_tensor(arg, t)
    if t.dim() != rank:
        raise RankError(arg, f"expected {rank} dims, got shape {tuple(t.shape)}")


def check_shape(arg: str, t: torch.Tensor, shape: Sequence[int | None]) -> None:
    """``shape`` entries of None are free; the rank must match."""
    if type(t) is not torch.Tensor or t.is_meta or t.layout != torch.strided or t.dim() != len(shape):
        check_rank(arg, t, len(shape))  # the fast test above failed: the precise error (or a subclass passes)
    got = t.shape
    for axis, want in enumerate(shape):
        if want is not None and got[axis] != want:
            raise ShapeError(arg, f"expected shape {tuple(shape)} (None = any), got {tuple(got)}; axis {axis} differs")


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


def check_index(arg: str, t: torch.Tensor, shape: Sequence[int | None], dtypes: Sequence[torch.dtype] = INDEX_DTYPES
                ) -> None:
    """An index or pointer tensor: ``shape`` (None = any), an integer dtype, contiguous (LayoutError:
    kernels read it as ``ptr + i``)."""
    check_shape(arg, t, shape)
    check_dtype(arg, t, dtypes)
    check_contiguous(arg, t)


def check_same_device(**tensors: torch.Tensor | None) -> None:
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first, dev = name, t.device
        elif t.device != dev:
            raise DeviceError(name, f"on {t.device}, but {first} is on {dev}")


_VALUES_UNREAD = contextvars.ContextVar("verify_parity_values_unread", default=False)


@contextlib.contextmanager
def values_unchecked():
    """While the block runs, the value checks (``check_index_range``, ``check_unique``,
    ``check_index_values``) read nothing: calls made as a CUDA graph replays them
    (``harness.gpu.runners.capture_safe``), after a validated eager call on the same inputs.
    The checks that need no device value still run."""
    token = _VALUES_UNREAD.set(True)
    try:
        yield
    finally:
        _VALUES_UNREAD.reset(token)


def values_read() -> bool:
    """Whether the value checks read index values now (False inside ``values_unchecked``)."""
    return not _VALUES_UNREAD.get()


def check_index_range(arg: str, idx: torch.Tensor, *, low: int, high: int, allow_negative_padding: bool = False) -> None:
    """Every entry in [low, high); with ``allow_negative_padding`` any negative entry means 'skip'."""
    if idx.numel() == 0 or not values_read():
        return
    vals = idx[idx >= 0] if allow_negative_padding else idx
    if vals.numel() == 0:
        return
    lo, hi = int(vals.min()), int(vals.max())
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        raise RangeError(arg, f"entry {bad} outside [{low}, {high})")


def check_unique(arg: str, idx: torch.Tensor, *, ignore_negative: bool = True) -> None:
    """No two entries equal (negative ones ignored with ``ignore_negative``)."""
    if not values_read():
        return
    vals = idx[idx >= 0] if ignore_negative else idx
    if vals.numel() != torch.unique(vals).numel():
        raise RangeError(arg, DUPLICATE_MESSAGE)


CHECK_VALUES_ENV = "VP_CHECK_VALUES"
DUPLICATE_MESSAGE = "duplicate entries: two tokens would write the same slot"


VALUE_MODES = ("host", "device", "off")


def value_check_mode(checked) -> str:
    """How a fused wrapper checks index values: ``"host"`` (``checked=True``: before the launch, one
    host sync), ``"device"`` (``checked="device"``: in the kernel, raised by
    ``fused.device_checks.raise_pending``; a wrapper without device checks checks on the host) or
    ``"off"`` (``checked=False``). None: the environment, ``VP_CHECK_VALUES`` (host unless it is
    0 / false / no / off, or device)."""
    if checked is None:
        env = os.environ.get(CHECK_VALUES_ENV, "1").strip().lower()
        return "off" if env in ("0", "false", "no", "off") else "device" if env == "device" else "host"
    if checked == "device" and isinstance(checked, str):
        return "device"
    if isinstance(checked, str):
        raise DTypeError("checked", f"must be a bool or 'device', got str {checked!r}")
    return "host" if check_bool("checked", checked) else "off"


def values_checked(checked) -> bool:
    """Whether a wrapper without device-side checks reads index values on the host
    (``value_check_mode`` is not "off": "device" is checked on the host there)."""
    return value_check_mode(checked) != "off"


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_index_values(*specs: tuple) -> None:
    """Several index tensors' values in one host sync. Each spec is ``(arg, idx, low, high,
    allow_negative_padding, unique)``: every entry in [low, high) (any negative one means 'skip'
    with ``allow_negative_padding``), and with ``unique`` no two non-skipped entries equal.
    Raises what ``check_index_range`` then ``check_unique`` would, for the first failing spec in
    order. The tensors are already checked as index tensors (``check_index``) on one device.
    Skipped while a CUDA graph is being captured (module docstring) and inside ``values_unchecked``."""
    specs = [s for s in specs if s[1].numel() > 0]
    if not specs or not values_read() or _capturing(specs[0][1]):
        return
    big = torch.iinfo(torch.int64).max
    parts = []
    for _, idx, _, _, allow_neg, unique in specs:
        v = idx.long()
        keep = v >= 0 if allow_neg else torch.ones_like(v, dtype=torch.bool)
        lo = torch.where(keep, v, big).min()
        hi = torch.where(keep, v, -big).max()
        if unique:  # skipped entries become distinct negatives; sorted, a repeat sits next to its twin
            s = torch.sort(torch.where(keep, v, -1 - torch.arange(v.numel(), device=v.device))).values
            dup = ((s[1:] == s[:-1]) & (s[1:] >= 0)).any().long() if v.numel() > 1 else v.new_zeros(())
        else:
            dup = v.new_zeros(())
        parts.append(torch.stack((lo, hi, dup)))
    got = torch.stack(parts).tolist()  # the one sync
    for (arg, _, low, high, _, _), (lo, hi, dup) in zip(specs, got):
        if lo == big:  # every entry skipped
            continue
        if lo < low or hi >= high:
            raise RangeError(arg, f"entry {lo if lo < low else hi} outside [{low}, {high})")
        if dup:
            raise RangeError(arg, DUPLICATE_MESSAGE)


# ----------------------------------------------------------------------------- scalars

def _is_bool(x) -> bool:
    return isinstance(x, (bool, np.bool_))


def check_bool(arg: str, x) -> bool:
    """A flag: bool or numpy.bool_ (a str such as 'False', an int or a tensor is refused)."""
    if x is True or x is False:
        return x
    if not _is_bool(x):
        raise DTypeError(arg, f"must be a bool, got {type(x).__name__} {x!r}")
    return bool(x)


def check_int(arg: str, x, *, low: int, high: int | None = None) -> int:
    """An integer knob (int or numpy integer, not bool) in [low, high]; returned as int."""
    if type(x) is not int and (_is_bool(x) or not isinstance(x, numbers.Integral)):  # exact int: the fast path
        raise DTypeError(arg, f"must be an int, got {type(x).__name__} {x!r}")
    v = int(x)
    if v < low or (high is not None and v > high):
        raise RangeError(arg, f"must lie in [{low}, {high if high is not None else 'inf'}], got {v}")
    return v


def check_real(arg: str, x) -> float:
    """A real number (int, float, numpy scalar; not bool, str or tensor); returned as float."""
    if type(x) is float:  # the fast path
        return x
    if _is_bool(x) or not isinstance(x, numbers.Real):
        raise DTypeError(arg, f"must be a real number (float), got {type(x).__name__} {x!r}")
    try:
        return float(x)
    except OverflowError:  # an int past the float range
        raise RangeError(arg, f"{x!r} does not fit a float") from None


def fp32_value(x: float) -> float:
    """``x`` rounded to fp32 (to nearest even, subnormals kept; past the range ±inf), as a Python float."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # rounds past FP32.max
        return math.copysign(math.inf, x)


def check_fp32_scale(arg: str, x, *, value: float | None = None) -> float:
    """A positive factor that the ops apply in fp32 (a scale, an epsilon): a real number whose
    fp32 value is finite and normal, in [FP32.tiny, FP32.max] ~ [1.18e-38, 3.4e38]. A subnormal
    is refused too: a GPU kernel may flush it to zero, and its reciprocal overflows fp32.
    ``value``: check this derived value (a product or reciprocal of ``x``) instead, naming ``arg``.
    Returns ``float(x)`` (unrounded)."""
    v = check_real(arg, x)
    w = v if value is None else value
    w32 = fp32_value(w)
    if not (math.isfinite(w32) and FP32.tiny <= w32 <= FP32.max):
        what = "" if value is None else f" (the value the op applies, {value!r})"
        raise RangeError(arg, f"must be a positive finite normal fp32 number in [{FP32.tiny:.4g}, {FP32.max:.4g}]"
                              f"{what}, got {x!r} (fp32: {w32!r})")
    return v


def check_choice(arg: str, x, choices: Sequence[str]) -> str:
    """One of the named ``choices`` (strings); anything else names them all."""
    if not isinstance(x, str) or x not in choices:
        raise ChoiceError(arg, f"must be one of {tuple(choices)}, got {x!r}")
    return x
