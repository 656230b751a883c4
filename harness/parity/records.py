"""The records of one implementation's run on one case (``harness.parity.runners`` makes the runs):
``finite``/``numeric``/``exact`` of every output of the contract, ``effect``/``untouched`` of
every buffer the op writes (``OpSpec.effects``), ``untouched:<input>`` of every input it may not write.

A rerun or poisoned run whose outputs hold the first run's bytes gets the first run's output
records under its suffix (``FirstRun``: the records are functions of those bytes); its effect
records likewise when the inputs the effects read, the buffers and their before-copies match.
Any byte that differs is compared in full.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from harness import compare
from harness.devices import Device
from harness.registry import Impl, OpSpec


@dataclass(frozen=True)
class Allowance:
    """Outputs of the reference chain with a precision class's roundings emulated, once per
    ``OpSpec.rounding_variants`` entry, and the label its records carry (``detail``: which chain the
    allowance came from). A numeric check takes the variant with the largest allowance. ``oracle``: the
    class's own oracle (``OpSpec.rounding_oracle_inputs``), None for the op's."""
    outs: tuple[dict, ...]
    label: str
    oracle: dict | None = None


@dataclass(frozen=True)
class CaseContext:
    """What every record of one implementation's run on one case reads about the case (one per
    (implementation, case): ``harness.parity.runners.CaseSetup.context``). ``pristine``: the case's
    inputs as built (each run gets copies); ``ref_out`` and ``ref_inputs``: the reference's outputs
    and its inputs after its call (its writes, for the effect checks), on the host; ``oracle``: the
    fp64 oracle's outputs; ``allowance``: the chain the numeric outputs' allowance comes from (None:
    ``ref_out``, the exact chain; ``CaseSetup.allowance`` of the implementation's precision class)."""
    spec: OpSpec
    impl: Impl
    case: object
    device: Device
    pristine: dict
    ref_out: dict
    ref_inputs: dict
    oracle: dict
    allowance: Allowance | None = None
    # what the records of the case's runs keep between runs (``compare.same``'s byte vector of the pristine
    # inputs; device copies of the host tensors above, ``on_device``): shared by the case's implementations
    memo: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)


def writable_buffers(spec: OpSpec, inputs: dict) -> tuple[str, ...]:
    """The op's writable buffers this case passes (a case may leave one None: a non-unified
    qk_norm_rope layer has no ring)."""
    return tuple(b for b in spec.writable if isinstance(inputs.get(b), torch.Tensor))


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


def _rows(buf: torch.Tensor, rows: torch.Tensor, placed: torch.Tensor) -> torch.Tensor:
    """``buf[rows]`` on ``buf``'s device, the bounds checked on the host first (as ``buf.cpu()[rows]``
    would: an IndexError, never a device-side assert). Shape: rows (n,) long, on the host; ``placed``: rows
    where ``buf`` is (a copy made once, ``EffectPlan.on``)."""
    if rows.numel() and not (-buf.shape[0] <= int(rows.min()) and int(rows.max()) < buf.shape[0]):
        raise IndexError(f"effect rows {rows.tolist()} out of bounds for a buffer of {buf.shape[0]} rows")
    return buf[placed]


def _output_records(ctx: CaseContext, out: dict, inputs: dict, before: dict, suffix: str = "") -> list[compare.Record]:
    """The records of ``spec.outputs``: a function of ``out``'s outputs (None, or shape, dtype and bytes)
    and, for an output with ``OutputSpec.observed``, of the writable buffers in ``inputs`` and ``before``."""
    spec, case, oracle, ref_out, allowance = ctx.spec, ctx.case, ctx.oracle, ctx.ref_out, ctx.allowance
    if allowance is not None and allowance.oracle is not None:
        oracle = allowance.oracle
    batch = compare.Batch()  # every check of the outputs, made together (one transfer per stage)
    plan = []  # (output, index of its check: exact, or finite and numeric together)
    is_ref = ctx.impl.kind == "reference"
    for o in spec.outputs:
        if not o.when(case):
            continue
        got = out.get(o.name)
        if o.contract == "exact":
            if o.observed is not None:
                got = o.observed(got, inputs, before)
            plan.append((o, batch.add(compare.exact_check(f"exact:{o.name}{suffix}", got,
                                                          on_device(ctx.memo, ref_out[o.name], home(got))))))
        else:
            tol = spec.tolerance(o.name, got.dtype if got is not None else ref_out[o.name].dtype)
            chains = (ref_out,) if allowance is None else allowance.outs  # the numeric record: the largest allowance's
            plan.append((o, batch.add(compare.finite_numeric_check(
                f"finite:{o.name}{suffix}", f"numeric:{o.name}{suffix}", got, on_device(ctx.memo, oracle[o.name], home(got)),
                tuple(on_device(ctx.memo, chain.get(o.name), home(got)) for chain in chains), tol, is_reference=is_ref,
                memo=ctx.memo))))
    done = batch.resolve()
    recs = []
    for o, k in plan:
        if o.contract == "exact":
            rec = done[k]
            if o.observed is not None and not rec.passed and o.observed.__doc__:
                rec = dataclasses.replace(rec, detail=f"{rec.detail} ({o.observed.__doc__.strip().splitlines()[0]})")
            recs.append(rec)
            continue
        fin, rec = done[k]
        if allowance is not None:
            rec = dataclasses.replace(rec, detail="; ".join(x for x in (rec.detail, allowance.label) if x))
        recs += [fin, rec]
    return recs


