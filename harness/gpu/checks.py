"""GPU-only checks (``nox -s gpu``): launch counts, CUDA/HIP graph capture and replay (with the
dispatch gate's decision), bitwise determinism at full size — what the parity suite cannot see
through the CPU interpreter. The checks themselves: ``harness.gpu.runners``.

    python -m harness.gpu.checks [--out DIR] [--op OP] [--impl NAME] [--check launches|graph|determinism]

Implementations: by default each op's reference and fused ones plus the GPU-only mutants of
``cases/mutants/gpu/`` (registered here, not in the CPU registry); ``--impl`` picks by name
(or ``module:attr``). A GPU mutant counts as flagged when a check named in its ``catches``
fails. Prints one line per row, a summary table, and a repro line per failure; ``--out DIR``
writes ``DIR/gpu_checks.csv`` (``GpuCheckRow``, provenance on every row). Exit 1 when a
reference/fused implementation fails any check, a GPU mutant is not flagged, or nothing ran.
Without a GPU: a message, exit 0, nothing checked.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.ops import BUILTIN
from reports.rows import with_provenance

if TYPE_CHECKING:  # annotations only: --help imports no torch
    from harness.gpu.runners import Outcome

CHECKS = ("launches", "graph", "determinism")
ROW_CHECK = {"launches": ("gpu:launches",), "graph": ("gpu:graph-replay", "gpu:graph-gate"),
             "determinism": ("gpu:determinism",)}


@with_provenance
@dataclass(frozen=True)
class GpuCheckRow:
    check: str  # gpu:launches | gpu:graph-replay | gpu:graph-gate | gpu:determinism
    op: str
    impl: str
    kind: str
    shape: str  # display id of the catalog case
    expected: str
    got: str
    passed: bool | None  # None: not applicable (reason in detail)
    detail: str
    seconds: float
    repro: str


# ----------------------------------------------------------------------------- running, verdict, report

def _repro(op: str, impl: str, check: str) -> str:
    family = next(f for f, names in ROW_CHECK.items() if check in names)
    return f"python -m harness.gpu.checks --op {op} --impl {impl} --check {family}"


def _safely(fn, check_names: tuple[str, ...]) -> list[Outcome]:
    import torch

    from harness.gpu.runners import Outcome

    try:
        res = fn()
        return res if isinstance(res, list) else [res]
    except Exception as exc:  # a crash (capture error included) fails that implementation's check
        msg = traceback.format_exception_only(type(exc), exc)[-1].strip()[:400]
        with contextlib.suppress(Exception):  # let a failed capture settle before the next check
            torch.cuda.synchronize()
        return [Outcome(c, "runs", "raised", False, msg) for c in check_names]


def _refused(impl, case, dev, inputs, check_names) -> list[Outcome]:
    """Outcomes when ``impl`` refuses ``case`` (skipped) or its can_handle raises (failed); [] when it runs it."""
    from harness.gpu.runners import Outcome

    try:
        refusal = impl.handles(case, dev, lambda: inputs(case))
    except Exception as exc:
        msg = traceback.format_exception_only(type(exc), exc)[-1].strip()[:400]
        return [Outcome(c, "can_handle", "raised", False, msg) for c in check_names]
    return [] if refusal is True else [Outcome(c, "-", "-", None, f"refused: {refusal}") for c in check_names]


def run(reg, dev, prov, *, ops, impls, checks, seed: int, progress=print) -> list[GpuCheckRow]:
    from cases.base import display_id
    from harness.gpu.runners import Inputs, check_determinism, check_graph, check_launches

    rows = []
    for op in ops:
        spec = reg.ops[op]
        plan = spec.gpu
        inputs = Inputs(spec, dev)  # built once per case, copied per call
        named = {c.name: c for c in spec.catalog(big=True)}
        work = [(chk, named[n]) for chk in ("launches", "graph") if chk in checks for n in plan.cases]
        if "determinism" in checks:
            work.append(("determinism", named[plan.full]))
        for impl in (i for i in impls if i.op == op):
            for chk, case in work:
                if chk == "determinism" and impl.kind == "reference":
                    continue  # the fused op is the subject; the chain is torch's
                t0 = time.perf_counter()
                check = {"launches": lambda: check_launches(spec, impl, case, dev, inputs=inputs),
                         "graph": lambda: check_graph(spec, impl, case, dev, seed, inputs=inputs),
                         "determinism": lambda: check_determinism(spec, impl, case, dev, inputs=inputs)}[chk]
                outs = _refused(impl, case, dev, inputs, ROW_CHECK[chk]) or _safely(check, ROW_CHECK[chk])
                secs = round(time.perf_counter() - t0, 2)
                for o in outs:
                    rows.append(GpuCheckRow(o.check, op, impl.name, impl.kind, display_id(op, case), o.expected,
                                            o.got, o.passed, o.detail, secs, _repro(op, impl.name, o.check),
                                            **prov.__dict__))
                    if progress:
                        state = row_state(o.passed, impl.kind)
                        progress(f"{state:4s} {o.check:17s} {op}/{impl.name:32s} {case.name:28s} got {o.got[:70]}"
                                 f"  ({secs:.1f}s)")
    return rows


def row_state(passed: bool | None, kind: str) -> str:
    """Progress label of one row: a mutant's failed check is the check working ("flag"), so only a
    clean implementation's failure reads FAIL (the nightly counts FAIL lines as failures)."""
    if passed is None:
        return "skip"
    return "pass" if passed else ("flag" if kind == "mutant" else "FAIL")


