"""The bodies of the ``python -m harness`` commands (``harness.cli.main`` parses, then calls one):
each takes the parsed arguments (the delegated ones: the rest of the command line) and returns
the exit status. Heavy modules are imported inside the command that needs them."""
from __future__ import annotations

import sys
from pathlib import Path

from harness.cli.setup import load_registry, load_specs, plugin_specs, select_impls, setup
from harness.usage import UsageError

INTERRUPTED = 130  # exit status of a run cut short by Ctrl-C or SIGTERM (128 + SIGINT, as a shell reports it)


def cmd_list(args) -> int:
    """Ops, their implementations (``--impl NAME``: only those; an unknown name is a usage error),
    catalogs, timelines, profiles and the device. Nothing runs: torch is not imported (a plugin module
    may import it), and Triton is left as it is."""
    dev, prof, reg = setup(args, prepare=False)
    names = {s for s in args.impl or () if ":" not in s}
    unknown = names - {i.name for i in reg.impls.values()}
    if unknown:
        raise UsageError("--impl", f"unknown implementation(s) {', '.join(sorted(unknown))}; known: "
                                   f"{', '.join(sorted({i.name for i in reg.impls.values()}))}")
    from harness import registry  # here, not at the top: --help imports no torch
    from cases.profiles import generated_count

    for name, spec in sorted(reg.ops.items()):
        print(f"{name}: {spec.doc}")
        n = generated_count(spec, prof, interpreted=dev.interpreted)  # what `run` draws on this device
        cap = " (the op's cap under the interpreter)" if n < prof.generated else ""
        print(f"  catalog: {len(spec.catalog(big=False))} cases (+{len(spec.catalog(big=True)) - len(spec.catalog(big=False))} big); "
              f"generated per run ({prof.name}): {n}{cap}")
        for impl in reg.for_op(name):
            if names and impl.name not in names:
                continue
            pol = f" fp8_policy={impl.fp8_policy}" if impl.fp8_policy else ""
            pol += f" precision={impl.precision}"
            pol += f" nan_policy={registry.nan_policy_of(spec, impl)}" if spec.nan_policies else ""
            pol += f" may_write={','.join(impl.may_write)}" if impl.may_write else ""
            src = f"  [{impl.source}]" if impl.source else ""
            print(f"  - {impl.name:36s} {impl.kind:9s}{pol}  {impl.doc}{src}")
        print(f"  cases: {', '.join(c.name for c in spec.catalog(big=True))}")
    from cases import profiles
    from cases import timelines as tl
    from cases.mutants import timelines as mt

    print(f"timeline families: {', '.join(sorted(tl.FAMILIES))}")
    print(f"timelines: {', '.join(t.name for t in tl.catalog())}")
    print(f"path mutants: {', '.join(m.name for m in mt.PATH_MUTANTS)}")
    print(f"profiles: {', '.join(sorted(profiles.PROFILES))} (this run: {prof.name})")
    for err in reg.load_errors:
        print(f"broken entry point (not loaded): {err}")
    print(f"device: {dev.kind} {dev.name} arch={dev.arch} fp8={dev.fp8_format} shim={dev.shim or '-'}")
    return 0


