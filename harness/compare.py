"""Comparisons return records; the policy (``harness.tolerance``) decides afterwards.

``finite`` checks that an output's NaN/±Inf placement is the oracle's; ``numeric`` measures it
against the fp64 oracle and the reference chain's own error on the elements both hold finite
(a NaN is never a precision failure: ``finite`` owns it); ``exact`` compares bytes (uint8 views);
``untouched`` checks that rows nobody should write kept their bytes; ``unchanged`` that a whole
input kept its bytes. None of them raises on a mismatch: ``Record.passed`` says.

Every check computes on the checked tensor's device (the other tensor is copied there), or on the
CPU for the tensors ``VP_COMPARE_ON`` sends there (``home``): fp64 abs, sub, div, comparisons and
max are correctly rounded IEEE on a GPU as on the CPU, so a record is the same wherever it is
made; the host gets the scalars and the few worst elements.

Each check is also a *staged* generator (``exact_check``, ``finite_check``, ``numeric_check``,
``untouched_check``): it queues its device work, yields the 1-d tensor of numbers it needs on the
host, is sent them as a list of floats, and returns its ``Record``. ``Batch`` makes many checks with
one transfer to the host per device and stage for all of them (a timeline step's checks: two
instead of ~30); the eager functions are one check resolved alone, so both give the same record.

Where a check computes: ``home`` (``VP_COMPARE_ON``) and the moves to it (``at_home``, ``on_device_of``);
byte views of a tensor's elements (``as_bytes``, ``device_bytes``).
"""
from __future__ import annotations

import functools
import os
from collections.abc import Generator
from dataclasses import dataclass, field

import torch

from harness.tolerance import Tolerance


# ----------------------------------------------------------------------------- where a check computes, byte views

def as_bytes(t: torch.Tensor) -> torch.Tensor:
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


def at_home(t: torch.Tensor) -> torch.Tensor:
    """``t`` where its check computes (``home``)."""
    where = home(t)
    return t if t.device == where else t.to(where)


def on_device_of(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
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


def device_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s elements in logical order, on its device (a copy only for a non-contiguous view)."""
    t = t.detach()
    return (t.reshape(1) if t.dim() == 0 else t).contiguous().view(torch.uint8)


_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Whether any element of ``a`` and ``b`` (one shape and dtype) differs in its bytes, as a 0-d bool on
    ``a``'s device (``b`` moved there). Elements are compared as integers of their width: views, whatever
    the strides, no copy; two floats' bits are equal exactly where their bytes are (NaN payloads, -0.0)."""
    b = on_device_of(b, a)
    w = _INT_OF_WIDTH.get(a.element_size())
    if w is None:  # a 16-byte complex
        return (as_bytes(a) != as_bytes(b)).any()
    return (a.detach().view(w) != b.detach().view(w)).any()


SAME_TOGETHER_BYTES = 4 << 20  # ``same``: tensors up to this size are compared together, as one byte vector


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)  # (a copy for a non-contiguous t; only compared, never written)


def same(pairs, *, memo: dict | None = None) -> bool:
    """Every (a, b) pair holds the same thing: both None, equal non-tensors, or tensors of one shape, dtype
    and device with the same bytes. Compared on the tensors' device, one transfer per device: the small
    tensors' bytes together (one ``cat`` of each side, one comparison; ``SAME_TOGETHER_BYTES``), larger ones
    each (``differ``). ``memo``: a dict keeping the ``cat`` of the b sides for the next call with the same b
    tensors (the pristine inputs of a case, compared after every run)."""
    return same_each([pairs], memo=memo)[0]


