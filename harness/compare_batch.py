"""A check's ``Record`` and the staged checks' batching: ``Check`` (a generator that yields the 1-d
tensor of numbers it needs on the host and returns its record), ``Batch`` (many checks, one transfer
to the host per device and stage) and ``resolve_one`` (one check made alone). ``harness.compare``
makes the checks and re-exports these names."""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Record:
    check: str  # e.g. "numeric:q_out", "exact:q8", "untouched:ring"
    passed: bool
    max_abs: float = float("nan")
    max_rel: float = float("nan")
    err: float = float("nan")  # scaled error of the implementation
    ref_err: float = float("nan")  # scaled error of the reference chain
    allowed: float = float("nan")
    mismatch_frac: float = float("nan")  # fraction of elements with scaled error > allowed (or differing bytes)
    nan_inf_mismatch: int = 0  # elements whose NaN/±Inf status differs from the oracle
    worst: str = ""  # "idx: got/oracle/ref; ..."
    detail: str = ""
    extra: dict = field(default_factory=dict)


Check = Generator[torch.Tensor, list, Record]  # a staged check: yields what it needs on the host, returns its record


class Batch:
    """Staged checks made together: ``add`` runs a check up to its first transfer (its device work
    queued on the tensors as they are now), ``resolve`` sends each stage's numbers of every check to
    the host in one transfer per device, then the next stage's, and returns the records in ``add``
    order. A check's later stages read only tensors its first stage made (a failure's details may
    read its ``got``: hand a copy of a buffer that is written before ``resolve``)."""

    def __init__(self):
        self._records: list[Record | None] = []
        self._live: list[tuple[int, Check, torch.Tensor]] = []

    def __len__(self) -> int:
        return len(self._records)

    def add(self, check: Check | Record) -> int:
        """Start ``check`` (a record made already is kept as it is); its index in ``resolve``'s list."""
        k = len(self._records)
        self._records.append(check if isinstance(check, Record) else None)
        if not isinstance(check, Record):
            self._step(k, check, None)
        return k

    def _step(self, k: int, check: Check, values: list | None) -> None:
        try:
            want = next(check) if values is None else check.send(values)
        except StopIteration as done:
            self._records[k] = done.value
            return
        self._live.append((k, check, want))

    def resolve(self) -> list[Record]:
        """Every check's record (one host transfer per device and stage); the batch is empty after."""
        while self._live:
            live, self._live = self._live, []
            by_dev: dict[torch.device, list] = {}
            for item in live:
                by_dev.setdefault(item[2].device, []).append(item)
            for items in by_dev.values():
                flat = torch.cat([w.reshape(-1).double() for _, _, w in items]).tolist() if len(items) > 1 \
                    else items[0][2].reshape(-1).double().tolist()
                off = 0
                for k, check, w in items:
                    n = w.numel()
                    self._step(k, check, flat[off: off + n])
                    off += n
        out, self._records = self._records, []
        return out


def resolve_one(check: Check) -> Record:
    """One staged check's record, made alone."""
    b = Batch()
    b.add(check)
    return b.resolve()[0]
