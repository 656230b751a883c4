"""``python -m harness timelines``: the plan (named + generated timelines × paths), the runs (in
worker processes with ``--jobs N``), the rows, the summary and the FAIL lines with their repro.

A path travels to a worker as a picklable spec: ("clean", prepare, attn, backend, accept) —
implementation names ("" accept: ``harness.timelines.runner.clean_path``'s default) and the ``--backend
module:attr`` spec ("" for the clean backend), each worker loading the backend again
(``harness.backend.load``) — or ("mutant", name) for a path mutant of ``cases/mutants/timelines.py``.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

from cases import base
from cases import timelines as tl
from harness import backend as backend_mod
from harness.timelines import runner as timeline
from harness.timelines import path as path_mod
from harness.timelines.prepare import accept_role
from harness.usage import UsageError


def path_for(reg, family: str, spec: tuple) -> path_mod.Path:
    """The path of a spec (see the module docstring) for ``family``."""
    from cases.mutants import timelines as mt

    if spec[0] == "mutant":
        return {m.name: m for m in mt.PATH_MUTANTS}[spec[1]].path(reg, family)
    be = load_backend(spec[3]) if spec[3] else backend_mod.CLEAN
    return path_mod.clean_path(reg, family, prepare=spec[1], attn=spec[2], accept=spec[4] or None, backend=be)


def load_backend(spec: str) -> backend_mod.Backend:
    """``--backend module:attr`` -> the Backend; one that fails to load is a usage error naming it."""
    try:
        return backend_mod.load(spec)
    except backend_mod.BackendLoadError as exc:
        raise UsageError("--backend", str(exc).removeprefix("--backend: ")) from None
    except Exception as exc:  # the user asked for this one: no traceback, the spec and the error
        raise UsageError(f"--backend {spec}", f"cannot load it: {type(exc).__name__}: {exc}") from None


def _task(task):
    """A worker's unit: (timeline, path spec) -> (path name, records)."""
    from harness.parity import suite

    t, spec = task
    dev, reg = suite.worker_state()
    path = path_for(reg, t.family, spec)
    return path.name, timeline.run_timeline(path, t, dev.torch_device, dev.fp8_dtype)


def check_path(reg, family: str, prepare: str, attn: str, accept: str = "", flag: str = "--path") -> None:
    """``prepare+attn[+accept]`` names registered implementations for ``family``'s ops
    (``harness.timelines.runner.clean_path``)."""
    op = tl.FAMILIES[family].prepare  # "projection": plain projections, the prepare name is not used
    role = accept_role(tl.FAMILIES[family])
    slots = [(op, prepare), (reg.attention().name, attn)] + [(s.name, accept) for s in reg.by_role(role) if accept]
    for slot, name in slots:
        impls = reg.impls.values() if slot == "projection" else reg.for_op(slot)
        if name not in {i.name for i in impls}:
            what = "+".join(x for x in (prepare, attn, accept) if x)
            raise UsageError(flag, f"{what}: no {'' if slot == 'projection' else slot + ' '}implementation "
                                   f"{name!r} (family {family}); known: {', '.join(sorted({i.name for i in impls}))}")


def plan(args, prof) -> list:
    """The timelines to run: ``--timeline``, else the named ones of the families plus generated ones; sharded."""
    from harness.parity import suite

    fams = args.family or sorted(tl.FAMILIES)
    work = []
    if args.timeline:  # a Timeline: argparse parsed it
        work.append(args.timeline)
    else:
        work += [t for t in tl.catalog() if t.family in fams]
        n = prof.generated // 10 if args.generated is None else args.generated
        for f in fams:
            work += base.draw(tl.timelines(family=f), n, rng_seed=args.seed) if n else []
    return suite.shard(work, args.shard)


def path_specs(args) -> list[tuple]:
    """The path specs of ``--path`` / ``--path-mutant`` / ``--backend``."""
    if args.path_mutant:
        if args.backend:
            raise UsageError("--backend", "a path mutant is a backend of its own: give --backend or --path-mutant")
        return [("mutant", args.path_mutant)]
    for spec in args.backend or ():
        load_backend(spec)  # here first: a bad spec is one line before any work
    return [("clean", p[0], p[1], be, p[2] if len(p) > 2 else "") for p in args.path or [("fused", "fused")]
            for be in args.backend or [""]]


