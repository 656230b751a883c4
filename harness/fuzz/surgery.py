"""Tensor surgery: fills and concatenations that every CUDA build takes (fp8 through its bytes),
views that keep a tensor's values and hide junk in their storage (strided rows, an innermost
stride of 2, a storage offset), and the byte snapshots that see a write into that junk."""
from __future__ import annotations

import numpy as np
import torch

from harness.fuzz.declared import FP8


def junk_value(dtype: torch.dtype, kind: str):
    """A junk value of ``kind`` (nan | huge | negative) that ``dtype`` holds."""
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point:
        if kind == "nan":
            return float("nan")
        big = float(torch.finfo(dtype).max)
        return -big if kind == "negative" else big
    big = 2 ** 30 if torch.iinfo(dtype).bits <= 32 else 2 ** 40
    if torch.iinfo(dtype).bits < 32:
        big = torch.iinfo(dtype).max // 2
    return -big if kind == "negative" and torch.iinfo(dtype).min < 0 else big


def fill_(t: torch.Tensor, value) -> torch.Tensor:
    """``t.fill_(value)``; fp8 through its bytes (the code torch's CPU cast gives), which every CUDA build takes."""
    if t.dtype in FP8:
        code = torch.tensor([float(value)]).to(t.dtype).view(torch.uint8)[0]
        t.view(torch.uint8).fill_(int(code))
        return t
    return t.fill_(value)


def cat(ts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat``; fp8 through its bytes (cat of float8 is not on every CUDA build)."""
    if ts[0].dtype in FP8:
        return torch.cat([t.view(torch.uint8) for t in ts], dim).view(ts[0].dtype)
    return torch.cat(ts, dim)


def _filled(shape, like: torch.Tensor, junk: str) -> torch.Tensor:
    return fill_(torch.empty(shape, dtype=like.dtype, device=like.device), junk_value(like.dtype, junk))


def rows_view(t: torch.Tensor, junk: str, pad: int = 3) -> torch.Tensor:
    """Same values, rows strided: the first ``n`` columns of a wider tensor whose other columns hold junk."""
    wide = _filled((*t.shape[:-1], t.shape[-1] + pad), t, junk)
    wide[..., : t.shape[-1]].copy_(t)
    return wide[..., : t.shape[-1]]


def interleaved_view(t: torch.Tensor, junk: str) -> torch.Tensor:
    """Same values, innermost stride 2: every other element of a twice-wide tensor, junk between
    (``stack([t, junk], -1)[..., 0]``)."""
    wide = _filled((*t.shape[:-1], 2 * t.shape[-1]), t, junk)
    wide[..., ::2].copy_(t)
    return wide[..., ::2]


def offset_view(t: torch.Tensor, junk: str, offset: int = 5) -> torch.Tensor:
    """Same values, contiguous, at a storage offset past ``offset`` junk elements."""
    big = _filled((t.numel() + offset,), t, junk)
    view = big[offset:].view(t.shape)
    view.copy_(t)
    return view


_NAN_BITS = {torch.bfloat16: (torch.int16, 0x7FC0), torch.float32: (torch.int32, 0x7FC00000),
             torch.float8_e4m3fn: (torch.uint8, 0x7F), torch.float8_e4m3fnuz: (torch.uint8, 0x80)}


def fill_rows_nan(t: torch.Tensor, rows: torch.Tensor) -> None:
    """Rows ``rows`` of ``t`` (any strides) set to the dtype's NaN, through an integer view."""
    if rows.numel():
        int_dtype, bits = _NAN_BITS[t.dtype]
        t.view(int_dtype).index_fill_(0, rows.to(t.device), bits)


def element_at(t: torch.Tensor, at: float) -> tuple[int, ...]:
    """The element at fraction ``at`` of ``t`` in row-major order."""
    i = min(int(at * t.numel()), t.numel() - 1)
    return tuple(int(x) for x in np.unravel_index(i, tuple(t.shape)))


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).cpu().clone()


def _covered(t: torch.Tensor) -> torch.Tensor:
    """Bool mask over the bytes of ``t``'s storage: the bytes its view reads or writes."""
    n = t.untyped_storage().nbytes() // t.element_size()
    mask = torch.zeros(n, dtype=torch.bool)
    if t.numel():
        mask[torch.arange(n).as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1)] = True
    return mask.repeat_interleave(t.element_size())


def snapshot(kw: dict) -> dict:
    return {k: (_storage_bytes(v), _covered(v)) for k, v in kw.items()
            if isinstance(v, torch.Tensor) and v.device.type != "meta"}


def changed(snap: dict, kw: dict, writable: tuple[str, ...] = ()) -> list[str]:
    """Arguments whose storage bytes changed since ``snap``; for ``writable`` ones only bytes outside their view."""
    out = []
    for k, (before, covered) in snap.items():
        after = _storage_bytes(kw[k])
        diff = before != after
        if k in writable:
            diff &= ~covered
        if bool(diff.any()):
            out.append(k)
    return out