def same_each(groups: list, *, memo: dict | None = None) -> list[bool]:
    """``same`` of each group of pairs, every group's flags in the same transfer (one per device)."""
    answer = [True] * len(groups)
    flags: dict[torch.device, list] = {}  # device -> [(group, 0-d flag: some byte differs)]
    for g, pairs in enumerate(groups):
        together: dict[torch.device, list] = {}
        for a, b in pairs:
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
                    answer[g] = False
                    break
                if a is b or not a.numel():
                    continue
                if a.numel() * a.element_size() <= SAME_TOGETHER_BYTES:
                    together.setdefault(a.device, []).append((a, b))
                else:
                    flags.setdefault(a.device, []).append((g, differ(a, b)))
            elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                answer[g] = False
                break
            else:
                try:
                    if type(a) is not type(b) or not bool(a == b):
                        answer[g] = False
                        break
                except Exception:  # an == that does not answer a bool: not known equal
                    answer[g] = False
                    break
        if not answer[g]:
            continue
        for dev, ab in together.items():
            flags.setdefault(dev, []).append((g, differ(*ab[0]) if len(ab) == 1 else _differ_together(ab, memo)))
    for fl in flags.values():
        live = [(g, f) for g, f in fl if answer[g]]
        if live:
            for (g, _), changed in zip(live, torch.stack([f for _, f in live]).tolist()):
                answer[g] = answer[g] and not changed
    return answer


def _differ_together(ab: list, memo: dict | None) -> torch.Tensor:
    """``differ`` of several small (a, b) pairs of one device at once: each side's bytes in one vector."""
    key = tuple(id(b) for _, b in ab)
    held = memo.get(key) if memo is not None else None
    if held is None:
        held = ([b for _, b in ab], torch.cat([_flat_bytes(b) for _, b in ab]))  # the b tensors keep the ids
        if memo is not None:
            memo[key] = held
    return (torch.cat([_flat_bytes(a) for a, _ in ab]) != held[1]).any()


# ----------------------------------------------------------------------------- records and staged checks

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
    order (a check that makes two, ``finite_numeric_check``, returns them as one tuple). A check's later
    stages read only tensors its first stage made (a failure's details may read its ``got``: hand a copy
    of a buffer that is written before ``resolve``)."""

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
                flat = _gathered([w for _, _, w in items]).tolist()
                off = 0
                for k, check, w in items:
                    n = w.numel()
                    self._step(k, check, flat[off: off + n])
                    off += n
        out, self._records = self._records, []
        return out


def _gathered(wants: list[torch.Tensor]) -> torch.Tensor:
    """The numbers of ``wants`` (one device) as one fp64 vector, in order: one ``cat`` (which promotes bool and
    integer counts to fp64 when an fp64 is among them, exactly as converting each does) and one conversion,
    not one conversion per tensor; each converted first where the promoted dtype is a narrower float."""
    if len(wants) == 1:
        return wants[0].reshape(-1).double()
    dtype = functools.reduce(torch.promote_types, (w.dtype for w in wants))
    if dtype.is_floating_point and dtype != torch.float64:  # an int64 count must not pass through fp32
        return torch.cat([w.reshape(-1).double() for w in wants])
    return torch.cat([w.reshape(-1) for w in wants]).double()


def resolve_one(check: Check) -> Record:
    """One staged check's record, made alone."""
    b = Batch()
    b.add(check)
    return b.resolve()[0]


# ----------------------------------------------------------------------------- the checks

WORST_K = 3