def verdict(rows: list[GpuCheckRow], impls) -> dict[str, list]:
    """{"clean_failures": rows, "killed": [(impl, rows)], "survived": [impl], "unjudged": [impl]}.
    Only GPU mutants are judged; other mutants run for information."""
    from harness.gpu.mutants import is_gpu_mutant

    out = {"clean_failures": [r for r in rows if r.kind != "mutant" and r.passed is False],
           "killed": [], "survived": [], "unjudged": []}
    for impl in impls:
        if not is_gpu_mutant(impl):
            continue
        mine = [r for r in rows if r.op == impl.op and r.impl == impl.name and r.check in impl.catches]
        flagged = [r for r in mine if r.passed is False]
        if flagged:
            out["killed"].append((impl, flagged))
        elif any(r.passed is True for r in mine):
            out["survived"].append(impl)
        else:
            out["unjudged"].append(impl)
    return out


def exit_code(v: dict) -> int:
    return 1 if v["clean_failures"] or v["survived"] else 0


def summary(rows: list[GpuCheckRow]) -> str:
    import pandas as pd

    if not rows:
        return "no rows"
    frame = pd.DataFrame([dataclasses.asdict(r) for r in rows])
    frame["state"] = frame["passed"].map({True: "pass", False: "FAIL", None: "skip"}).fillna("skip")
    worst = lambda s: "FAIL" if "FAIL" in set(s) else ("pass" if "pass" in set(s) else "skip")  # noqa: E731
    table = frame.pivot_table(index=["op", "impl", "kind"], columns="check", values="state", aggfunc=worst)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        return table.fillna("-").to_string()


def build_parser() -> argparse.ArgumentParser:
    from harness import usage

    p = usage.ArgumentParser(prog="python -m harness.gpu.checks", description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=usage.output_dir, default=None, help="directory for gpu_checks.csv")
    p.add_argument("--op", action="append", choices=BUILTIN,
                   help="op(s) to check (default: every op with a GPU plan, OpSpec.gpu)")
    p.add_argument("--impl", action="append", help="implementation name or module:attr (repeatable; default: "
                                                   "reference, fused and the GPU mutants of cases/mutants/gpu/)")
    p.add_argument("--check", action="append", choices=CHECKS, help="check family (default: all)")
    p.add_argument("--seed", type=int, default=0, help="added to the replay inputs' seed")
    return p


