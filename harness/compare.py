"""Comparisons return records; the policy (``harness.tolerance``) decides afterwards.

``finite`` checks that an output's NaN/±Inf placement is the oracle's; ``numeric`` measures it
against the fp64 oracle and the reference chain's own error on the elements both hold finite
(a NaN is never a precision failure: ``finite`` owns it); ``exact`` compares bytes (uint8 views);
``untouched`` checks that rows nobody should write kept their bytes; ``unchanged`` that a whole
input kept its bytes (on its device). None of them raises on a mismatch: ``Record.passed`` says.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.tolerance import Tolerance

WORST_K = 3


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


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """Shape (*t.shape, itemsize) uint8 on the CPU (a 0-d tensor: (itemsize,)); 0 elements give 0 bytes."""
    return t.detach().contiguous().cpu().view(torch.uint8).reshape(*t.shape, t.element_size()) if t.dim() else \
        t.detach().cpu().reshape(1).contiguous().view(torch.uint8)


def _scaled(x: torch.Tensor, o: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    finite = torch.isfinite(o) & torch.isfinite(x)
    e = (x - o).abs() / (tol.atol + tol.rtol * o.abs())
    return torch.where(finite, e, torch.zeros_like(e))


def _special_mismatch(x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    return (torch.isnan(x) != torch.isnan(o)) | (torch.isposinf(x) != torch.isposinf(o)) | \
        (torch.isneginf(x) != torch.isneginf(o))


def _idx(i: int, shape) -> tuple[int, ...]:
    return tuple(int(v) for v in torch.unravel_index(torch.tensor(i), shape))


def _as_f64(check: str, got: torch.Tensor | None, oracle: torch.Tensor):
    """(None, got, oracle) in fp64 on the CPU, or (the record that ends the check: output missing,
    wrong shape, empty; None, None)."""
    if got is None:
        return Record(check, False, detail="output missing (None)"), None, None
    if tuple(got.shape) != tuple(oracle.shape):
        return Record(check, False, detail=f"shape {tuple(got.shape)} != oracle {tuple(oracle.shape)}"), None, None
    if oracle.numel() == 0:
        return Record(check, True, detail="empty"), None, None
    return None, got.detach().cpu().double(), oracle.detach().cpu().double()


def finite(check: str, got: torch.Tensor | None, oracle: torch.Tensor) -> Record:
    """NaN/±Inf placement: every element of ``got`` is NaN, +Inf, -Inf or finite exactly where
    the fp64 ``oracle`` is. Fails with the count (how many are non-finite where the oracle is
    finite, and the reverse) and the first ``WORST_K`` positions in row-major order."""
    done, x, o = _as_f64(check, got, oracle)
    if done is not None:
        return done
    bad = _special_mismatch(x, o).flatten()
    n = int(bad.sum())
    if not n:
        return Record(check, True, mismatch_frac=0.0)
    fo, fx = torch.isfinite(o).flatten(), torch.isfinite(x).flatten()
    first = torch.nonzero(bad).flatten()[:WORST_K].tolist()
    worst = "; ".join(f"{_idx(i, o.shape)}: {float(x.flatten()[i]):.6g}/{float(o.flatten()[i]):.6g}" for i in first)
    return Record(check, False, mismatch_frac=n / o.numel(), nan_inf_mismatch=n, worst=worst + "  (got/oracle)",
                  detail=f"{n} of {o.numel()} elements: {int((bad & fo).sum())} non-finite where the oracle is "
                         f"finite, {int((bad & ~fo & fx).sum())} finite where it is not, "
                         f"{int((bad & ~fo & ~fx).sum())} the wrong non-finite value (NaN for ±Inf, or the sign)")


def numeric(check: str, got: torch.Tensor | None, oracle: torch.Tensor, ref: torch.Tensor | None, tol: Tolerance,
            *, is_reference: bool = False) -> Record:
    """Scaled error of ``got`` (and ``ref``) against the fp64 ``oracle`` on the elements where
    both are finite; see harness.tolerance. NaN/±Inf placement does not fail it (``finite``
    does): ``nan_inf_mismatch`` counts those elements for information."""
    done, x, o = _as_f64(check, got, oracle)
    if done is not None:
        return done
    finite_o = o[torch.isfinite(o)]
    if finite_o.numel() and finite_o.abs().max() < 100 * tol.atol:
        return Record(check, False, detail=f"degenerate case: oracle max |o| = {float(finite_o.abs().max()):.3g} "
                                           f"is under 100×atol, writing zeros would pass")
    e = _scaled(x, o, tol)
    err = float(e.max())
    ref_err = float("nan")
    r = None
    if ref is not None:
        r = ref.detach().cpu().double()
        ref_err = float(_scaled(r, o, tol).max()) if r.shape == o.shape else float("nan")
    allowed = tol.allowed(ref_err, is_reference=is_reference)
    n_special = int(_special_mismatch(x, o).sum())
    both = torch.isfinite(o) & torch.isfinite(x)  # the elements measured
    n_both = int(both.sum())
    diff = torch.where(both, (x - o).abs(), torch.zeros_like(o))
    rel = diff / o.abs().clamp_min(tol.atol)
    flat = torch.where(both, e, torch.full_like(e, -1.0)).flatten()
    worst = []
    for i in torch.topk(flat, min(WORST_K, n_both)).indices.tolist():
        rv = f"/{float(r.flatten()[i]):.6g}" if r is not None and r.shape == o.shape else ""
        worst.append(f"{_idx(i, o.shape)}: {float(x.flatten()[i]):.6g}/{float(o.flatten()[i]):.6g}{rv}")
    return Record(
        check, passed=err <= allowed,
        max_abs=float(diff.max()), max_rel=float(rel.max()), err=err, ref_err=ref_err, allowed=allowed,
        mismatch_frac=float((e > allowed).double().sum()) / max(1, n_both), nan_inf_mismatch=n_special,
        worst="; ".join(worst) + "  (got/oracle/ref)" if worst else "",
        detail=f"{n_special} elements with NaN/Inf placement unlike the oracle's are left out (see finite:)"
        if n_special else "",
    )


def exact(check: str, got: torch.Tensor | None, want: torch.Tensor) -> Record:
    """Byte-identical contract (fp8 bytes, cache rows, indices)."""
    if got is None:
        return Record(check, False, detail="output missing (None)")
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return Record(check, False, detail=f"{tuple(got.shape)} {got.dtype} != expected {tuple(want.shape)} {want.dtype}")
    gb, wb = _bytes(got), _bytes(want)
    bad = (gb != wb)
    n = int(bad.sum())
    worst = ""
    if n:
        elem_bad = bad.reshape(*got.shape, -1).any(-1) if got.dim() else bad.any().reshape(())
        idxs = torch.nonzero(elem_bad)[:WORST_K].tolist()
        worst = "; ".join(f"{tuple(i)}: {gb[tuple(i)].tolist()} != {wb[tuple(i)].tolist()}" for i in idxs)
    return Record(check, n == 0, mismatch_frac=n / max(1, gb.numel()), worst=worst,
                  detail="" if n == 0 else f"{n} bytes differ")


def untouched(check: str, after: torch.Tensor, before: torch.Tensor, written_rows: torch.Tensor) -> Record:
    """Every row of ``after`` not listed in ``written_rows`` is byte-identical to ``before``."""
    keep = torch.ones(after.shape[0], dtype=torch.bool)
    if written_rows.numel():
        keep[written_rows.cpu().long()] = False
    ab, bb = _bytes(after)[keep], _bytes(before)[keep]
    bad_rows = (ab != bb).flatten(1).any(-1)
    n = int(bad_rows.sum())
    rows = torch.nonzero(keep).flatten()[bad_rows][:WORST_K].tolist()
    return Record(check, n == 0, mismatch_frac=n / max(1, int(keep.sum())),
                  worst="" if n == 0 else f"rows {rows} changed",
                  detail="" if n == 0 else f"{n} rows outside the write set changed")


def _device_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s elements in logical order, on its device (a copy only for a non-contiguous view)."""
    t = t.detach()
    return (t.reshape(1) if t.dim() == 0 else t).contiguous().view(torch.uint8)


def unchanged(check: str, after: torch.Tensor, before: torch.Tensor, *, hint: str = "") -> Record:
    """Every byte of ``after`` equals ``before`` (an input a call may not write, against its
    pristine copy). Compared on the tensors' device; only a failure is described on the host."""
    if tuple(after.shape) == tuple(before.shape) and after.dtype == before.dtype and \
            torch.equal(_device_bytes(after), _device_bytes(before)):
        return Record(check, True)
    r = exact(check, after, before)
    return Record(check, False, mismatch_frac=r.mismatch_frac, worst=r.worst,
                  detail=f"{r.detail or 'changed'} from the caller's: written in place{hint}")


def bitwise_equal(check: str, a: dict, b: dict) -> Record:
    """Two runs of the same implementation on the same inputs: every tensor byte-identical."""
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if (x is None) != (y is None):
            return Record(check, False, detail=f"{name}: present in one run only")
        if x is None:
            continue
        r = exact(check, x, y)
        if not r.passed:
            return Record(check, False, mismatch_frac=r.mismatch_frac, worst=f"{name}: {r.worst}", detail=f"{name} differs between runs: {r.detail}")
    return Record(check, True)
