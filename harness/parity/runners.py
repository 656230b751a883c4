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
  distribution   a sampling op's distributional case (``OpSpec.distribution``): many trials of
                 the implementation's own randomness against the exact target distribution
                 (``harness.parity.distribution``), one verdict, never a rerun

A rerun or poisoned run whose outputs hold the first run's bytes reuses the first run's records
(``harness.parity.records``, where the records are made). Determinism, ``untouched:<input>`` and the
aliasing check always run.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import time
import traceback
from dataclasses import dataclass

import torch

from harness import compare, poison, tolerance
from harness.parity import distribution, stages
from harness.devices import Device, synchronize
from harness.registry import Impl, OpSpec, can_handle_takes_inputs, nan_policy_of
from harness.parity.records import Allowance, CaseContext, FirstRun, untouched_inputs, writable_buffers


@dataclass(frozen=True)
class CaseResult:
    records: tuple[compare.Record, ...]
    seconds: float  # wall time of the implementation's first call
    refused: str = ""  # can_handle's reason, when it refused
    stages: tuple[tuple[str, float], ...] = ()  # (stage, seconds) of this run (harness.parity.stages)


_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def _plain(v) -> bool:
    """A value ``copy_inputs`` copies as ``copy.deepcopy`` would without its machinery: a plain strided
    leaf tensor (no subclass, grad, conj/neg bit or quantizer), or an immutable scalar (deepcopy keeps it)."""
    if isinstance(v, torch.Tensor):
        return (type(v) is torch.Tensor and v.layout == torch.strided and v.is_leaf and v.grad is None
                and not v.is_quantized and not v.is_conj() and not v.is_neg())
    return isinstance(v, _IMMUTABLE)