def _select(reg, args, ops) -> list:
    from harness.gpu.mutants import is_gpu_mutant
    from harness.usage import UsageError

    names = [s for s in args.impl or () if ":" not in s]
    for s in args.impl or ():
        if ":" in s:
            try:
                names += [i.name for i in reg.load_spec(s)]
            except Exception as exc:  # the user asked for this one: the spec and the error, no traceback
                raise UsageError(f"--impl {s}", f"cannot load it: {type(exc).__name__}: {exc}") from None
    pool = [i for i in reg.impls.values() if i.op in ops]
    if not names:
        return [i for i in pool if i.kind in ("reference", "fused") or is_gpu_mutant(i)]
    missing = set(names) - {i.name for i in pool}
    if missing:
        raise UsageError("--impl", f"unknown implementation(s) {', '.join(sorted(missing))} for {', '.join(ops)}; "
                                   f"known: {', '.join(sorted({i.name for i in pool}))}")
    return [i for i in pool if i.name in names]


def registry():
    """The default registry (no plugins) plus the GPU-only mutants."""
    from harness.gpu import mutants as gpu
    from harness.ops import default_registry

    reg = default_registry(with_plugins=False)
    gpu.register(reg)
    return reg


def main(argv: list[str] | None = None) -> int:
    """A bad argument: one line, exit 2 (``harness.usage``)."""
    from harness import usage

    p = build_parser()
    return usage.guarded(p.prog, _main, p.parse_args(argv))


def _main(args) -> int:
    import torch

    from harness import usage

    checks = tuple(args.check or CHECKS)
    reg = registry()  # no kernel module imported yet: names are checked on any machine
    planned = [op for op in BUILTIN if reg.ops[op].gpu]
    if set(args.op or ()) - set(planned):
        raise usage.UsageError("--op", f"{', '.join(sorted(set(args.op) - set(planned)))} has no GPU plan "
                                       f"(OpSpec.gpu); ops with one: {', '.join(planned)}")
    ops = tuple(args.op or planned)  # default: every op with a GPU plan
    impls = _select(reg, args, ops)
    if not torch.cuda.is_available():
        print("gpu checks: no GPU on this machine (torch.cuda.is_available() is False): checked nothing, wrote "
              "nothing. Launch counts and CUDA-graph replay need CUDA or ROCm (nox -s gpu on a GPU runner).")
        return 0
    from cases import profiles
    from harness import devices
    from harness.parity.suite import provenance

    dev = devices.select("auto")
    prov = provenance(dev, profiles.current(), args.seed)
    print(f"gpu checks: device={dev.kind} ({dev.name}, {dev.arch}) checks={','.join(checks)} ops={','.join(ops)} "
          f"impls={', '.join(i.key for i in impls)}", flush=True)
    t0 = time.perf_counter()
    rows = run(reg, dev, prov, ops=ops, impls=impls, checks=checks, seed=args.seed,
               progress=lambda m: print(m, flush=True))
    if args.out:
        import pandas as pd
        from pathlib import Path

        from reports.rows import columns, write_frame

        path = write_frame(pd.DataFrame([dataclasses.asdict(r) for r in rows], columns=columns(GpuCheckRow)),
                           Path(args.out) / "gpu_checks.csv")
        print(f"rows: {len(rows)} -> {path}")
    print("\n" + summary(rows))
    v = verdict(rows, impls)
    for r in v["clean_failures"]:
        print(f"FAIL {r.op}/{r.impl} [{r.check}] {r.shape}: expected {r.expected}; got {r.got}. {r.detail}"
              f"\n  repro: {r.repro}")
    for impl, flagged in v["killed"]:
        print(f"KILLED {impl.key} by {', '.join(sorted({r.check for r in flagged}))}: {flagged[0].got}")
    for impl in v["survived"]:
        print(f"SURVIVED {impl.key} ({impl.doc}); its checks {list(impl.catches)} passed"
              f"\n  repro: {_repro(impl.op, impl.name, impl.catches[0])}")
    for impl in v["unjudged"]:
        print(f"NOT JUDGED {impl.key}: none of its checks {list(impl.catches)} ran")
    n_mut = sum(1 for i in impls if i.kind == "mutant")
    judged = len(v["killed"]) + len(v["survived"])
    print(f"gpu checks: {len(rows)} rows in {time.perf_counter() - t0:.0f}s; clean failures "
          f"{len(v['clean_failures'])}; GPU mutants killed {len(v['killed'])}/{judged} (of {n_mut} mutants run)")
    return exit_code(v) if rows else 1


if __name__ == "__main__":
    sys.exit(main())
