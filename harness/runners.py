"""Runners: the checks made on one (implementation, case) pair.

  finite         every numeric output (and numeric effect rows) has the oracle's NaN/±Inf
                 placement — before its numeric check, which measures the finite elements only
  numeric/exact  every output of the contract against the fp64 oracle (or reference bytes)
  effect         rows an op must write (ring, KV pool) hold the right values
  untouched      every other row of every writable buffer kept its bytes (canary contents);
                 ``untouched:<input>``: every other input tensor kept all its bytes (save the
                 op's caller-provided outputs and what the implementation declares in ``may_write``)
  determinism    a second run on fresh identical inputs is bitwise identical
  poisoned-alloc that second run with every fresh allocation during the call pre-filled with NaN
                 (``harness.poison``): scratch read before it is written shows as a NaN. One
                 rerun serves both (the first run got whatever the allocator held, so an output
                 that depends on it is a bug either way); without determinism it is a run of its own
  poisoned       caller-provided outputs pre-filled with NaN and writable buffers poisoned
                 with 0xFF bytes: every element must still be written, nothing else touched

A rerun or poisoned run whose outputs hold the first run's bytes gets the first run's output
records under its suffix (``_FirstRun``: the records are functions of those bytes); its effect
records likewise when the inputs the effects read, the buffers and their before-copies match.
Any byte that differs is compared in full; determinism, ``untouched:<input>`` and the aliasing
check always run.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from harness import compare, poison, stages, tolerance
from harness.devices import Device, synchronize
from harness.registry import Impl, OpSpec, can_handle_takes_inputs


@dataclass(frozen=True)
class CaseResult:
    records: tuple[compare.Record, ...]
    seconds: float  # wall time of the implementation's first call
    refused: str = ""  # can_handle's reason, when it refused
    stages: tuple[tuple[str, float], ...] = ()  # (stage, seconds) of this run (harness.stages)


@dataclass(frozen=True)
class Allowance:
    """Outputs of the reference chain with a precision class's roundings emulated, once per
    ``OpSpec.rounding_variants`` entry, and the label its records carry (``detail``: which chain the
    allowance came from). A numeric check takes the variant with the largest allowance."""
    outs: tuple[dict, ...]
    label: str


def _buffers(spec: OpSpec, inputs: dict) -> tuple[str, ...]:
    """The op's writable buffers this case passes (a case may leave one None: a non-unified
    qk_norm_rope layer has no ring)."""
    return tuple(b for b in spec.writable if isinstance(inputs.get(b), torch.Tensor))


def _cpu(inputs: dict) -> dict:
    return {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _call(impl_fn, inputs: dict, dev: Device) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = impl_fn(**inputs)
    synchronize(dev)
    return dict(out), time.perf_counter() - t0


class _HostView(Mapping):
    """``inputs`` with each tensor copied to the host when it is read (``OpSpec.effects`` reads a few)."""

    def __init__(self, inputs: dict):
        self._inputs, self._host = inputs, {}

    def __getitem__(self, name):
        if name not in self._host:
            v = self._inputs[name]
            self._host[name] = v.detach().cpu() if isinstance(v, torch.Tensor) else v
        return self._host[name]

    def __iter__(self):
        return iter(self._inputs)

    def __len__(self):
        return len(self._inputs)


def _rows(buf: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``buf[rows]`` on ``buf``'s device, the bounds checked on the host first (as ``buf.cpu()[rows]``
    would: an IndexError, never a device-side assert). Shape: rows (n,) long, on the host."""
    if rows.numel() and not (-buf.shape[0] <= int(rows.min()) and int(rows.max()) < buf.shape[0]):
        raise IndexError(f"effect rows {rows.tolist()} out of bounds for a buffer of {buf.shape[0]} rows")
    return buf[rows.to(buf.device)]