def run(args, dev, prof, reg, plugin_specs: tuple[str, ...]) -> int:
    """The whole command after argument parsing: exit status 1 when a run fails, none ran, or it was cut."""
    from tqdm import tqdm

    from harness import pool
    from harness.parity import suite
    from reports import timeline_rows
    from reports.rows import FAILING, TimelineRow, to_frame, write_frame

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a time limit still leaves a CSV
    fams = args.family or sorted(tl.FAMILIES)
    work = plan(args, prof)
    specs = path_specs(args)
    for fam in sorted({t.family for t in work}):
        for sp in [sp for sp in specs if sp[0] == "clean"]:
            check_path(reg, fam, sp[1], sp[2], sp[4])
    tasks = [(t, sp) for t in work for sp in specs]
    print(f"verify-parity timelines: device={dev.kind} ({dev.name}) families={','.join(fams)} "
          f"timelines={len(work)} paths={len(specs)} jobs={args.jobs}", flush=True)

    suite.set_worker_state(dev, reg)  # --jobs 1: the tasks run here, on this registry
    timeout = suite.default_case_timeout(dev) if args.case_timeout_s is None else args.case_timeout_s
    results = suite.spawn_map(_task, tasks, args.jobs, dev, plugin_specs, timeout_s=timeout or None,
                              stack_dir=Path(args.csv).parent / "stacks", isolate=bool(args.case_timeout_s),
                              name=lambda task: f"{'+'.join(x for x in task[1][1:3] + task[1][4:] if x)}-"
                                                f"{timeline_rows.stack_name(task[0])}")
    prov = suite.provenance(dev, prof, args.seed)
    by_task, done = {}, 0  # task index -> (rows, FAIL line or ""): in completion order, written in plan order
    bar = tqdm(total=len(tasks), desc="timelines", unit="run", disable=args.quiet, file=sys.stderr,
               dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 15.0)
    try:
        for k, res in results:
            t, sp = tasks[k]
            path = path_for(reg, t.family, sp)
            plugins = tuple(i.impl_arg for i in (path.prepare, path.attn, path.accept)
                            if i is not None and i.impl_arg != i.name)
            repro = timeline_rows.repro_line(dev.kind, t, sp, plugins)
            run_rows = (timeline_rows.lost_rows(path.name, t, res, repro, prov) if isinstance(res, pool.Lost)
                        else timeline_rows.rows_for(res[0], t, res[1], repro, prov))
            bad = [r for r in run_rows if r.status in FAILING]
            line = (f"FAIL {run_rows[0].path} {bad[0].timeline} {timeline_rows.fail_line(vars(bad[0]))}\n"
                    f"  repro: {repro}") if bad else ""
            by_task[k] = (run_rows, line)
            done += 1
            bar.update(1)
            bar.set_postfix_str(f"fail={sum(bool(x[1]) for x in by_task.values())}")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (a CI time limit): keep what ran, say so
        print(f"\ninterrupted: {done} of {len(tasks)} timeline runs done; rows so far are kept", file=sys.stderr)
    finally:
        results.close()
        bar.close()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the rows are in: a late time limit must not cut the CSV/summary
    rows = [r for k in sorted(by_task) for r in by_task[k][0]]
    fails = [by_task[k][1] for k in sorted(by_task) if by_task[k][1]]
    frame = to_frame(rows, TimelineRow)
    write_frame(frame, args.csv)
    if len(frame):
        print("\n" + timeline_rows.summary(frame).to_string(index=False))
    for line in fails:
        print(line)
    n_runs = frame[["path", "timeline"]].drop_duplicates().shape[0] if len(frame) else 0
    print(f"timelines: {n_runs} runs ({len(work)} timelines), {n_runs - len(fails)} pass, {len(fails)} fail; "
          f"{len(frame)} checks -> {args.csv}")
    return 1 if fails or not n_runs or done < len(tasks) else 0
