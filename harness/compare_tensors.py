"""Where a check computes and the tensor helpers the checks share: ``home`` (the device of a check,
``VP_COMPARE_ON``), moves to it (``_home``, ``_on``), byte views (``_bytes``, ``_device_bytes``), the
finite test from ``abs`` (``_finite``), flat index to multi-index (``_idx``) and a top-k that is known
to be the only answer (``_topk_device``, ``_topk_unique``). ``harness.compare`` re-exports them."""
from __future__ import annotations

import os

import torch


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s elements, on its device. Shape: (*t.shape, itemsize); (itemsize,) for a 0-d ``t``.

    0 elements give 0 bytes (the itemsize is spelled out: a -1 cannot be inferred from none).
    """
    return t.detach().contiguous().view(torch.uint8).reshape(*t.shape, t.element_size()) if t.dim() else \
        t.detach().reshape(1).contiguous().view(torch.uint8)


COMPARE_ON_ENV = "VP_COMPARE_ON"  # device (default) | cpu | auto
AUTO_CPU_ELEMENTS = 1 << 16  # ``auto``: a checked tensor of at most this many elements is compared on the CPU


def home(t: torch.Tensor, mode: str | None = None) -> torch.device:
    """Where a check of ``t`` computes (``mode``: default ``$VP_COMPARE_ON``, else ``device``):
    ``device`` on ``t``'s own; ``cpu`` on the CPU; ``auto`` on the CPU when ``t`` has at most
    ``AUTO_CPU_ELEMENTS`` elements, else on its own device. A record is the same wherever it is
    made (IEEE fp64 and byte comparisons); the choice is cost only: on a GPU shared by many
    processes each small kernel and each wait is a turn among their contexts, while one copy of a
    small tensor to the host is one wait and no kernels."""
    mode = mode or os.environ.get(COMPARE_ON_ENV) or "device"
    if mode not in ("device", "cpu", "auto"):
        raise ValueError(f"{COMPARE_ON_ENV}: expected device, cpu or auto, got {mode!r}")
    if t.device.type == "cpu" or mode == "device" or (mode == "auto" and t.numel() > AUTO_CPU_ELEMENTS):
        return t.device
    return torch.device("cpu")


def _home(t: torch.Tensor) -> torch.Tensor:
    """``t`` where its check computes (``home``)."""
    where = home(t)
    return t if t.device == where else t.to(where)


def _on(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` on ``like``'s device (itself when it is there already)."""
    return t if t.device == like.device else t.to(like.device)


def _finite(a: torch.Tensor) -> torch.Tensor:
    """``torch.isfinite(a)`` from ``a.abs()`` (NaN < inf is False), in one op instead of several."""
    return a < float("inf")


def _idx(i: int, shape) -> tuple[int, ...]:
    """The multi-index of flat (row-major) index ``i`` in ``shape``, as ``torch.unravel_index``
    gives it, in plain integers: that call costs ~10 ms of host time per record on a GPU run."""
    out = []
    for n in reversed(tuple(shape)):
        i, r = divmod(i, n)
        out.append(r)
    return tuple(reversed(out))


def _topk_device(flat: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, unique) of ``torch.topk(flat, k)`` on ``flat``'s device, nothing sent to the host:
    ``unique`` (a bool tensor) is True when that answer is the only one (the ``k`` largest values are
    distinct and no other element equals the ``k``-th: any algorithm gives it). Shape: flat (n,), 1 <= k <= n."""
    v, i = torch.topk(flat, k)
    unique = (flat >= v[-1]).sum() == k
    if k > 1:
        unique &= (v[:-1] > v[1:]).all()
    return i, unique


def _topk_unique(flat: torch.Tensor, k: int) -> list[int] | None:
    """``torch.topk(flat, k).indices`` when that answer is the only one (``_topk_device``), else None."""
    i, unique = _topk_device(flat, k)
    return i.tolist() if bool(unique) else None


def _device_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s elements in logical order, on its device (a copy only for a non-contiguous view)."""
    t = t.detach()
    return (t.reshape(1) if t.dim() == 0 else t).contiguous().view(torch.uint8)