def _output_records(spec: OpSpec, impl: Impl, case, out: dict, oracle, ref_out: dict, suffix: str = "",
                    allowance: Allowance | None = None, inputs: dict | None = None,
                    before: dict | None = None) -> list[compare.Record]:
    """The records of ``spec.outputs``: a function of ``out``'s outputs (None, or shape, dtype and bytes)
    and, for an output with ``OutputSpec.observed``, of the writable buffers in ``inputs`` and ``before``."""
    recs = []
    is_ref = impl.kind == "reference"
    for o in spec.outputs:
        if not o.when(case):
            continue
        got = out.get(o.name)
        if o.contract == "exact":
            if o.observed is not None:
                got = o.observed(got, inputs, before)
            rec = compare.exact(f"exact:{o.name}{suffix}", got, ref_out[o.name])
            if o.observed is not None and not rec.passed and o.observed.__doc__:
                rec = dataclasses.replace(rec, detail=f"{rec.detail} ({o.observed.__doc__.strip().splitlines()[0]})")
            recs.append(rec)
        else:
            tol = spec.tolerance(o.name, got.dtype if got is not None else ref_out[o.name].dtype)
            recs.append(compare.finite(f"finite:{o.name}{suffix}", got, oracle[o.name]))
            chains = (ref_out,) if allowance is None else allowance.outs
            rec = max((compare.numeric(f"numeric:{o.name}{suffix}", got, oracle[o.name], chain.get(o.name), tol,
                                       is_reference=is_ref) for chain in chains),
                      key=lambda r: r.allowed if r.allowed == r.allowed else float("-inf"))
            if allowance is not None:
                rec = dataclasses.replace(rec, detail="; ".join(x for x in (rec.detail, allowance.label) if x))
            recs.append(rec)
    return recs


def _effect_records(spec: OpSpec, impl: Impl, case, oracle, inputs: dict, ref_inputs: dict, before: dict,
                    suffix: str = "", seen: dict | None = None) -> list[compare.Record]:
    """The records of ``spec.effects``: a function of the inputs ``spec.effects`` reads (host
    copies of them land in ``seen``), the effect buffers and ``before``'s. Compared on the buffers' device."""
    recs = []
    is_ref = impl.kind == "reference"
    view = _HostView(inputs)
    if seen is not None:
        view._host = seen
    for eff in spec.effects(case, view, oracle):
        buf, rbuf = inputs[eff.buffer].detach(), ref_inputs[eff.buffer].cpu()
        rows = eff.rows.cpu().long()
        if rows.numel():
            got, want = _rows(buf, rows), rbuf[rows]
            if eff.view is not None:
                got, want = eff.view(got), eff.view(want)
            if eff.contract == "exact":
                recs.append(compare.exact(f"effect:{eff.buffer}{suffix}", got, want))
            else:
                tol = spec.tolerance(eff.buffer, buf.dtype)
                recs.append(compare.finite(f"finite:{eff.buffer}{suffix}", got, eff.oracle_rows))
                recs.append(compare.numeric(f"effect:{eff.buffer}{suffix}", got, eff.oracle_rows, want, tol,
                                            is_reference=is_ref))
        recs.append(compare.untouched(f"untouched:{eff.buffer}{suffix}", buf, before[eff.buffer], rows,
                                      written_bytes=eff.written_bytes))
    return recs


def _check_outputs(spec: OpSpec, impl: Impl, case, out: dict, oracle, ref_out: dict, inputs: dict,
                   ref_inputs: dict, before: dict, suffix: str = "", allowance: Allowance | None = None
                   ) -> list[compare.Record]:
    """``allowance``: the chain the numeric outputs' allowance comes from (None: ``ref_out``, the exact chain)."""
    return (_output_records(spec, impl, case, out, oracle, ref_out, suffix, allowance, inputs, before)
            + _effect_records(spec, impl, case, oracle, inputs, ref_inputs, before, suffix))


def _same(pairs) -> bool:
    """Every (a, b) pair holds the same thing: both None, equal non-tensors, or tensors of one
    shape, dtype and device with the same bytes (compared on the device: one transfer per device)."""
    differ: dict[torch.device, list] = {}
    for a, b in pairs:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
                return False
            if a.numel():
                differ.setdefault(a.device, []).append((compare._bytes(a) != compare._bytes(b)).any())
        elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return False
        else:
            try:
                if type(a) is not type(b) or not bool(a == b):
                    return False
            except Exception:  # an == that does not answer a bool: not known equal
                return False
    return not any(bool(torch.stack(flags).any()) for flags in differ.values())


