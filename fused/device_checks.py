"""Value checks on the device: ``checked="device"`` of a fused wrapper (``fused.qk_norm_rope.wrapper``).

The host checks (``checked=True``, the default) read the index tensors' values before anything is
written, in one host sync per call. On the hot path that sync is most of a call's cost, and under
CUDA-graph replay it cannot run at all. ``checked="device"`` moves them into the kernel: the
wrapper checks every shape, dtype, stride, device and scalar on the host as always (no sync), and
the kernel's kv programs check the values they are about to use:

- a position outside the cos/sin table: bit ``POSITIONS``;
- with a store, a slot past the store target's rows: bit ``SLOT_PAST``, and a slot that another
  token of the call names too (each kv program scans ``loc``): bit ``SLOT_TWICE``.

A token with such a value is not stored (the ring rows or pool slots it names keep their bytes;
no token writes a slot another one names), nothing is read or written outside its tensor, and
its q_out / kv_out rows are not the op's (its position reads row 0 of the table). The kernel
records what it saw in this device's **error record** (``FLAG_WORDS`` int64: the bits, then one
offending value and its bound per kind) and returns without waiting. The record is read by
``raise_pending()``, one sync at a point the caller picks (the end of a decode step, after a graph
replay): it raises the ``RangeError`` the host check would have raised, naming ``positions`` or
``loc``, and clears the record. What is weaker than the host checks, and only that: the error
comes at that point instead of at the call, and the call's valid tokens were written.
"""
from __future__ import annotations

import torch

from reference.checks import DUPLICATE_MESSAGE, RangeError, UnsupportedError

POSITIONS, SLOT_PAST, SLOT_TWICE = 1, 2, 4
# [bits, a bad position, n_pos, a slot past the store, n_slots, a slot named twice]
FLAG_WORDS = 6

_records: dict[torch.device, torch.Tensor] = {}


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def record(device: torch.device) -> torch.Tensor:
    """This device's error record (allocated zeroed on first use, then the same tensor: a captured
    CUDA graph keeps writing the one it captured). Allocated inside a capture, its zeroing would be
    captured too and rerun by every replay: a graph's first device-checked call must come after one
    outside it (or after ``record(device)``)."""
    rec = _records.get(device)
    if rec is None:
        if _capturing():
            raise UnsupportedError("checked", "the first checked='device' call on a device is being captured "
                                              "into a CUDA graph: call fused.device_checks.record(device) (or "
                                              "the op once) before capturing")
        rec = _records[device] = torch.zeros(FLAG_WORDS, dtype=torch.int64, device=device)
    return rec


def pending(device: torch.device | None = None) -> list[RangeError]:
    """The errors recorded on ``device`` (every device used so far when None), oldest kind first,
    and the record cleared. One host sync per device; none while a CUDA graph is being captured (the
    record cannot be read then: it keeps what it holds for the next call outside the capture)."""
    errors = []
    if _capturing():
        return errors
    for dev, rec in list(_records.items()):
        if device is not None and torch.device(device) != dev:
            continue
        bits, bad_pos, n_pos, past, n_slots, twice = rec.tolist()
        if not bits:
            continue
        rec.zero_()
        if bits & POSITIONS:
            errors.append(RangeError("positions", f"entry {bad_pos} outside [0, {n_pos}) (checked on the device)"))
        if bits & SLOT_PAST:
            errors.append(RangeError("loc", f"entry {past} outside [0, {n_slots}) (checked on the device)"))
        if bits & SLOT_TWICE:
            errors.append(RangeError("loc", f"{DUPLICATE_MESSAGE}: slot {twice} (checked on the device)"))
    return errors


def raise_pending(device: torch.device | None = None) -> None:
    """Raise the first error the kernels recorded since the last call (``pending``), if any."""
    errors = pending(device)
    if errors:
        raise errors[0]
