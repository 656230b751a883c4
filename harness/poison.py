"""A poisoned allocator: every fresh allocation made while it is active starts out as NaN.

A kernel that reads memory it never wrote (split-KV scratch of a split nobody launched, the
tail of a padded buffer, a partial left by a skipped program) gets whatever the allocator hands
out — usually finite leftovers or zero pages, which an arithmetic detail can hide (SGLang's
split-KV combine multiplies a stale split by 0: 0 · finite = 0, but 0 · NaN = NaN). Under
``allocations()`` such a read is a NaN in the output, which ``compare.finite`` reports.

What is poisoned:
  * Python-level uninitialised allocators, CPU and GPU: ``torch.empty``, ``empty_like``,
    ``empty_strided``, ``empty_permuted``, ``Tensor.new_empty``, ``Tensor.new_empty_strided``
    (a ``TorchFunctionMode``; ``zeros``/``ones``/``full``/``*_like`` with a value are left
    alone: their contents are part of what the caller asked for).
  * CUDA / ROCm only, allocations C++ makes without Python (aten, extension ops): before the
    call, the caching allocator's free memory is filled with 0xFF bytes (``poison_cached_memory``),
    so an allocation served from the cache starts as 0xFF. Allocations that need a fresh
    segment from the driver are not covered; on the CPU, C++ allocations are not covered.

Fill values (``fill``): float NaN (``fill=nan``, the poison) or zero (``fill=0.0``, the control:
a "zero-filled allocator" under which a stale read of partials m = 0, l = 0, acc = 0 usually
contributes nothing, so a test can show that the poison — not something else — is what fails).
Per dtype:
  * floating (bf16, fp16, fp32, fp64, every fp8 flavour incl. e4m3fnuz, whose NaN is 0x80, not
    0xFF) and complex: ``fill_(fill)``, i.e. the dtype's own NaN;
  * signed / unsigned integers: all bytes 0xFF (-1, or the type's maximum) under the poison, 0
    under the control. Never 0 under the poison: 0 is what counters, locks and offsets are meant
    to start from, so it would hide a missing initialisation; -1 / max is an out-of-range index
    and a negative length, so a read-before-write either changes the answer or crashes (a crash
    is the implementation's ``run`` failure, with its message; on a GPU an out-of-bounds access
    can end the process's CUDA context, so later cases of that process fail too — a real bug
    either way, since uninitialised memory can hold the same values);
  * bool: True under the poison (0xFF bytes are not a valid bool), False under the control.

Cached scratch: third-party kernels often keep scratch buffers in module-level dicts across
calls (allocated on the first call, reused after). The poison only sees allocations made
*during* the call, so an adapter that wraps such a kernel must allocate per call (or clear
the kernel's cache before calling it) for the poisoned-allocator run to test its scratch.
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch.overrides import TorchFunctionMode

from reference.checks import VerifyParityInputError

NAN = float("nan")
# the uninitialised allocators (those whose contents the caller did not choose)
ALLOCATORS = frozenset(f for f in (
    torch.empty, torch.empty_like, torch.empty_strided, getattr(torch, "empty_permuted", None),
    torch.Tensor.new_empty, torch.Tensor.new_empty_strided) if f is not None)
# CUDA: the block through which a call's new allocations are served poisoned, at most this
# many bytes and at most this fraction of the device's free memory
CUDA_BLOCK_BYTES = 256 << 20
CUDA_BLOCK_FREE_FRACTION = 0.25
CUDA_SMALL_BYTES = 1 << 20  # the caching allocator's small-pool limit (its kSmallSize)
CUDA_SMALL_BLOCKS = 16  # small-pool blocks poisoned (8 of its 2 MiB segments)


def fill_(t: torch.Tensor, fill: float) -> torch.Tensor:
    """Fill ``t`` in place with ``fill`` (NaN or 0.0) as described for its dtype in the module docstring."""
    if t.numel() == 0:
        return t
    poison = math.isnan(fill)
    if t.dtype.is_floating_point or t.dtype.is_complex:  # fp8 too: CPU torch 2.13, CUDA torch 2.11 (H200)
        return t.fill_(fill)
    if t.dtype == torch.bool:
        return t.fill_(poison)
    if not poison:
        return t.zero_()
    return t.fill_(-1 if t.dtype.is_signed else torch.iinfo(t.dtype).max)  # all bytes 0xFF


class PoisonedAllocations(TorchFunctionMode):
    """``TorchFunctionMode`` filling the result of every call in ``ALLOCATORS`` with ``fill``.
    Modes nest: an inner one fills last, so its value is what the call sees."""

    def __init__(self, fill: float = NAN):
        if not (math.isnan(fill) or fill == 0):
            raise VerifyParityInputError("fill", f"expected NaN (the poison) or 0.0 (the control), got {fill!r}")
        super().__init__()
        self.fill = fill
        self.count = 0  # allocations filled while active

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in ALLOCATORS and isinstance(out, torch.Tensor):
            fill_(out, self.fill)
            self.count += 1
        return out


def poison_cached_memory(device: torch.device, *, fill: float = NAN) -> int:
    """CUDA / ROCm: fill the caching allocator's free memory on ``device`` (0xFF bytes under the
    poison, zeros under the control) so that allocations C++ makes next reuse it. Returns the
    bytes filled; 0 on the CPU.

    First the cache's empty segments go back to the driver (``empty_cache``), then every free
    block left inside segments still in use is taken, plus one block of ``CUDA_BLOCK_BYTES``
    (bounded by ``CUDA_BLOCK_FREE_FRACTION`` of free memory) for the large pool and
    ``CUDA_SMALL_BLOCKS`` of the small pool; all are filled and freed, so they sit in the cache."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0
    index = torch.cuda.current_device() if device.index is None else device.index
    dev = torch.device("cuda", index)
    torch.cuda.synchronize(index)
    torch.cuda.empty_cache()
    held = []
    free_blocks = [b["size"] for seg in torch.cuda.memory_snapshot() if seg.get("device", index) == index
                   for b in seg["blocks"] if b["state"] == "inactive"]
    for size in sorted(free_blocks, reverse=True):  # largest first: each request best-fits its own block
        held.append(torch.empty(size, dtype=torch.uint8, device=dev))
    free, _ = torch.cuda.mem_get_info(dev)
    big = min(CUDA_BLOCK_BYTES, int(free * CUDA_BLOCK_FREE_FRACTION))
    if big > CUDA_SMALL_BYTES:
        held.append(torch.empty(big, dtype=torch.uint8, device=dev))
    held += [torch.empty(CUDA_SMALL_BYTES, dtype=torch.uint8, device=dev) for _ in range(CUDA_SMALL_BLOCKS)]
    byte = 0 if fill == 0 else 0xFF
    for t in held:
        t.fill_(byte)
    n = sum(t.numel() for t in held)
    del held
    torch.cuda.synchronize(index)
    return n


@contextlib.contextmanager
def allocations(fill: float = NAN, *, device: torch.device | None = None):
    """Inside: every fresh allocation is pre-filled with ``fill`` (see the module docstring).
    ``device``: a CUDA device whose cached free memory is poisoned on entry too. Yields the
    ``PoisonedAllocations`` mode (its ``count``: allocations filled). Unwinds on exceptions."""
    if device is not None:
        poison_cached_memory(device, fill=fill)
    with PoisonedAllocations(fill) as mode:
        yield mode
