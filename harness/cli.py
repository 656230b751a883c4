"""python -m harness {list, run, repro, mutants, compile, report, gate, serve} — thin: parse, delegate, print, exit code.

A bad argument is one line on stderr and exit status 2 (``harness.usage``), before any work starts."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from harness import ids, usage
from harness.usage import UsageError


def _registry():
    """Built-ins, mutants and entry points; one warning line on stderr per broken entry point."""
    from harness.registry import default_registry

    reg = default_registry()
    for err in reg.load_errors:
        print(f"warning: {err} (skipped)", file=sys.stderr)
    return reg


def _load_specs(reg, specs) -> list:
    """Register every ``--impl module:attr[names]``; one that fails is a clear exit naming the spec."""
    loaded = []
    for spec in specs:
        try:
            loaded += reg.load_spec(spec)
        except Exception as exc:  # the user asked for this one: no traceback, the spec and the error
            arg, _, msg = str(exc).partition(": ")
            if arg.startswith("--impl"):  # the registry's own message names the spec
                raise UsageError(arg, msg) from None
            raise UsageError(f"--impl {spec}", f"cannot load it: {type(exc).__name__}: {exc}") from None
    return loaded


def _plugin_spec(text: str) -> str:
    """argparse type of ``compile --impl``: a module:attr spec (built-in kernels need no --impl)."""
    if ":" not in text:
        raise argparse.ArgumentTypeError(f"expected module:attr[name,...] (a plugin), got {text!r}")
    return text


def _plugin_specs(args) -> tuple[str, ...]:
    return tuple(s for s in getattr(args, "impl", None) or () if ":" in s)


def _profile(name: str | None):
    """``--profile`` (checked by argparse), else ``$VP_PROFILE``, else ci."""
    from cases import profiles

    env = os.environ.get(profiles.ENV)
    if name is None and env is not None and env not in profiles.PROFILES:
        raise UsageError(profiles.ENV, f"expected one of {', '.join(sorted(profiles.PROFILES))}, got {env!r}")
    return profiles.current(name)


def _setup(args):
    from harness import devices

    prof = _profile(getattr(args, "profile", None))
    dev = devices.select(args.device, fp8_format=getattr(args, "fp8_format", None))
    reg = _registry()
    args.loaded = _load_specs(reg, _plugin_specs(args))
    return dev, prof, reg


def _select_impls(reg, args, default_kinds):
    """--impl NAME selects by name; --impl module:attr selects what it loaded; else --kind."""
    names = [s for s in args.impl or () if ":" not in s]
    kinds = tuple(args.kind) if args.kind else default_kinds
    ops = args.op or sorted(reg.ops)  # argparse checked --op against the built-in ops
    chosen = []
    for impl in reg.impls.values():
        if impl.op not in ops:
            continue
        if names or args.loaded:
            if impl.name in names or any(impl is i for i in args.loaded):
                chosen.append(impl)
        elif impl.kind in kinds:
            chosen.append(impl)
    missing = set(names) - {i.name for i in chosen}
    if missing:
        known = sorted({i.name for i in reg.impls.values() if i.op in ops})
        raise UsageError("--impl", f"unknown implementation(s) {', '.join(sorted(missing))} for {', '.join(ops)}; "
                                   f"known: {', '.join(known)}")
    return ops, chosen


def cmd_list(args) -> int:
    dev, prof, reg = _setup(args)
    for name, spec in sorted(reg.ops.items()):
        print(f"{name}: {spec.doc}")
        print(f"  catalog: {len(spec.catalog(big=False))} cases (+{len(spec.catalog(big=True)) - len(spec.catalog(big=False))} big); "
              f"generated per run ({prof.name}): {prof.generated}")
        for impl in reg.for_op(name):
            pol = f" fp8_policy={impl.fp8_policy}" if impl.fp8_policy else ""
            pol += f" precision={impl.precision}"
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
    from harness import suite
    from reports.rows import to_frame, write_csv

    import signal

    from harness import ledger

    dev, prof, reg = _setup(args)
    try:
        known = tuple(e for spec in args.ledger or () for e in ledger.load(spec))
    except ValueError as exc:
        arg, _, msg = str(exc).partition(": ")
        raise UsageError(arg, msg) from None
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a time limit still leaves a CSV
    if args.expect_fail and not args.broad and not (args.op or args.case or args.impl or args.generated):
        from cases.mutants import gpu
        from harness import kills

        rc = kills.run_kill_matrix(reg, dev, prof, seed=args.seed, csv=args.csv, kill_matrix=args.kill_matrix,
                                   junit=args.junit, e2e=args.e2e, e2e_problems=args.e2e_problems, jobs=args.jobs,
                                   quiet=args.quiet)  # the default mutant run: targeted catalogs + timelines
        print(gpu.skip_note())
        return rc
    # torch.compile of the chains runs on every device, but on the CPU machine inductor's C++
    # compiles cost minutes per run, so there it is opt-in: --kind compiled or --impl compiled.
    default = ("reference", "fused", "external") + (() if dev.interpreted else ("compiled",))
    ops, impls = _select_impls(reg, args, default)
    from harness.suite import generated_count

    counts = ", ".join(f"{op} {generated_count(reg.ops[op], prof, interpreted=dev.interpreted, generated=args.generated)}"
                       for op in ops)
    print(f"verify-parity run: device={dev.kind} ({dev.name}, {dev.arch}, fp8 {dev.fp8_format}) profile={prof.name} "
          f"shim={dev.shim or 'off (compiled)'}; generated cases: {counts}; impls: {', '.join(i.key for i in impls)}",
          flush=True)
    if known:
        print(f"ledger: {len(known)} known failures ({', '.join(e.id for e in known)})", flush=True)
    from harness import stages

    table = stages.Table()
    rows = suite.run(reg, dev=dev, profile=prof, ops=ops, impls=impls, seed=args.seed, shard_spec=args.shard,
                     generated=args.generated, progress=not args.quiet, case_filter=args.case, jobs=args.jobs,
                     plugin_specs=_plugin_specs(args), ledger=known, case_timeout_s=args.case_timeout_s,
                     stack_dir=Path(args.csv).parent / "stacks", isolate=bool(args.case_timeout_s),
                     stage_table=table)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the rows are in: a late time limit must not cut the CSV/summary
    path = write_csv(rows, args.csv)
    print(f"rows: {len(rows)} -> {path}")
    if not dev.interpreted:  # nightly reads this line: compile time apart from run time
        print(stages.compile_line(table))
    if args.stage_times:
        print(table.format())
    frame = to_frame(rows)
    if args.junit:
        from reports import junit

        print(f"junit -> {junit.write(frame, args.junit)}")
    if args.expect_fail:  # mutant runs: every implementation must be flagged
        from harness import kills

        return kills.print_kills(frame)
    from harness import summary

    return summary.print_report(frame)


def _check_path(reg, family: str, prepare: str, attn: str, flag: str = "--path") -> None:
    from harness import timeline_suite

    timeline_suite.check_path(reg, family, prepare, attn, flag=flag)


def cmd_timelines(args) -> int:
    """Clean paths (or one path mutant / op implementation / backend plugged in) over named + generated
    timelines (``harness.timeline_suite``)."""
    from harness import timeline_suite

    names = [s for s in args.impl or () if ":" not in s]
    if names:
        raise UsageError("--impl", f"{', '.join(names)}: a timeline runs the implementations --path names "
                                   f"(prepare+attn); --impl only loads module:attr plugins here")
    timeline_suite.path_specs(args)  # --backend and --path-mutant: a bad one is one line before any work
    dev, prof, reg = _setup(args)
    return timeline_suite.run(args, dev, prof, reg, _plugin_specs(args))


def cmd_gpu(rest: list[str]) -> int:
    from harness import gpu_checks

    return gpu_checks.main(rest)


def cmd_bench(rest: list[str]) -> int:
    from harness.bench.__main__ import main

    return main(rest)


def cmd_nightly(rest: list[str]) -> int:
    from harness import nightly

    return nightly.main(rest)


def cmd_warmup(rest: list[str]) -> int:
    from harness import warmup

    return warmup.main(rest)


_DELEGATED = {"gpu": cmd_gpu, "bench": cmd_bench, "nightly": cmd_nightly,
              "warmup": cmd_warmup}  # subcommands with their own parsers


def cmd_repro(args) -> int:
    from harness import repro

    dev, prof, reg = _setup(args)
    return repro.run(reg, dev, prof, args.case_id, args.impl, args.loaded)


def cmd_compile(args) -> int:
    """Built-in kernels (every op, or --op's), or with --impl module:attr the plugin's (Impl.compile_specs)."""
    from harness import compile_check
    from harness.ops import BUILTIN

    try:
        compile_check.prepare()  # before any kernel module, a plugin's included, is imported
    except RuntimeError as exc:
        raise UsageError("TRITON_INTERPRET", str(exc)) from None
    impls = []
    if args.impl:
        from harness.registry import cwd_on_path, default_registry

        cwd_on_path()
        impls = _load_specs(default_registry(with_mutants=False, with_plugins=False), args.impl)
        bare = [i.key for i in impls if i.compile_specs is None]
        if len(bare) == len(impls):
            raise UsageError("--impl", f"{', '.join(args.impl)}: {', '.join(bare) or 'nothing'} loaded, declaring no "
                                       f"Triton kernels to compile (Impl.compile_specs)")
        for key in bare:
            print(f"{key}: declares no Triton kernels (Impl.compile_specs): skipped")
    res = compile_check.run(args.op or ([] if impls else list(BUILTIN)), args.target or list(compile_check.TARGETS),
                            tuple(impls))
    frame = pd.DataFrame([r.__dict__ for r in res])
    with pd.option_context("display.width", 200, "display.max_colwidth", 90, "display.float_format", "{:.2f}".format):
        print(frame.to_string(index=False))
    bad = frame[~frame["ok"]]
    print(f"compiled {int(frame['ok'].sum())}/{len(frame)} kernel variants for {', '.join(args.target or compile_check.TARGETS)}")
    return 0 if bad.empty else 1


def cmd_report(args) -> int:
    from reports.build import build

    b = build(args.csv, args.out, mutants=args.mutants or [], perf=args.perf or [], gate=args.gate or [],
              baseline=args.baseline, baseline_perf=args.baseline_perf, threshold=args.slower,
              killmatrix=args.kill_matrix or [], timelines=args.timelines or [])
    for flag, path, n in b.inputs:
        print(f"read {flag} {path}: {n} rows")
    print(f"report: {b.rows} rows ({b.failed_rows} failing) -> {b.out}/report.html, junit.xml, merged.csv, diff.csv")
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
        from harness.suite import provenance

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

        from harness import timeline_suite

        timeline_suite.load_backend(args.backend)  # a bad spec is one line before any work
        prof = replace(prof, backend=args.backend)
    rows = gate.run(_registry(), dev, prof, layouts=args.layout or gate.M.LAYOUTS,
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

    _check_path(_registry(), args.layout, *args.path)
    args.path, args.models = "+".join(args.path), args.models or e2e_gate.MODEL_DIR
    return server.main(args)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness`` and the ``verify-parity`` console script (pyproject [project.scripts])."""
    from cases import e2e_gate, profiles
    from cases import timelines as tl
    from cases.mutants import timelines as mt
    from harness.e2e import model as M
    from harness.ops import BUILTIN
    from harness.registry import cwd_on_path

    cwd_on_path()  # --impl module:attr finds modules in the current directory from both
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _DELEGATED:
        return _DELEGATED[argv[0]](argv[1:])
    prog = "verify-parity" if Path(sys.argv[0]).name == "verify-parity" else "python -m harness"
    ap = usage.ArgumentParser(prog=prog, description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    jobs_help = "worker processes (default $VP_JOBS or 1); rows keep the plan's order"

    def common(p):
        p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "rocm"))
        p.add_argument("--fp8-format", default=None, choices=("e4m3fn", "e4m3fnuz"), help="CPU only")
        p.add_argument("--impl", action="append",
                       help="implementation name, or module:attr to load one (an Impl, a list or a callable "
                            "returning either), module:attr[name,name] to load only those (repeatable)")

    p = sub.add_parser("list", help="ops, implementations, catalogs, timelines")
    common(p)
    p.set_defaults(fn=cmd_list)
    for name, expect_fail in (("run", False), ("mutants", True)):
        p = sub.add_parser(name, help="parity run" if name == "run" else "run every mutant; each must be flagged")
        common(p)
        p.add_argument("--op", action="append", choices=BUILTIN)
        p.add_argument("--kind", action="append", choices=("reference", "fused", "compiled", "external", "mutant"))
        p.add_argument("--profile", default=None, choices=sorted(profiles.PROFILES), help="default: $VP_PROFILE or ci")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--generated", type=usage.count, default=None,
                       help="override the profile's generated-case count")
        p.add_argument("--shard", type=usage.shard, default=None, metavar="I/N",
                       help="i/n (1 <= i <= n): run the i-th of n deterministic slices")
        p.add_argument("--case", default=None, help="only cases whose id contains this text")
        p.add_argument("--jobs", type=usage.positive_int, default=None, help=jobs_help)
        p.add_argument("--csv", type=usage.output_file, default=f"runs/{name}.csv",
                       help="parity rows" + (" (of the op mutants, also in the kill matrix)" if expect_fail else ""))
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument("--junit", type=usage.output_file, default=None, help="also write JUnit XML here")
        p.add_argument("--ledger", action="append",
                       help="known-failure ledger: NAME (cases/ledgers/NAME.py) or module:attr (repeatable); its "
                            "failures read 'known', a known failure that did not happen fails")
        p.add_argument("--case-timeout-s", type=usage.finite_float(0.0), default=None,
                       help="per-case time limit: past it the case's rows read 'timeout' (failing) with the worker's "
                            "stack in <csv dir>/stacks/, and the run goes on; given, cases run in worker processes "
                            "even with --jobs 1 (a hang in C is killed). Default 120 (interpreter 900); 0: none")
        p.add_argument("--stage-times", action="store_true",
                       help="print the mean wall time per stage (inputs, reference, oracle, impl, reruns, checks, "
                            "rows) per op at the end; VP_STAGE_TIMES=1 syncs the GPU at each stage boundary")
        p.set_defaults(fn=cmd_run, expect_fail=expect_fail)
        if expect_fail:
            p.set_defaults(kind=["mutant"])
            p.add_argument("--kill-matrix", type=usage.output_file, default="runs/kill_matrix.csv",
                           help="where the mutant × (parity, timeline, gate) matrix goes (no selection given)")
            p.add_argument("--e2e", action="store_true",
                           help="add the end-to-end gate column (GPU: under the interpreter it takes hours)")
            p.add_argument("--e2e-problems", type=usage.positive_int, default=None,
                           help="problems per gate run (default 60)")
            p.add_argument("--broad", action="store_true",
                           help="run the whole parity suite over every mutant instead of the kill matrix")
    p = sub.add_parser("timelines", help="store-timing timelines: clean paths vs the logical truth")
    common(p)
    p.add_argument("--family", action="append", choices=sorted(tl.FAMILIES), help="model family (repeatable; "
                                                                                  "default: all)")
    p.add_argument("--timeline", type=ids.timeline_arg, default=None,
                   help=f"one catalog timeline ({', '.join(t.name for t in tl.catalog())}), or a 'timeline:...' id "
                        f"from a FAIL line")
    p.add_argument("--path", action="append", type=ids.timeline_path_arg,
                   help="prepare+attn[+accept] implementation names, e.g. reference+reference (repeatable; default "
                        "fused+fused; accept: the acceptance op's, default the one named like attn, else its "
                        "reference)")
    p.add_argument("--path-mutant", default=None, choices=[m.name for m in mt.PATH_MUTANTS],
                   help="run a path mutant of cases/mutants/timelines.py instead")
    p.add_argument("--backend", action="append", default=None, metavar="MODULE:ATTR",
                   help="a backend the paths run through: a harness.backend.Backend (instance, subclass or "
                        "callable returning one; docs/plugins.md), loaded in the workers too (repeatable: every "
                        "path through each)")
    p.add_argument("--profile", default=None, choices=sorted(profiles.PROFILES), help="default: $VP_PROFILE or ci")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generated", type=usage.count, default=None,
                   help="generated timelines per family (default: profile/10)")
    p.add_argument("--shard", type=usage.shard, default=None, metavar="I/N",
                   help="i/n (1 <= i <= n): run the i-th of n deterministic slices of the timelines")
    p.add_argument("--jobs", type=usage.positive_int, default=None, help=jobs_help)
    p.add_argument("--case-timeout-s", type=usage.finite_float(0.0), default=None,
                   help="per-timeline time limit, as for `run` (its rows read 'timeout'; default 120, interpreter 900)")
    p.add_argument("--csv", type=usage.output_file, default="runs/timelines.csv")
    p.add_argument("--quiet", action="store_true", help="no progress bar (failures and the summary still print)")
    p.set_defaults(fn=cmd_timelines)
    p = sub.add_parser("compile", help="compile every kernel for NVIDIA/AMD targets (no GPU needed)")
    p.add_argument("--op", action="append", choices=BUILTIN)
    p.add_argument("--target", action="append", choices=("sm90", "gfx942", "gfx950"))
    p.add_argument("--impl", action="append", type=_plugin_spec,
                   help="module:attr[name,...]: compile the Triton kernels its implementations declare "
                        "(Impl.compile_specs) instead of the built-in ones (repeatable; with --op: both)")
    p.set_defaults(fn=cmd_compile)
    for name, text in (("gpu", "GPU-only checks: launch counts, CUDA/HIP graph replay, determinism "
                                            "(python -m harness gpu --help)"),
                       ("bench", "benchmarks of every op into PerfRow CSVs (python -m harness bench "
                                                "--help)"),
                       ("nightly", "the whole nightly: parity, timelines, GPU checks, gate, benchmarks, report "
                                   "(python -m harness nightly --help)"),
                       ("warmup", "compile every Triton variant a parity plan launches, up front, in parallel "
                                  "(python -m harness warmup --help)")):
        sub.add_parser(name, help=text)  # listed here; main() hands its arguments to ``fn`` unparsed
    p = sub.add_parser("repro", help="re-run one case and print every check")
    common(p)
    p.add_argument("case_id")
    p.set_defaults(fn=cmd_repro)
    p = sub.add_parser("report", help="merge run CSVs into report.html, junit.xml, merged.csv, diff.csv")
    src = usage.input_file
    p.add_argument("--csv", action="append", type=src, required=True, help="parity CSV (repeatable: shards are merged)")
    p.add_argument("--mutants", action="append", type=src, help="mutants-run CSV for the kill matrix (repeatable)")
    p.add_argument("--perf", action="append", type=src, help="benchmark CSV of reports.rows.PerfRow (repeatable)")
    p.add_argument("--gate", action="append", type=src, help="gate CSV of reports.rows.GateRow (repeatable)")
    p.add_argument("--kill-matrix", action="append", type=src,
                   help="targeted kill-matrix CSV of `harness mutants` (repeatable)")
    p.add_argument("--timelines", action="append", type=src,
                   help="timelines CSV of reports.rows.TimelineRow (repeatable: shards and families are merged)")
    p.add_argument("--baseline", type=src, default=None, help="a previous run's parity CSV; exit 1 on any REGRESS")
    p.add_argument("--baseline-perf", type=src, default=None, help="a previous run's perf CSV (SLOWER rows)")
    p.add_argument("--slower", type=usage.finite_float(0.0), default=0.10,
                   help="perf slowdown threshold: SLOWER when p20 > baseline p80 * (1 + this) (0.10 = 10%%)")
    p.add_argument("--out", type=usage.output_dir, required=True, help="output directory")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("gate", help="end-to-end gate: accuracy, agreement, acceptance, McNemar vs the reference path")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "rocm"))
    p.add_argument("--profile", default=None, choices=sorted(e2e_gate.PROFILES),
                   help="cases/e2e_gate.py (default: cpu-lite on the CPU, else full)")
    p.add_argument("--layout", action="append", choices=M.LAYOUTS, help="micro-model layout (repeatable; default: all)")
    p.add_argument("--models", type=usage.input_dir, default=None,
                   help=f"directory of <layout>.safetensors (default {e2e_gate.MODEL_DIR}; a layout without "
                        f"one runs on random weights)")
    p.add_argument("--problems", type=usage.positive_int, default=None, help="override the profile's problem count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", type=usage.output_file, default="runs/gate.csv")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--jobs", type=usage.positive_int, default=None,
                   help="processes for the generation runs (greedy + one per path and layout); default $VP_JOBS or 1")
    p.add_argument("--backend", default=None, metavar="MODULE:ATTR",
                   help="the backend the profile's paths run through (harness.backend.Backend; the reference "
                        "path keeps the clean one)")
    p.add_argument("--ab", nargs=2, metavar=("URL_A", "URL_B"), help="server A/B mode against two endpoints")
    p.add_argument("--fewshot", type=usage.count, default=2, help="server mode: train-split shots per prompt")
    p.add_argument("--concurrency", type=usage.positive_int, default=4,
                   help="server mode: requests in flight per endpoint")
    p.add_argument("--source", default="synth", choices=("synth", "openai/gsm8k"), help="server mode: problems")
    p.set_defaults(fn=cmd_gate)
    p = sub.add_parser("serve", help="the micro-engine as an OpenAI-compatible HTTP server on loopback")
    p.add_argument("--layout", default="qwen35-gqa", choices=M.LAYOUTS)
    p.add_argument("--models", type=usage.input_dir, default=None,
                   help=f"directory of <layout>.safetensors (default {e2e_gate.MODEL_DIR}; else random weights)")
    p.add_argument("--path", type=ids.path_arg, default=("reference", "reference"),
                   help="prepare+attn implementations (the fused switch; default reference+reference)")
    p.add_argument("--path-mutant", default=None, choices=[m.name for m in mt.PATH_MUTANTS],
                   help="serve a path mutant of cases/mutants/timelines.py")
    p.add_argument("--speculative", action="store_true", help="prompt-lookup speculative decoding (L = 4)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "rocm"))
    p.add_argument("--port", type=usage.port, default=0, help="0: any free port (printed)")
    p.set_defaults(fn=cmd_serve)
    args = ap.parse_args(argv)
    return usage.guarded(sub.choices[args.cmd].prog, _dispatch, args)


def _dispatch(args) -> int:
    if getattr(args, "jobs", 1) is None:
        args.jobs = usage.env_int("VP_JOBS", 1)
    return args.fn(args)