def on_device(memo: dict, t, where: torch.device | None):
    """``t`` (a tensor of the case on the host: an oracle's or reference's output, an effect's rows) on
    device ``where``, copied there once into ``memo`` (``CaseContext.memo``: once per case), not once per
    check and run: each copy from the host is a wait for the GPU. The checks only read it. ``t`` itself
    when it is there, ``where`` is None or ``t`` is not a tensor."""
    if where is None or not isinstance(t, torch.Tensor) or t.device == where:
        return t
    key = ("on", id(t), where)
    if key not in memo:
        memo[key] = (t, t.detach().to(where))  # t held: its id names no other tensor while the memo lives
    return memo[key][1]


def home(got) -> torch.device | None:
    """Where the check of ``got`` computes (``compare.home``); None when ``got`` is not a tensor."""
    return compare.home(got) if isinstance(got, torch.Tensor) else None


class EffectPlan:
    """``spec.effects`` of one run's inputs (``effects``: each ``Effect`` with its rows on the host) and what
    the effect records read besides the run's buffers, each made once for every run whose effect inputs are
    the same (``FirstRun``): the reference's rows (``want``) and the device copies (``on``). ``seen``: host
    copies of the inputs ``spec.effects`` read."""

    def __init__(self, ctx: CaseContext, inputs: dict, seen: dict | None = None):
        view = _HostView(inputs)
        if seen is not None:
            view._host = seen
        # rows copied: on the CPU a host view is the input itself, which a later call could write
        self.effects = [(eff, eff.rows.cpu().long().clone()) for eff in ctx.spec.effects(ctx.case, view, ctx.oracle)]
        self.seen = view._host
        self._ctx, self.memo, self._want = ctx, {}, {}  # memo: device copies, a check's oracle terms

    def on(self, t, where: torch.device | None):
        """``on_device`` of ``t``, kept with the plan."""
        return on_device(self.memo, t, where)

    def want(self, i: int):
        """Effect ``i``'s rows of the reference's buffer (its ``view`` applied), on the host."""
        if i not in self._want:
            eff, rows = self.effects[i]
            want = self._ctx.ref_inputs[eff.buffer].cpu()[rows]
            self._want[i] = eff.view(want) if eff.view is not None else want
        return self._want[i]


def _effect_records(ctx: CaseContext, inputs: dict, before: dict, suffix: str = "",
                    plan: EffectPlan | None = None) -> list[compare.Record]:
    """The records of ``spec.effects``: a function of the inputs ``spec.effects`` reads (``plan``: their
    effects, made from ``inputs`` when None), the effect buffers and ``before``'s. Compared on the buffers' device."""
    spec = ctx.spec
    plan = EffectPlan(ctx, inputs) if plan is None else plan
    batch = compare.Batch()  # every check of the effects, made together; their records in this order
    is_ref = ctx.impl.kind == "reference"
    for i, (eff, rows) in enumerate(plan.effects):
        buf = inputs[eff.buffer].detach()
        if rows.numel():
            got = _rows(buf, rows, plan.on(rows, buf.device))
            if eff.view is not None:
                got = eff.view(got)
            want = plan.on(plan.want(i), home(got))
            if eff.contract == "exact":
                batch.add(compare.exact_check(f"effect:{eff.buffer}{suffix}", got, want))
            else:
                tol = spec.tolerance(eff.buffer, buf.dtype)
                batch.add(compare.finite_numeric_check(f"finite:{eff.buffer}{suffix}", f"effect:{eff.buffer}{suffix}",
                                                       got, plan.on(eff.oracle_rows, home(got)), (want,), tol,
                                                       is_reference=is_ref, memo=plan.memo))
        batch.add(compare.untouched_check(f"untouched:{eff.buffer}{suffix}", buf, before[eff.buffer],
                                          plan.on(rows, home(buf)), written_bytes=plan.on(eff.written_bytes, home(buf))))
    return [r for done in batch.resolve() for r in (done if isinstance(done, tuple) else (done,))]