class _FirstRun:
    """The first run's records and the bytes they were computed from: a later run holding the same
    bytes gets those records under its suffix instead of comparing again (every field equal: the
    records are functions of those bytes alone, an ``OutputSpec.observed`` output's of the writable
    buffers' before and after too; ``_output_records``, ``_effect_records``). The
    bytes are copies taken when the records were made: a later call may write a buffer the first
    one returned or was given (a persistent output, a captured pointer)."""

    def __init__(self, spec: OpSpec, impl: Impl, case, out: dict, oracle, ref_out: dict, inputs: dict,
                 ref_inputs: dict, before: dict, allowance: Allowance | None):
        self.out_recs = _output_records(spec, impl, case, out, oracle, ref_out, allowance=allowance, inputs=inputs,
                                        before=before)
        self.seen: dict = {}  # host copies of the inputs spec.effects read
        self.eff_recs = _effect_records(spec, impl, case, oracle, inputs, ref_inputs, before, seen=self.seen)
        self.seen = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.seen.items()}  # CPU: not copies
        self.keys = set(inputs)
        self.out = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        self.written = {b: inputs[b].detach().clone() for b in _buffers(spec, inputs)}
        self.before = before

    @staticmethod
    def _renamed(recs: list, suffix: str) -> list[compare.Record]:
        return [dataclasses.replace(r, check=r.check + suffix, extra=dict(r.extra)) for r in recs]

    def check(self, spec: OpSpec, impl: Impl, case, out: dict, oracle, ref_out: dict, inputs: dict,
              ref_inputs: dict, before: dict, suffix: str, allowance: Allowance | None) -> list[compare.Record]:
        """``_check_outputs`` of a later run, the first run's records where its bytes are the same."""
        outputs = [o for o in spec.outputs if o.when(case)]
        outs = [(self.out.get(o.name), out.get(o.name)) for o in outputs]
        keys_same = set(inputs) == self.keys and set(before) == set(self.before)
        buffers = [] if not keys_same else ([(v, inputs[b]) for b, v in self.written.items()]
                                            + [(v, before[b]) for b, v in self.before.items()])
        if any(o.observed is not None for o in outputs):  # those records read the buffers too
            buffers_seen_same = outs_same = keys_same and _same(outs + buffers)
        else:
            buffers_seen_same, outs_same = False, _same(outs)
        if outs_same:
            recs = self._renamed(self.out_recs, suffix)
        else:
            recs = _output_records(spec, impl, case, out, oracle, ref_out, suffix, allowance, inputs, before)
        host = lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v  # noqa: E731
        if keys_same and _same([(v, host(inputs[k])) for k, v in self.seen.items()]
                               + ([] if buffers_seen_same else buffers)):
            return recs + self._renamed(self.eff_recs, suffix)
        return recs + _effect_records(spec, impl, case, oracle, inputs, ref_inputs, before, suffix)


def _untouched_inputs(spec: OpSpec, impl: Impl, inputs: dict, pristine: dict, suffix: str = "") -> list[compare.Record]:
    """``untouched:<input>`` for every input tensor the call may not write: not the op's writable
    buffers or caller-provided outputs, not ``impl.may_write``, and not a view sharing storage with
    one of those (MLA's v is a view of k: a declared write to k shows through v). Each named input
    is compared whole with its pristine copy (the run's inputs are copies of it), on the device."""
    allowed = set(spec.writable) | set(spec.out_args) | set(impl.may_write)
    storages = {t.untyped_storage().data_ptr() for n in allowed if isinstance(t := inputs.get(n), torch.Tensor)} - {0}
    recs = []
    for name, t in inputs.items():
        if name in allowed or not isinstance(t, torch.Tensor) or t.untyped_storage().data_ptr() in storages:
            continue
        recs.append(compare.unchanged(f"untouched:{name}{suffix}", t, pristine[name],
                                      hint=f" (not writable in {spec.name}; a kernel that writes it on purpose "
                                           f"declares Impl(may_write=({name!r},)))"))
    return recs


def _crash(check: str, exc: BaseException) -> compare.Record:
    return compare.Record(check, False, detail=traceback.format_exception_only(type(exc), exc)[-1].strip())


def _poison(spec: OpSpec, inputs: dict) -> None:
    for name in spec.out_args:
        ref = inputs.get(name)
        if ref is None:  # make the caller-provided path happen in this run
            continue
        ref.view(torch.uint8).fill_(0xFF)
    for name in _buffers(spec, inputs):
        inputs[name].view(torch.uint8).fill_(0xFF)  # NaN bit patterns for every float format


def provide_outputs(spec: OpSpec, inputs: dict, ref_out: dict, dev: Device) -> dict:
    """Allocate, on the device, every caller-provided output argument the case left to the implementation."""
    for name in spec.out_args:
        if inputs.get(name) is None:
            inputs[name] = torch.empty_like(ref_out[name], device=dev.torch_device)
    return inputs