def copy_inputs(inputs: dict) -> dict:
    """``copy.deepcopy(inputs)``: every storage copied once (tensors sharing one share its copy), each
    tensor rebuilt on it with its offset, shape and strides, the whole storage's bytes kept (what a
    kernel reading past a view would see). Without deepcopy's per-tensor machinery: one device copy
    per storage and no other kernel (a deepcopy cost ~50 torch calls per qk_norm_rope case's inputs).
    A value other than a plain tensor or an immutable scalar (``_plain``) falls back to deepcopy."""
    if not all(_plain(v) for v in inputs.values()):
        return copy.deepcopy(inputs)
    storages = {k: v.untyped_storage() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    # (device, storage address): storages with bytes never share one; an empty storage is its own
    keys = {k: (inputs[k].device, st.data_ptr()) if st.nbytes() else k for k, st in storages.items()}
    users = collections.Counter(keys.values())
    copies: dict = {}  # key -> the storage's copy
    out = {}
    for k, v in inputs.items():
        if not isinstance(v, torch.Tensor):
            out[k] = v
            continue
        st, key = storages[k], keys[k]
        if users[key] == 1 and v.storage_offset() == 0 and v.is_contiguous() and \
                st.nbytes() == v.numel() * v.element_size():  # the whole storage, alone: one clone
            t = v.detach().clone()
        else:
            if key not in copies:
                copies[key] = st.clone()
            t = torch.empty(0, dtype=v.dtype, device=v.device).set_(copies[key], v.storage_offset(), v.shape,
                                                                     v.stride())
        out[k] = t.requires_grad_() if v.requires_grad else t
    return out


def _cpu(inputs: dict) -> dict:
    return {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _call(impl_fn, inputs: dict, dev: Device) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = impl_fn(**inputs)
    synchronize(dev)
    return dict(out), time.perf_counter() - t0



def _crash(check: str, exc: BaseException) -> compare.Record:
    return compare.Record(check, False, detail=traceback.format_exception_only(type(exc), exc)[-1].strip())


def _poison(spec: OpSpec, inputs: dict) -> None:
    for name in spec.out_args:
        ref = inputs.get(name)
        if ref is None:  # make the caller-provided path happen in this run
            continue
        ref.view(torch.uint8).fill_(0xFF)
    for name in writable_buffers(spec, inputs):
        inputs[name].view(torch.uint8).fill_(0xFF)  # NaN bit patterns for every float format


def provide_outputs(spec: OpSpec, inputs: dict, ref_out: dict, dev: Device) -> dict:
    """Allocate, on the device, every caller-provided output argument the case left to the implementation."""
    for name in spec.out_args:
        if inputs.get(name) is None:
            inputs[name] = torch.empty_like(ref_out[name], device=dev.torch_device)
    return inputs


class CaseSetup:
    """What every implementation's run of one case shares: the inputs built once (each run gets
    ``fresh()`` copies, never these: ``copy_inputs`` keeps strides, offsets and shared storages, as
    ``copy.deepcopy`` in ``gpu_runners.Inputs`` does), the reference's outputs and writes, and the oracle. Building
    inputs (seeded CPU random draws, then the copy to the device) and the fp64 oracle cost more
    than the kernels on a GPU: measured on the H200, 4 builds per run were 46 % of parity time.
    ``context(impl)``: what the records of one implementation's run read (``records.CaseContext``)."""

    def __init__(self, spec: OpSpec, case, dev: Device):
        self.spec, self.case, self.dev = spec, case, dev
        with stages.timed("inputs"):
            self.pristine = spec.build_inputs(case, dev)
        with stages.timed("reference"):
            ref_inputs = copy_inputs(self.pristine)
            ref_out, _ = _call(spec.reference, ref_inputs, dev)
            self.ref_out = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in ref_out.items()}
            self.ref_after = _cpu(ref_inputs)  # the reference's writes, for the effect checks
        with stages.timed("oracle"):
            self.oracle = spec.oracle(**_cpu(self.pristine))
        self.memo: dict = {}  # kept by the records of the case's runs (``records.CaseContext.memo``)
        self._emulated: dict[tuple[str, str], Allowance] = {}
        self._policies: dict[str, tuple[dict, dict, dict]] = {next(iter(spec.nan_policies), ""): (
            self.ref_out, self.ref_after, self.oracle)}

    def fresh(self) -> dict:
        return copy_inputs(self.pristine)

    def context(self, impl: Impl) -> CaseContext:
        """The case as ``impl``'s records read it: the reference and oracle of its NaN policy
        (``policy``), its precision class's allowance made (``allowance``) if not yet."""
        ref_out, ref_after, oracle = self.policy(nan_policy_of(self.spec, impl))
        return CaseContext(self.spec, impl, self.case, self.dev, self.pristine, ref_out, ref_after,
                           oracle, self.allowance(impl.precision, nan_policy_of(self.spec, impl)), memo=self.memo)

    def policy(self, nan_policy: str) -> tuple[dict, dict, dict]:
        """(reference outputs, reference inputs after its call, oracle) honouring ``nan_policy`` (one of
        ``OpSpec.nan_policies``; the default's are the ones built first), each made once per case."""
        if nan_policy not in self._policies:
            kw = self.spec.nan_policies[nan_policy]
            with stages.timed("reference"):
                ref_inputs = self.fresh()
                out, _ = _call(functools.partial(self.spec.reference, **kw), ref_inputs, self.dev)
                out = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
            with stages.timed("oracle"):
                oracle = self.spec.oracle(**_cpu(self.pristine), **kw)
            self._policies[nan_policy] = (out, _cpu(ref_inputs), oracle)
        return self._policies[nan_policy]

    def allowance(self, precision: str, nan_policy: str = "") -> Allowance | None:
        """The chain a ``precision`` implementation's numeric allowance comes from: None for the
        exact class (``ref_out``), else the reference run once per class (and NaN policy), on fresh
        inputs, with exactly the class's roundings emulated (``OpSpec.roundings``; ``harness.tolerance``)."""
        key = tolerance.canonical_precision(precision)
        if key == tolerance.EXACT:
            return None
        if (key, nan_policy) not in self._emulated:
            flags: dict = dict(self.spec.nan_policies.get(nan_policy, {}))
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
                oracle, label = None, f"allowance: chain with {key}"
                moved = [n for n in key.split("+") if n in self.spec.rounding_oracle_inputs]
                if moved:  # the class changes what is computed on: its own oracle
                    inputs = self.fresh()
                    for name in moved:
                        inputs = self.spec.rounding_oracle_inputs[name](inputs)
                    oracle = self.spec.oracle(**_cpu(inputs), **self.spec.nan_policies.get(nan_policy, {}))
                    label += f"; oracle over the inputs as {'+'.join(moved)} stores them"
            self._emulated[key, nan_policy] = Allowance(tuple(outs), label, oracle)
        return self._emulated[key, nan_policy]


# Kinds the poisoned-allocator run skips. ``compiled`` (torch.compile of the reference chain):
# dynamo traces the mode into the graph and guards on it, so every run under a fresh mode
# recompiles (measured with torch 2.13: 8 compiles in 9 calls of a small function) until the
# recompile limit makes the frame run eagerly for every later call, normal runs included — the
# parity run would silently stop testing compiled code.
POISONED_ALLOC_SKIPS = ("compiled",)


def run_case(spec: OpSpec, impl: Impl, case, dev: Device, *, determinism: bool = True,
             poisoned: bool = True, poisoned_alloc: bool = True, setup=None) -> CaseResult:
    """``_run_case`` with the wall time of its stages (``harness.parity.stages``) in ``CaseResult.stages``."""
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
        st = case_setup() if wants_inputs else None
        with stages.timed("copy"):  # can_handle's own copy of the inputs
            check_inputs = st.fresh() if wants_inputs else None
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
        ctx = st.context(impl)
        with stages.timed("copy"):
            inputs = st.fresh()
            before = {b: st.pristine[b] for b in writable_buffers(spec, inputs)}  # a fresh copy's bytes
        with stages.timed("impl"):
            out, seconds = _call(impl.fn, inputs, dev)
        with stages.timed("compare"):
            first = FirstRun(ctx, out, inputs, before)
            recs += first.out_recs + first.eff_recs
            recs += untouched_inputs(ctx, inputs)
        alloc = poisoned_alloc and impl.kind not in POISONED_ALLOC_SKIPS
        if determinism or alloc:  # one rerun serves both: a clean run cannot depend on the poison
            with stages.timed("copy"):
                again = st.fresh()
                again_before = {b: st.pristine[b] for b in writable_buffers(spec, again)}
            poisoning = poison.allocations(device=dev.torch_device) if alloc else contextlib.nullcontext()
            with stages.timed("rerun"), poisoning:
                out2, _ = _call(impl.fn, again, dev)
            with stages.timed("compare:rerun"):
                if determinism:
                    recs.append(compare.bitwise_equal(
                        "determinism", {**out, **{b: inputs[b] for b in writable_buffers(spec, inputs)}},
                        {**out2, **{b: again[b] for b in writable_buffers(spec, again)}}))
                if alloc:
                    recs += first.check(out2, again, again_before, suffix="@poisoned-alloc")
                    recs += untouched_inputs(ctx, again, suffix="@poisoned-alloc")
        if poisoned:
            with stages.timed("copy"):
                p = provide_outputs(spec, st.fresh(), ctx.ref_out, dev)
                _poison(spec, p)
                p_before = {b: p[b].detach().clone() for b in writable_buffers(spec, p)}
            with stages.timed("poisoned"):
                p_out, _ = _call(impl.fn, p, dev)
            with stages.timed("compare:poisoned"):
                for name in spec.out_args:
                    if p_out.get(name) is not None and p_out[name].data_ptr() != p[name].data_ptr():
                        recs.append(compare.Record(f"poisoned:{name}-aliased", False,
                                                   detail=f"caller-provided {name} was not written in place"))
                recs += first.check(p_out, p, p_before, suffix="@poisoned")
                recs += untouched_inputs(ctx, p, suffix="@poisoned")
        with stages.timed("distribution"):
            recs += distribution.run(spec, impl, case, dev)
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