def cmd_run(args) -> int:
    from harness.parity import suite
    from reports.rows import to_frame, write_csv

    import signal

    from harness import ledger

    dev, prof, reg = setup(args)
    try:
        known = tuple(e for spec in args.ledger or () for e in ledger.load(spec))
    except ValueError as exc:
        arg, _, msg = str(exc).partition(": ")
        raise UsageError(arg, msg) from None
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a time limit still leaves a CSV
    if args.expect_fail and not args.broad and not (args.op or args.case or args.impl or args.generated
                                                    or args.generated_only):
        from harness.gpu import mutants as gpu
        from harness.mutants import kills

        rc = kills.run_kill_matrix(reg, dev, prof, seed=args.seed, csv=args.csv, kill_matrix=args.kill_matrix,
                                   junit=args.junit, e2e=args.e2e, e2e_problems=args.e2e_problems, jobs=args.jobs,
                                   quiet=args.quiet)  # the default mutant run: targeted catalogs + timelines
        print(gpu.skip_note())
        return rc
    # torch.compile of the chains runs on every device, but on the CPU machine inductor's C++
    # compiles cost minutes per run, so there it is opt-in: --kind compiled or --impl compiled.
    default = ("reference", "fused", "external") + (() if dev.interpreted else ("compiled",))
    ops, impls = select_impls(reg, args, default)
    from cases.profiles import generated_count

    counts = ", ".join(f"{op} {generated_count(reg.ops[op], prof, interpreted=dev.interpreted, generated=args.generated)}"
                       for op in ops)
    print(f"verify-parity run: device={dev.kind} ({dev.name}, {dev.arch}, fp8 {dev.fp8_format}) profile={prof.name} "
          f"shim={dev.shim or 'off (compiled)'}; generated cases: {counts}; impls: {', '.join(i.key for i in impls)}",
          flush=True)
    if known:
        print(f"ledger: {len(known)} known failures ({', '.join(e.id for e in known)})", flush=True)
    from harness.parity import stages

    table = stages.Table()
    tally = suite.Tally()
    try:
        rows = suite.run(reg, dev=dev, profile=prof, ops=ops, impls=impls, seed=args.seed, shard_spec=args.shard,
                         generated=args.generated, progress=not args.quiet, case_filter=args.case,
                         generated_only=args.generated_only, jobs=args.jobs,
                         plugin_specs=plugin_specs(args), ledger=known, case_timeout_s=args.case_timeout_s,
                         stack_dir=Path(args.csv).parent / "stacks", isolate=bool(args.case_timeout_s),
                         stage_table=table, tally=tally)
    except suite.NothingSelected as exc:  # a selection that matches nothing is a mistake: the last results stay
        given = [(flag, v) for flag, v in (("--case", args.case), ("--generated-only", args.generated_only),
                                           ("--impl", args.impl), ("--kind", args.kind), ("--op", args.op)) if v]
        said = [flag if v is True else f"{flag} {','.join(v) if isinstance(v, list) else v}" for flag, v in given] \
            or ["--op (every op)"]
        raise UsageError(said[0], f"{exc}" + (f" with {' '.join(said[1:])}" if said[1:] else "") +
                         f"; nothing written ({args.csv} left as it was)") from None
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the rows are in: a late time limit must not cut the CSV/summary
    if tally.interrupted and not rows:  # nothing completed: nothing to keep, and the last results stay
        print(f"interrupted before any run completed: nothing written ({args.csv} left as it was)", file=sys.stderr)
        return INTERRUPTED
    path = write_csv(rows, args.csv)
    print(f"rows: {len(rows)} -> {path}" + (f" (interrupted: {tally.done} of {tally.total} runs)" if tally.interrupted
                                            else ""))
    if not dev.interpreted:  # nightly reads this line: compile time apart from run time
        print(stages.compile_line(table))
    if args.stage_times:
        print(table.format())
    frame = to_frame(rows)
    if args.junit:
        from reports import junit

        print(f"junit -> {junit.write(frame, args.junit)}")
    if args.expect_fail:  # mutant runs: every implementation must be flagged
        from harness.mutants import kills

        rc = kills.print_kills(frame)
    else:
        from reports import summary

        rc = summary.print_report(frame)
        for line in suite.coverage(rows, reg, ops=ops, profile=prof, dev=dev, generated=args.generated):
            print(line)
    if tally.interrupted:  # a run cut short never reads as a complete one, however its rows went
        print(f"interrupted: {tally.done} of {tally.total} runs done; {path} holds their rows", file=sys.stderr)
        return INTERRUPTED
    return rc


def _check_path(reg, family: str, prepare: str, attn: str, flag: str = "--path") -> None:
    from harness.timelines import suite as timeline_suite

    timeline_suite.check_path(reg, family, prepare, attn, flag=flag)


def cmd_timelines(args) -> int:
    """Clean paths (or one path mutant / op implementation / backend plugged in) over named + generated
    timelines (``harness.timelines.suite``)."""
    from harness.timelines import suite as timeline_suite

    names = [s for s in args.impl or () if ":" not in s]
    if names:
        raise UsageError("--impl", f"{', '.join(names)}: a timeline runs the implementations --path names "
                                   f"(prepare+attn); --impl only loads module:attr plugins here")
    timeline_suite.path_specs(args)  # --backend and --path-mutant: a bad one is one line before any work
    dev, prof, reg = setup(args)
    return timeline_suite.run(args, dev, prof, reg, plugin_specs(args))


def cmd_gpu(rest: list[str]) -> int:
    from harness.gpu import checks as gpu_checks

    return gpu_checks.main(rest)


def cmd_bench(rest: list[str]) -> int:
    from harness.bench.__main__ import main

    return main(rest)


def cmd_nightly(rest: list[str]) -> int:
    from harness.nightly import run as nightly

    return nightly.main(rest)


def cmd_warmup(rest: list[str]) -> int:
    from harness.gpu import warmup

    return warmup.main(rest)


DELEGATED = {"gpu": cmd_gpu, "bench": cmd_bench, "nightly": cmd_nightly,
             "warmup": cmd_warmup}  # subcommands with their own parsers


def cmd_repro(args) -> int:
    from harness.parity import repro

    dev, prof, reg = setup(args)
    return repro.run(reg, dev, prof, args.case_id, args.impl, args.loaded)