def check_outputs(ctx: CaseContext, out: dict, inputs: dict, before: dict, suffix: str = "") -> list[compare.Record]:
    """The records of one run: its outputs ``out``, its ``inputs`` after the call (the effect buffers
    written) and the writable buffers' ``before`` copies; each check's name ends with ``suffix``."""
    return _output_records(ctx, out, inputs, before, suffix) + _effect_records(ctx, inputs, before, suffix)


def _same_each(groups: list) -> list[bool]:
    """Per group of (a, b) pairs, whether every pair holds the same thing (``compare.same_each``: both None,
    equal non-tensors, or tensors of one shape, dtype and device with the same bytes; one transfer per device)."""
    return compare.same_each(groups)


class FirstRun:
    """The first run's records and the bytes they were computed from: a later run holding the same
    bytes gets those records under its suffix instead of comparing again (every field equal: the
    records are functions of those bytes alone, an ``OutputSpec.observed`` output's of the writable
    buffers' before and after too; ``_output_records``, ``_effect_records``). The
    bytes are copies taken when the records were made: a later call may write a buffer the first
    one returned or was given (a persistent output, a captured pointer)."""

    def __init__(self, ctx: CaseContext, out: dict, inputs: dict, before: dict):
        self.ctx = ctx
        self.out_recs = _output_records(ctx, out, inputs, before)
        self.plan = EffectPlan(ctx, inputs, seen={})
        self.eff_recs = _effect_records(ctx, inputs, before, plan=self.plan)
        self.keys = set(inputs)
        self.out = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        self.written = {b: inputs[b].detach().clone() for b in writable_buffers(ctx.spec, inputs)}
        # the inputs spec.effects read (``plan.seen``), as they were: copies where they are, compared there
        self.seen = {k: inputs[k].detach().clone() if isinstance(inputs[k], torch.Tensor) else inputs[k]
                     for k in self.plan.seen}
        self.before = before

    @staticmethod
    def _renamed(recs: list, suffix: str) -> list[compare.Record]:
        return [dataclasses.replace(r, check=r.check + suffix, extra=dict(r.extra)) for r in recs]

    def check(self, out: dict, inputs: dict, before: dict, suffix: str) -> list[compare.Record]:
        """``check_outputs`` of a later run of the same context, the first run's records where its bytes are the
        same; its effects (``EffectPlan``) where the inputs ``spec.effects`` reads are. One transfer decides all."""
        ctx = self.ctx
        outputs = [o for o in ctx.spec.outputs if o.when(ctx.case)]
        outs = [(self.out.get(o.name), out.get(o.name)) for o in outputs]
        keys_same = set(inputs) == self.keys and set(before) == set(self.before)
        buffers = [] if not keys_same else ([(v, inputs[b]) for b, v in self.written.items()]
                                            + [(v, before[b]) for b, v in self.before.items()])
        seen = [(v, inputs[k]) for k, v in self.seen.items()] if keys_same else []
        outs_same, buffers_same, seen_same = _same_each([outs, buffers, seen])
        if any(o.observed is not None for o in outputs):  # those records read the buffers too
            outs_same = outs_same and keys_same and buffers_same
        if outs_same:
            recs = self._renamed(self.out_recs, suffix)
        else:
            recs = _output_records(ctx, out, inputs, before, suffix)
        if keys_same and seen_same and buffers_same:
            return recs + self._renamed(self.eff_recs, suffix)
        return recs + _effect_records(ctx, inputs, before, suffix, plan=self.plan if keys_same and seen_same else None)


def untouched_inputs(ctx: CaseContext, inputs: dict, suffix: str = "") -> list[compare.Record]:
    """``untouched:<input>`` for every input tensor the call may not write: not the op's writable
    buffers or caller-provided outputs, not ``impl.may_write``, and not a view sharing storage with
    one of those (MLA's v is a view of k: a declared write to k shows through v). Each named input
    is compared whole with its pristine copy (``ctx.pristine``: the run's inputs are copies of it), on the device."""
    spec, impl, pristine = ctx.spec, ctx.impl, ctx.pristine
    allowed = set(spec.writable) | set(spec.out_args) | set(impl.may_write)
    storages = {t.untyped_storage().data_ptr() for n in allowed if isinstance(t := inputs.get(n), torch.Tensor)} - {0}
    names = [name for name, t in inputs.items() if not (name in allowed or not isinstance(t, torch.Tensor)
                                                          or t.untyped_storage().data_ptr() in storages)]
    if compare.same([(inputs[n], pristine[n]) for n in names], memo=ctx.memo):  # one transfer, the usual answer
        return [compare.Record(f"untouched:{name}{suffix}", True) for name in names]  # = unchanged_check's
    batch = compare.Batch()  # one transfer for every input's flag
    for name in names:
        batch.add(compare.unchanged_check(f"untouched:{name}{suffix}", inputs[name], pristine[name],
                                          hint=f" (not writable in {spec.name}; a kernel that writes it on purpose "
                                               f"declares Impl(may_write=({name!r},)))"))
    return batch.resolve()