class CaseSetup:
    """What every implementation's run of one case shares: the inputs built once (each run gets
    ``fresh()`` copies, never these: ``copy.deepcopy`` keeps strides, offsets and shared storages,
    as ``gpu_runners.Inputs`` relies on too), the reference's outputs and writes, and the oracle. Building
    inputs (seeded CPU random draws, then the copy to the device) and the fp64 oracle cost more
    than the kernels on a GPU: measured on the H200, 4 builds per run were 46 % of parity time."""

    def __init__(self, spec: OpSpec, case, dev: Device):
        self.spec, self.dev = spec, dev
        with stages.timed("inputs"):
            self.pristine = spec.build_inputs(case, dev)
        with stages.timed("reference"):
            ref_inputs = copy.deepcopy(self.pristine)
            ref_out, _ = _call(spec.reference, ref_inputs, dev)
            self.ref_out = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in ref_out.items()}
            self.ref_after = _cpu(ref_inputs)  # the reference's writes, for the effect checks
        with stages.timed("oracle"):
            self.oracle = spec.oracle(**_cpu(self.pristine))
        self._emulated: dict[str, Allowance] = {}

    def fresh(self) -> dict:
        return copy.deepcopy(self.pristine)

    def allowance(self, precision: str) -> Allowance | None:
        """The chain a ``precision`` implementation's numeric allowance comes from: None for the
        exact class (``ref_out``), else the reference run once per class, on fresh inputs, with
        exactly the class's roundings emulated (``OpSpec.roundings``; ``harness.tolerance``)."""
        key = tolerance.canonical_precision(precision)
        if key == tolerance.EXACT:
            return None
        if key not in self._emulated:
            flags: dict = {}
            for name in key.split("+"):
                if name not in self.spec.roundings:  # Registry.add refuses these; an Impl run unregistered may not
                    raise ValueError(f"precision {precision!r}: op {self.spec.name!r} does not emulate {name!r}")
                flags.update(self.spec.roundings[name])
            outs = []
            with stages.timed("allowance"):
                for variant in self.spec.rounding_variants:
                    out, _ = _call(functools.partial(self.spec.reference, **flags), {**self.fresh(), **variant},
                                   self.dev)
                    outs.append({k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()})
            self._emulated[key] = Allowance(tuple(outs), f"allowance: chain with {key}")
        return self._emulated[key]


# Kinds the poisoned-allocator run skips. ``compiled`` (torch.compile of the reference chain):
# dynamo traces the mode into the graph and guards on it, so every run under a fresh mode
# recompiles (measured with torch 2.13: 8 compiles in 9 calls of a small function) until the
# recompile limit makes the frame run eagerly for every later call, normal runs included — the
# parity run would silently stop testing compiled code.
POISONED_ALLOC_SKIPS = ("compiled",)


def run_case(spec: OpSpec, impl: Impl, case, dev: Device, *, determinism: bool = True,
             poisoned: bool = True, poisoned_alloc: bool = True, setup=None) -> CaseResult:
    """``_run_case`` with the wall time of its stages (``harness.stages``) in ``CaseResult.stages``."""
    with stages.collect() as times:
        res = _run_case(spec, impl, case, dev, determinism=determinism, poisoned=poisoned,
                        poisoned_alloc=poisoned_alloc, setup=setup)
    return dataclasses.replace(res, stages=tuple(times.items()))