def cmd_compile(args) -> int:
    """Built-in kernels (every op, or --op's), or with --impl module:attr the plugin's (Impl.compile_specs)."""
    from harness.gpu import compile as compile_check
    from harness.ops import BUILTIN

    try:
        compile_check.prepare()  # before any kernel module, a plugin's included, is imported
    except RuntimeError as exc:
        raise UsageError("TRITON_INTERPRET", str(exc)) from None
    impls = []
    if args.impl:
        from harness.ops import default_registry
        from harness.registry import cwd_on_path

        cwd_on_path()
        impls = load_specs(default_registry(with_mutants=False, with_plugins=False), args.impl)
        bare = [i.key for i in impls if i.compile_specs is None]
        if len(bare) == len(impls):
            raise UsageError("--impl", f"{', '.join(args.impl)}: {', '.join(bare) or 'nothing'} loaded, declaring no "
                                       f"Triton kernels to compile (Impl.compile_specs)")
        for key in bare:
            print(f"{key}: declares no Triton kernels (Impl.compile_specs): skipped")
    import pandas as pd

    res = compile_check.run(args.op or ([] if impls else list(BUILTIN)), args.target or list(compile_check.TARGETS),
                            tuple(impls))
    frame = pd.DataFrame([r.__dict__ for r in res])
    with pd.option_context("display.width", 200, "display.max_colwidth", 90, "display.float_format", "{:.2f}".format):
        print(frame.to_string(index=False))
    bad = frame[~frame["ok"]]
    print(f"compiled {int(frame['ok'].sum())}/{len(frame)} kernel variants for {', '.join(args.target or compile_check.TARGETS)}")
    return 0 if bad.empty else 1


def cmd_report(args) -> int:
    from reports.build import MERGED, build

    b = build(args.csv, args.out, mutants=args.mutants or [], perf=args.perf or [], gate=args.gate or [],
              baseline=args.baseline, baseline_perf=args.baseline_perf, threshold=args.slower,
              killmatrix=args.kill_matrix or [], timelines=args.timelines or [])
    for flag, path, n in b.inputs:
        print(f"read {flag} {path}: {n} rows")
    print(f"report: {b.rows} rows ({b.failed_rows} failing) -> {b.out}/report.html, junit.xml, {MERGED}, diff.csv")
    if args.timelines:
        print(f"timelines: {b.timeline_runs} runs ({b.failed_timeline_runs} failing)")
    if args.baseline:
        print(f"baseline diff vs {args.baseline}: {b.diff_rows} changed rows, {b.regress} REGRESS")
    return 1 if b.regress else 0


def cmd_gate(args) -> int:
    """End-to-end gate: micro-models through the paths under test, rows of GateRow."""
    from cases import e2e_gate
    from harness import devices
    from harness.e2e import gate
    from reports.rows import write_csv

    dev = devices.select(args.device)
    prof = e2e_gate.PROFILES[args.profile or ("cpu-lite" if dev.interpreted else "full")]  # argparse checked it
    if args.ab:  # server A/B mode: two OpenAI-compatible endpoints, B judged against A
        from harness.e2e import client
        from harness.parity.suite import provenance

        cfg = client.ClientConfig(num_fewshot=args.fewshot, concurrency=args.concurrency)
        rows = client.ab(*args.ab, problems=args.problems or prof.problems, cfg=cfg, source=args.source,
                         prov=provenance(dev, prof, args.seed).__dict__)
        for r in rows:
            print(f"{r.path} [{r.extraction}] acc {r.accuracy:.3f} [{r.accuracy_lo:.3f}, {r.accuracy_hi:.3f}] "
                  f"same-text {r.exact_agreement:.3f} p {r.p_value:.2g} -> {r.verdict} {r.detail}")
        print(f"gate rows: {len(rows)} -> {write_csv(rows, args.csv)}")
        return 1 if any(r.verdict != r.expect for r in rows) else 0
    if args.backend:
        from dataclasses import replace

        from harness.timelines import suite as timeline_suite

        timeline_suite.load_backend(args.backend)  # a bad spec is one line before any work
        prof = replace(prof, backend=args.backend)
    rows = gate.run(load_registry(), dev, prof, layouts=args.layout or e2e_gate.LAYOUTS,
                    models_dir=args.models or e2e_gate.MODEL_DIR,
                    problems=args.problems, seed=args.seed, progress=None if args.quiet else lambda m: print(m, flush=True),
                    jobs=args.jobs)
    print(f"gate rows: {len(rows)} -> {write_csv(rows, args.csv)}")
    bad = [r for r in rows if r.verdict != r.expect]
    for r in bad:
        print(f"GATE {'FAIL' if r.expect == 'pass' else 'MISSED MUTANT'} {r.layout} {r.path}: {r.detail}")
    return 1 if bad else 0


def cmd_serve(args) -> int:
    from cases import e2e_gate
    from harness.e2e import server

    _check_path(load_registry(), args.layout, *args.path)
    args.path, args.models = "+".join(args.path), args.models or e2e_gate.MODEL_DIR
    return server.main(args)
