"""One call, in the worker: rebuild a job's inputs, call its target on the broken input and
classify what happened (``OUTCOMES``), against the chain's answer on the legal input."""
from __future__ import annotations

import copy
import dataclasses
import re
import traceback
from typing import Any

import torch

from harness.fuzz.args import MODULES
from harness.fuzz.badclass import BadClass, Ctx
from harness.fuzz.strategies import CLASSES, Job
from harness.fuzz.surgery import changed, snapshot
from harness.fuzz.targets import call_target, load_fn, op_spec, resolve_target, target_limit
from reference.checks import VerifyParityInputError

OUTCOMES = ("typed-error", "correct", "crash", "segfault", "hang", "wrong", "partial-write", "refused", "misnamed")
GOOD = ("typed-error", "correct")


def device_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a device fault (a CUDA error, an illegal memory access): a segfault outcome."""
    text = f"{type(exc).__name__} {exc}"
    return "AcceleratorError" in text or "CUDA error" in text or "illegal memory access" in text


def _word(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


def _cpu(kw: dict) -> dict:
    return {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def build(job: Job, device) -> tuple[Any, dict, dict, dict, BadClass]:
    """(case, valid inputs, broken inputs, params) of a job, rebuilt exactly from its fields."""
    from cases.base import parse_case

    spec = op_spec(job.op)
    case = parse_case(spec.case_type, job.case.split(":", 1)[1])
    c, p, ctx = CLASSES[job.cls], dict(job.params), Ctx(job.op, case, device)
    base = spec.build_inputs(case, device)
    provide = getattr(MODULES[job.op], "provide_out", None)  # a job on an output the case leaves to the op
    if provide is not None and job.arg in getattr(MODULES[job.op], "PROVIDED_OUTS", ()):
        provide(base, job.arg, ctx)
    bad = copy.deepcopy(base)
    c.apply(bad, job.arg, p, ctx)
    return case, base, bad, p, c


def execute(job: Job, device) -> dict:
    """One call of a job's target on its broken input, classified: {"outcome", "detail"}."""
    from harness.devices import synchronize
    from harness.registry import Impl
    from harness.parity.records import CaseContext, check_outputs

    spec = op_spec(job.op)
    t = resolve_target(job.target)
    case, base, bad, p, c = build(job, device)
    ctx = Ctx(job.op, case, device)
    expect = c.expected(job.op)
    writable = tuple(spec.writable) + tuple(spec.out_args)
    names = tuple(t.rename(n) for n in (c.names(job.op, job.arg) if c.names else (job.arg,)))
    canon = None
    if expect == "answer":
        canon = copy.deepcopy(base)
        if c.canon is not None:
            c.canon(canon, job.arg, p, ctx)
        else:
            canon = copy.deepcopy(bad)
    limit = target_limit(t, canon, device) if canon is not None else ""
    snap = snapshot(bad)
    before = {b: bad[b].detach().cpu().clone() for b in spec.writable
              if isinstance(bad.get(b), torch.Tensor) and bad[b].device.type != "meta"}
    fn = load_fn(t.fn_path)
    exc = None
    try:
        out = call_target(t, fn, bad, case)
        synchronize(device)
    except Exception as e:  # noqa: BLE001 - every exception is classified below
        exc = e
    if exc is not None:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if device_fault(exc):
            return {"outcome": "segfault", "detail": f"device fault: {text}", "fatal": True}
        moved = changed(snap, bad)
        if moved:
            return {"outcome": "partial-write", "detail": f"rejected ({text}) but changed {moved}"}
        if not isinstance(exc, VerifyParityInputError):
            return {"outcome": "crash", "detail": text}
        if expect == "answer" and not limit:
            return {"outcome": "refused", "detail": f"a legal input: {text}"}
        if expect == "answer":  # a declared limit: any typed error that names an argument
            ok = any(_word(n, str(exc)) for n in (*bad, *names))
            return {"outcome": "typed-error" if ok else "misnamed", "detail": f"limit ({limit}): {text}"}
        if not isinstance(exc, c.error):
            return {"outcome": "misnamed", "detail": f"expected {c.error.__name__}, got {text}"}
        if not any(_word(n, str(exc)) for n in names):
            return {"outcome": "misnamed", "detail": f"does not name {' or '.join(names)}: {text}"}
        want = c.value(p) if c.value else ""
        if want and want not in str(exc):
            return {"outcome": "misnamed", "detail": f"does not say the value {want!r}: {text}"}
        return {"outcome": "typed-error", "detail": text}
    if expect == "error":
        return {"outcome": "wrong", "detail": f"accepted: expected {c.error.__name__} naming {' or '.join(names)}"}
    moved = changed(snap, bad, writable)
    if moved:
        return {"outcome": "wrong", "detail": f"wrote into {moved} (read-only, or outside a writable view)"}
    ref_t = resolve_target(t.ref)
    ref_in = copy.deepcopy(canon)
    try:
        ref_out = call_target(ref_t, load_fn(ref_t.fn_path), ref_in, case)
    except Exception as e:  # noqa: BLE001
        return {"outcome": "crash", "detail": f"no answer to compare with: {ref_t.name} raised on the legal input: "
                                              f"{type(e).__name__}: {e}"}
    oracle = spec.oracle(**_cpu(canon))
    keep = t.outputs or tuple(o.name for o in spec.outputs)
    sub = dataclasses.replace(spec, outputs=tuple(o for o in spec.outputs if o.name in keep))
    impl = Impl(job.op, t.name, t.kind, fn)
    ctx = CaseContext(sub, impl, case, device, base, _cpu(ref_out), _cpu(ref_in), oracle)
    recs = check_outputs(ctx, out, bad, before)
    bad_recs = [r for r in recs if not r.passed]
    if bad_recs:
        r = bad_recs[0]
        return {"outcome": "wrong", "detail": f"{r.check}: {r.detail} {r.worst}".strip()}
    return {"outcome": "correct", "detail": f"({limit}: answered anyway)" if limit else ""}