def _run_case(spec: OpSpec, impl: Impl, case, dev: Device, *, determinism: bool, poisoned: bool,
              poisoned_alloc: bool, setup) -> CaseResult:
    """The checks of one implementation on one case: the first run's, then (each optional) the
    rerun for ``determinism`` and ``poisoned_alloc`` (``@poisoned-alloc``; not for the kinds in
    ``POISONED_ALLOC_SKIPS``) and the poisoned-output run (``@poisoned``). ``setup``: a callable
    returning the case's ``CaseSetup`` (shared by the implementations of one case, ``run_impls``);
    None builds one. A ``can_handle(case, device, inputs)`` gets a fresh copy of the inputs (the
    setup is built first); one that raises is a failed ``can_handle`` check of the implementation."""
    held: list[CaseSetup] = []

    def case_setup() -> CaseSetup:
        if not held:
            held.append(setup() if setup is not None else CaseSetup(spec, case, dev))
        return held[0]

    try:
        wants_inputs = can_handle_takes_inputs(impl.can_handle)
        check_inputs = case_setup().fresh() if wants_inputs else None
    except Exception as exc:  # building the case failed: as a crash of the run below would say
        return CaseResult((_crash("run", exc),), float("nan"))
    try:
        verdict = impl.can_handle(case, dev, check_inputs) if wants_inputs else impl.can_handle(case, dev)
    except Exception as exc:
        return CaseResult((_crash("can_handle", exc),), float("nan"))
    if verdict is not True:
        return CaseResult((), 0.0, refused=str(verdict) or "refused")
    recs: list[compare.Record] = []
    try:
        st = case_setup()
        ref_out, oracle = st.ref_out, st.oracle
        allow = st.allowance(impl.precision)
        with stages.timed("copy"):
            inputs = st.fresh()
            before = {b: inputs[b].detach().clone() for b in _buffers(spec, inputs)}
        with stages.timed("impl"):
            out, seconds = _call(impl.fn, inputs, dev)
        with stages.timed("compare"):
            first = _FirstRun(spec, impl, case, out, oracle, ref_out, inputs, st.ref_after, before, allow)
            recs += first.out_recs + first.eff_recs
            recs += _untouched_inputs(spec, impl, inputs, st.pristine)
        alloc = poisoned_alloc and impl.kind not in POISONED_ALLOC_SKIPS
        if determinism or alloc:  # one rerun serves both: a clean run cannot depend on the poison
            with stages.timed("copy"):
                again = st.fresh()
                again_before = {b: again[b].detach().clone() for b in _buffers(spec, again)}
            poisoning = poison.allocations(device=dev.torch_device) if alloc else contextlib.nullcontext()
            with stages.timed("rerun"), poisoning:
                out2, _ = _call(impl.fn, again, dev)
            with stages.timed("compare:rerun"):
                if determinism:
                    recs.append(compare.bitwise_equal(
                        "determinism", {**out, **{b: inputs[b] for b in _buffers(spec, inputs)}},
                        {**out2, **{b: again[b] for b in _buffers(spec, again)}}))
                if alloc:
                    recs += first.check(spec, impl, case, out2, oracle, ref_out, again, st.ref_after,
                                        again_before, suffix="@poisoned-alloc", allowance=allow)
                    recs += _untouched_inputs(spec, impl, again, st.pristine, suffix="@poisoned-alloc")
        if poisoned:
            with stages.timed("copy"):
                p = provide_outputs(spec, st.fresh(), ref_out, dev)
                _poison(spec, p)
                p_before = {b: p[b].detach().clone() for b in _buffers(spec, p)}
            with stages.timed("poisoned"):
                p_out, _ = _call(impl.fn, p, dev)
            with stages.timed("compare:poisoned"):
                for name in spec.out_args:
                    if p_out.get(name) is not None and p_out[name].data_ptr() != p[name].data_ptr():
                        recs.append(compare.Record(f"poisoned:{name}-aliased", False,
                                                   detail=f"caller-provided {name} was not written in place"))
                recs += first.check(spec, impl, case, p_out, oracle, ref_out, p, st.ref_after, p_before,
                                    suffix="@poisoned", allowance=allow)
                recs += _untouched_inputs(spec, impl, p, st.pristine, suffix="@poisoned")
    except Exception as exc:  # an implementation crash is a failure of that implementation, with its trace
        recs.append(_crash("run", exc))
        seconds = float("nan")
    return CaseResult(tuple(recs), seconds)


def run_impls(spec: OpSpec, impls: list[Impl], case, dev: Device, *, emit=None, **kw) -> list[CaseResult]:
    """``run_case`` for each implementation on one case, building the case's setup once (lazily:
    not at all when every implementation refuses; again for the next one if building it failed).
    ``emit`` (``harness.pool.emit``) hears ``("start", j)`` before implementation ``j`` runs and
    ``("done", j, result)`` after: a case stopped by its time limit keeps the results before."""
    held: list[CaseSetup] = []

    def setup() -> CaseSetup:
        if not held:
            held.append(CaseSetup(spec, case, dev))
        return held[0]

    out = []
    for j, impl in enumerate(impls):
        if emit is not None:
            emit(("start", j))
        out.append(run_case(spec, impl, case, dev, setup=setup, **kw))
        if emit is not None:
            emit(("done", j, out[-1]))
    return out