def _scaled(x: torch.Tensor, o: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    finite = torch.isfinite(o) & torch.isfinite(x)
    e = (x - o).abs() / (tol.atol + tol.rtol * o.abs())
    return torch.where(finite, e, torch.zeros_like(e))


def special_mismatch(x: torch.Tensor, o: torch.Tensor, both: torch.Tensor | None = None) -> torch.Tensor:
    """Where the NaN/±Inf status of ``x`` and ``o`` (one shape) differs (``finite``'s failures). ``both``: where both are finite, when known
    (then: neither both finite, nor equal (one infinity twice), nor NaN twice; fewer ops, the same answer)."""
    if both is None:
        return (torch.isnan(x) != torch.isnan(o)) | (torch.isposinf(x) != torch.isposinf(o)) | \
            (torch.isneginf(x) != torch.isneginf(o))
    return ~(both | (x == o) | (torch.isnan(x) & torch.isnan(o)))


def _as_f64(check: str, got: torch.Tensor | None, oracle: torch.Tensor):
    """(None, got, oracle) in fp64 on ``got``'s device (fp64 arithmetic is IEEE there as on the CPU,
    so every measure is the same), or (the record that ends the check: output missing, wrong
    shape, empty; None, None)."""
    if got is None:
        return Record(check, False, detail="output missing (None)"), None, None
    if tuple(got.shape) != tuple(oracle.shape):
        return Record(check, False, detail=f"shape {tuple(got.shape)} != oracle {tuple(oracle.shape)}"), None, None
    if oracle.numel() == 0:
        return Record(check, True, detail="empty"), None, None
    x = at_home(got.detach()).double()
    return None, x, on_device_of(oracle.detach(), x).double()


def _oracle_terms(o: torch.Tensor, refs: tuple, tol: Tolerance, device: torch.device) -> tuple:
    """What a numeric check reads of the fp64 oracle ``o`` and the chains ``refs`` alone (the same for every
    run of a case): where ``o`` is finite, the allowance's denominator atol + rtol·|o|, max_rel's
    max(|o|, atol), the count of finite oracle elements, whether one has |o| >= 100 atol (0-d tensors, on
    ``device``), and per chain its fp64 copy (None) and its scaled error (NaN without a chain of o's shape)."""
    oa = o.abs()
    fo = _finite(oa)
    den = oa * tol.rtol + tol.atol  # = tol.atol + tol.rtol * |o| (one rounding each, as _scaled)
    rs, ref_errs = [], []
    for ref in refs:
        r, ref_err = None, torch.full((), float("nan"), dtype=torch.float64, device=device)
        if ref is not None:
            r = on_device_of(ref.detach(), o).double()
            if r.shape == o.shape:  # = _scaled(r, o, tol).max()
                ref_err = (r - o).abs_().div_(den).masked_fill_(~(fo & _finite(r.abs())), 0.0).max()
        rs.append(r)
        ref_errs.append(ref_err)
    return fo, den, oa.clamp_min(tol.atol), fo.sum(), (fo & (oa >= 100 * tol.atol)).any(), rs, ref_errs


def finite(check: str, got: torch.Tensor | None, oracle: torch.Tensor) -> Record:
    """NaN/±Inf placement: every element of ``got`` is NaN, +Inf, -Inf or finite exactly where
    the fp64 ``oracle`` is. Fails with the count (how many are non-finite where the oracle is
    finite, and the reverse) and the first ``WORST_K`` positions in row-major order."""
    return resolve_one(finite_check(check, got, oracle))


def finite_check(check: str, got: torch.Tensor | None, oracle: torch.Tensor) -> Check:
    """``finite`` staged (``Batch``): one count to the host; a failure's details after it."""
    done, x, o = _as_f64(check, got, oracle)
    if done is not None:
        return done
    bad = special_mismatch(x, o).flatten()
    n = int((yield bad.sum().reshape(1))[0])
    if not n:
        return Record(check, True, mismatch_frac=0.0)
    return _finite_failure(check, bad, x, o, n)


def _finite_failure(check: str, bad: torch.Tensor, x: torch.Tensor, o: torch.Tensor, n: int) -> Record:
    """``finite``'s record of ``n`` > 0 elements (``bad``, flat) whose NaN/±Inf placement is not the oracle's."""
    fo, fx = torch.isfinite(o).flatten(), torch.isfinite(x).flatten()
    first = torch.nonzero(bad).flatten()[:WORST_K]
    vals = torch.stack((x.flatten()[first], o.flatten()[first])).tolist()
    worst = "; ".join(f"{_idx(i, o.shape)}: {float(vx):.6g}/{float(vo):.6g}"
                      for i, vx, vo in zip(first.tolist(), *vals))
    counts = torch.stack(((bad & fo).sum(), (bad & ~fo & fx).sum(), (bad & ~fo & ~fx).sum())).tolist()
    return Record(check, False, mismatch_frac=n / o.numel(), nan_inf_mismatch=n, worst=worst + "  (got/oracle)",
                  detail=f"{n} of {o.numel()} elements: {counts[0]} non-finite where the oracle is "
                         f"finite, {counts[1]} finite where it is not, "
                         f"{counts[2]} the wrong non-finite value (NaN for ±Inf, or the sign)")


def numeric(check: str, got: torch.Tensor | None, oracle: torch.Tensor, ref: torch.Tensor | None, tol: Tolerance,
            *, is_reference: bool = False) -> Record:
    """Scaled error of ``got`` (and ``ref``) against the fp64 ``oracle`` on the elements where
    both are finite; see harness.tolerance. NaN/±Inf placement does not fail it (``finite``
    does): ``nan_inf_mismatch`` counts those elements for information. Computed on ``got``'s
    device; the host gets the scalars and the ``WORST_K`` worst elements."""
    return resolve_one(numeric_check(check, got, oracle, ref, tol, is_reference=is_reference))


def numeric_check(check: str, got: torch.Tensor | None, oracle: torch.Tensor, ref: torch.Tensor | None,
                  tol: Tolerance, *, is_reference: bool = False) -> Check:
    """``numeric`` staged (``Batch``): its two transfers are the two stages."""
    _, rec = yield from finite_numeric_check(None, check, got, oracle, (ref,), tol, is_reference=is_reference)
    return rec


def finite_numeric_check(finite_name: str | None, check: str, got: torch.Tensor | None, oracle: torch.Tensor,
                         refs: tuple, tol: Tolerance, *, is_reference: bool = False, memo: dict | None = None) -> Check:
    """``finite`` (named ``finite_name``; None: not made) and ``numeric`` of one output made together,
    against each reference chain of ``refs`` (an allowance's variants): returns (the finite record,
    the numeric record of the chain with the largest allowance, the first of them on a tie), the
    records ``finite_check`` and the largest-allowance ``numeric_check`` give, from one fp64 copy of
    ``got`` and ``oracle`` and one transfer per stage. ``Batch`` keeps the pair as the check's record.
    ``memo``: a dict keeping what the oracle and the chains alone decide (``_oracle_terms``) for the next
    check against the same ``oracle`` and ``refs`` objects (the other runs of a case)."""
    done, x, o = _as_f64(check, got, oracle)
    if done is not None:  # made without tensor work: the finite record's is the same but its name
        return (_as_f64(finite_name, got, oracle)[0] if finite_name is not None else None), done
    key = ("numeric", id(oracle), tuple(id(r) for r in refs), tol, x.device)
    terms = memo.get(key) if memo is not None else None
    if terms is None:
        terms = _oracle_terms(o, refs, tol, x.device)
        if memo is not None:
            memo[key] = (oracle, refs, terms)  # the objects held: their ids name no others while the memo lives
    else:
        terms = terms[2]
    fo, den, rel, n_fo, big, rs, ref_errs = terms
    both = fo & _finite(x.abs())  # the elements measured
    outside = ~both
    diff = (x - o).abs_().masked_fill_(outside, 0.0)  # |x - o| where both are finite, else 0
    e = (diff / den).masked_fill_(outside, 0.0)  # = _scaled(x, o, tol)
    special = special_mismatch(x, o, both)
    # one transfer for the scalars: finite oracle elements, whether one has |o| >= 100 atol, err,
    # max_abs, max_rel (NaN where the oracle holds a NaN, as diff / clamp_min(NaN) says), n_both,
    # the elements whose NaN/Inf placement differs from the oracle's, then each chain's ref_err
    # (stack promotes the counts and the flag to fp64, exactly)
    stats = yield torch.stack((n_fo, big, e.max(), diff.max(), (diff / rel).max(), both.sum(), special.sum(), *ref_errs))
    n_fo, big, err, max_abs, max_rel, n_both = stats[:6]
    n_both, n_special = int(n_both), int(stats[6])
    fin = None
    if finite_name is not None:  # = finite_check's record: its count is n_special
        fin = Record(finite_name, True, mismatch_frac=0.0) if not n_special else \
            _finite_failure(finite_name, special.flatten(), x, o, n_special)
    if n_fo and not big:
        return fin, Record(check, False, detail=f"degenerate case: oracle max |o| = {float(o.abs()[fo].max()):.3g} "
                                                f"is under 100×atol, writing zeros would pass")
    alloweds = [tol.allowed(v, is_reference=is_reference) for v in stats[7:]]
    c = alloweds.index(max(alloweds))  # the chain with the largest allowance (every allowed is a float)
    ref_err, allowed, r = stats[7 + c], alloweds[c], rs[c]
    # the second and last transfer: how many elements are over, and the WORST_K worst with their values.
    # Off the CPU the device's top-k is kept when it is the only answer (``_topk_device``); on a tie the
    # CPU's, on a copy (the CPU orders tied elements by its algorithm, which a GPU's need not share)
    k = min(WORST_K, n_both)
    with_ref = r is not None and r.shape == o.shape
    parts = [(e > allowed).sum().double().reshape(1)]
    flat = e.masked_fill_(outside, -1.0).flatten()
    if k:
        at, unique = _topk_device(flat, k)
        parts += [unique.double().reshape(1), at.double()] + [t.flatten()[at] for t in (x, o) + ((r,) if with_ref else ())]
    got = yield torch.cat(parts)
    n_over = int(got[0])
    worst = []
    if k:
        idx, vals = [int(v) for v in got[2:2 + k]], [got[2 + k * (j + 1): 2 + k * (j + 2)] for j in range(2 + with_ref)]
        if got[1] != 1.0 and x.device.type != "cpu":
            idx = torch.topk(flat.cpu(), k).indices.tolist()
            at = torch.tensor(idx, device=x.device)
            vals = torch.stack([t.flatten()[at] for t in (x, o) + ((r,) if with_ref else ())]).tolist()
        for j, i in enumerate(idx):
            rv = f"/{vals[2][j]:.6g}" if with_ref else ""
            worst.append(f"{_idx(i, o.shape)}: {vals[0][j]:.6g}/{vals[1][j]:.6g}{rv}")
    return fin, Record(
        check, passed=err <= allowed,
        max_abs=max_abs, max_rel=max_rel, err=err, ref_err=ref_err, allowed=allowed,
        mismatch_frac=float(n_over) / max(1, n_both), nan_inf_mismatch=n_special,
        worst="; ".join(worst) + "  (got/oracle/ref)" if worst else "",
        detail=f"{n_special} elements with NaN/Inf placement unlike the oracle's are left out (see finite:)"
        if n_special else "",
    )


def exact(check: str, got: torch.Tensor | None, want: torch.Tensor) -> Record:
    """Byte-identical contract (fp8 bytes, cache rows, indices). Compared on ``got``'s device; the
    host gets the count and the first ``WORST_K`` differing elements: their bytes for a float dtype,
    their values for an integer or bool one (``(0, 2): 17 != 42``)."""
    return resolve_one(exact_check(check, got, want))


def exact_check(check: str, got: torch.Tensor | None, want: torch.Tensor) -> Check:
    """``exact`` staged (``Batch``): one count to the host; a failure's bytes after it."""
    if got is None:
        return Record(check, False, detail="output missing (None)")
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return Record(check, False, detail=f"{tuple(got.shape)} {got.dtype} != expected {tuple(want.shape)} {want.dtype}")
    g, w = at_home(got), on_device_of(want, at_home(got))
    gb, wb = as_bytes(g), as_bytes(w)
    bad = (gb != wb)
    n = int((yield bad.sum().reshape(1))[0])
    worst, detail = "", ""
    if n:
        elem_bad = bad.reshape(*got.shape, -1).any(-1) if got.dim() else bad.any().reshape(())
        idxs = torch.nonzero(elem_bad)[:WORST_K].tolist()
        if _integral(got.dtype):  # indices, token ids, lengths: their values, not their bytes
            worst = "; ".join(f"{tuple(i)}: {g[tuple(i)].item()} != {w[tuple(i)].item()}" for i in idxs) + "  (got/want)"
            detail = f"{int(elem_bad.sum())} of {got.numel()} elements differ"
        else:  # fp8 / float bytes: the bytes are the contract
            worst = "; ".join(f"{tuple(i)}: {gb[tuple(i)].tolist()} != {wb[tuple(i)].tolist()}" for i in idxs)
            detail = f"{n} bytes differ"
    return Record(check, n == 0, mismatch_frac=n / max(1, gb.numel()), worst=worst, detail=detail)


def _integral(dtype: torch.dtype) -> bool:
    """An integer or bool dtype: ``exact`` prints its differing elements as values."""
    return not (dtype.is_floating_point or dtype.is_complex)


def untouched(check: str, after: torch.Tensor, before: torch.Tensor, written_rows: torch.Tensor, *,
              written_bytes: torch.Tensor | None = None) -> Record:
    """Every row of ``after`` not listed in ``written_rows`` is byte-identical to ``before``.
    ``written_bytes`` ((len(written_rows), n) bool, rows listed once): of each listed row only the
    marked bytes among its first n may change, its other bytes must be ``before``'s too.
    Compared on ``after``'s device."""
    return resolve_one(untouched_check(check, after, before, written_rows, written_bytes=written_bytes))


def untouched_check(check: str, after: torch.Tensor, before: torch.Tensor, written_rows: torch.Tensor, *,
                    written_bytes: torch.Tensor | None = None) -> Check:
    """``untouched`` staged (``Batch``): the row mask is built on the device, the counts go to the
    host in one transfer; a failure's rows after it."""
    ab_all = as_bytes(at_home(after))
    bb_all = as_bytes(on_device_of(before, ab_all))
    keep = torch.ones(after.shape[0], dtype=torch.bool, device=ab_all.device)
    if written_rows.numel():
        keep[on_device_of(written_rows, keep).long()] = False
    bad = (ab_all != bb_all).flatten(1).any(-1) & keep  # rows outside the write set that changed
    parts = [keep.sum(), bad.sum()]
    wr = pbad = None
    if written_bytes is not None and written_rows.numel():
        wr = on_device_of(written_rows.long(), ab_all)
        wa, wb = ab_all[wr].flatten(1), bb_all[wr].flatten(1)
        may = torch.zeros_like(wa, dtype=torch.bool)
        may[:, : written_bytes.shape[1]] = on_device_of(written_bytes, wa)
        pbad = ((wa != wb) & ~may).any(-1)
        parts.append(pbad.sum())
    counts = yield torch.stack(parts)
    n_keep, n = int(counts[0]), int(counts[1])
    rows = torch.nonzero(bad).flatten()[:WORST_K].tolist() if n else []
    partial: list[int] = wr[pbad].tolist() if pbad is not None and counts[2] else []
    worst = "; ".join(([f"rows {rows} changed"] if n else [])
                      + ([f"rows {partial[:WORST_K]} changed outside their written bytes"] if partial else []))
    detail = "; ".join(([f"{n} rows outside the write set changed"] if n else [])
                       + ([f"{len(partial)} written rows changed bytes they do not own"] if partial else []))
    return Record(check, not n and not partial, mismatch_frac=(n + len(partial)) / max(1, after.shape[0]) if
                  partial else n / max(1, n_keep), worst=worst, detail=detail)


def unchanged(check: str, after: torch.Tensor, before: torch.Tensor, *, hint: str = "") -> Record:
    """Every byte of ``after`` equals ``before`` (an input a call may not write, against its
    pristine copy). Compared on the tensors' device; only a failure is described on the host."""
    return resolve_one(unchanged_check(check, after, before, hint=hint))


def unchanged_check(check: str, after: torch.Tensor, before: torch.Tensor, *, hint: str = "") -> Check:
    """``unchanged`` staged (``Batch``): one flag to the host; a failure's bytes after it."""
    if tuple(after.shape) == tuple(before.shape) and after.dtype == before.dtype:
        changed = differ(after, before) if after.numel() else torch.zeros((), dtype=torch.bool, device=after.device)
        if not (yield changed.reshape(1))[0]:
            return Record(check, True)
    r = yield from exact_check(check, after, before)
    return Record(check, False, mismatch_frac=r.mismatch_frac, worst=r.worst,
                  detail=f"{r.detail or 'changed'} from the caller's: written in place{hint}")


def bitwise_equal(check: str, a: dict, b: dict) -> Record:
    """Two runs of the same implementation on the same inputs: every tensor byte-identical (the
    first that differs, in name order, is described; all are compared in one batch)."""
    names = sorted(set(a) | set(b))
    pairs = [(a.get(n), b.get(n)) for n in names]
    if all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) for x, y in pairs) and same(pairs):
        return Record(check, True)  # the usual answer, from one flag; else each tensor compared as below
    batch = Batch()
    at = {n: batch.add(exact_check(check, a[n], b[n])) for n in names if a.get(n) is not None and b.get(n) is not None}
    recs = batch.resolve()
    for name in names:
        if (a.get(name) is None) != (b.get(name) is None):
            return Record(check, False, detail=f"{name}: present in one run only")
        r = recs[at[name]] if name in at else None
        if r is not None and not r.passed:
            return Record(check, False, mismatch_frac=r.mismatch_frac, worst=f"{name}: {r.worst}", detail=f"{name} differs between runs: {r.detail}")
    return Record(check, True)
