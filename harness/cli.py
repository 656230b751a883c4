"""python -m harness {list, run, repro, mutants, compile, report} — thin: parse, delegate, print, exit code."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

MAX_REPRO_LINES = 40


def _setup(args):
    from cases import profiles
    from harness import devices
    from harness.registry import default_registry

    dev = devices.select(args.device, fp8_format=getattr(args, "fp8_format", None))
    prof = profiles.current(getattr(args, "profile", None))
    reg = default_registry()
    args.loaded = [i for spec in getattr(args, "impl", None) or () if ":" in spec for i in reg.load_spec(spec)]
    return dev, prof, reg


def _select_impls(reg, args, default_kinds):
    """--impl NAME selects by name; --impl module:attr selects what it loaded; else --kind."""
    names = [s for s in args.impl or () if ":" not in s]
    kinds = tuple(args.kind) if args.kind else default_kinds
    ops = args.op or sorted(reg.ops)
    for op in ops:
        if op not in reg.ops:
            raise SystemExit(f"--op: unknown op {op!r}; known: {sorted(reg.ops)}")
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
        raise SystemExit(f"--impl: unknown implementation(s) {sorted(missing)}; see `python -m harness list`")
    return ops, chosen


def _print_report(frame: pd.DataFrame, out=sys.stdout) -> int:
    from harness.suite import failures, summary

    if frame.empty:
        print("no runs", file=out)
        return 1
    s = summary(frame)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3g}".format):
        print("\n" + s.to_string(index=False), file=out)
    bad = failures(frame).drop_duplicates(["impl", "case"])
    for _, r in bad.head(MAX_REPRO_LINES).iterrows():
        print(f"FAIL {r['impl']} {r['case']} [{r['check']}] {r['detail'] or r['worst']}\n  repro: {r['repro']}", file=out)
    if len(bad) > MAX_REPRO_LINES:
        print(f"... {len(bad) - MAX_REPRO_LINES} more failing (impl, case) pairs in the CSV", file=out)
    return 0 if bad.empty else 1


def cmd_list(args) -> int:
    dev, prof, reg = _setup(args)
    for name, spec in sorted(reg.ops.items()):
        print(f"{name}: {spec.doc}")
        print(f"  catalog: {len(spec.catalog(big=False))} cases (+{len(spec.catalog(big=True)) - len(spec.catalog(big=False))} big); "
              f"generated per run ({prof.name}): {prof.generated}")
        for impl in reg.for_op(name):
            pol = f" fp8_policy={impl.fp8_policy}" if impl.fp8_policy else ""
            print(f"  - {impl.name:36s} {impl.kind:9s}{pol}  {impl.doc}")
    print(f"device: {dev.kind} {dev.name} arch={dev.arch} fp8={dev.fp8_format} shim={dev.shim or '-'}")
    return 0


def cmd_run(args) -> int:
    from harness import suite
    from reports.rows import to_frame, write_csv

    dev, prof, reg = _setup(args)
    # torch.compile of the chains runs on every device, but on the CPU machine inductor's C++
    # compiles cost minutes per run, so there it is opt-in: --kind compiled or --impl compiled.
    default = ("reference", "fused", "external") + (() if dev.interpreted else ("compiled",))
    ops, impls = _select_impls(reg, args, default)
    print(f"verify-parity run: device={dev.kind} ({dev.name}, {dev.arch}, fp8 {dev.fp8_format}) profile={prof.name} "
          f"shim={dev.shim or 'off (compiled)'}; impls: {', '.join(i.key for i in impls)}", flush=True)
    rows = suite.run(reg, dev=dev, profile=prof, ops=ops, impls=impls, seed=args.seed, shard_spec=args.shard,
                     generated=args.generated, progress=not args.quiet, case_filter=args.case)
    path = write_csv(rows, args.csv)
    print(f"rows: {len(rows)} -> {path}")
    frame = to_frame(rows)
    if args.junit:
        from reports import junit

        print(f"junit -> {junit.write(frame, args.junit)}")
    if args.expect_fail:  # mutant runs: every implementation must be flagged
        return _print_kills(frame)
    return _print_report(frame)


def _print_kills(frame: pd.DataFrame) -> int:
    per = frame.groupby("impl").agg(failed_cases=("status", lambda s: 0), runs=("case", "nunique"))
    failed = frame[frame["status"] == "fail"].groupby("impl")
    per["failed_cases"] = failed["case"].nunique()
    per["killed_by"] = failed["check"].agg(lambda c: ",".join(sorted({x.split("@")[0] for x in c})))
    per = per.fillna({"failed_cases": 0, "killed_by": ""})
    print("\n" + per.reset_index().to_string(index=False))
    survivors = per.index[per["failed_cases"] == 0].tolist()
    for name, grp in failed:
        r = grp.iloc[0]
        print(f"KILLED {name}: {r['case']} [{r['check']}]\n  repro: {r['repro']}")
    for s in survivors:
        print(f"SURVIVED {s}: no check flagged it")
    return 1 if survivors else 0


def cmd_repro(args) -> int:
    from cases import base
    from harness import runners
    from harness.suite import Planned, provenance, rows_for
    from reports.rows import to_frame

    dev, prof, reg = _setup(args)
    cid = args.case_id
    if ":" in cid.split("/")[0]:
        op, fields = cid.split(":", 1)
    else:
        op, fields = cid.split("/", 1) if "/" in cid else (cid, "")
    if op not in reg.ops:
        raise SystemExit(f"case id: unknown op {op!r}; known: {sorted(reg.ops)}")
    spec = reg.ops[op]
    if ":" in cid.split("/")[0]:
        case = base.parse_case(spec.case_type, fields)
    else:
        named = {c.name: c for c in spec.catalog(big=True)}
        if fields not in named:
            raise SystemExit(f"case id: no catalog case {fields!r} in {op}; known: {sorted(named)}")
        case = named[fields]
    chosen = [(n, reg.impls.get(f"{op}/{n}")) for n in args.impl or ["fused"] if ":" not in n]
    chosen += [(i.name, i) for i in args.loaded if i.op == op]
    rows = []
    for name, impl in chosen:
        if impl is None:
            raise SystemExit(f"--impl: unknown implementation {name!r} for {op}")
        res = runners.run_case(spec, impl, case, dev)
        rows += rows_for(Planned(spec, case), impl, dev, res, provenance(dev, prof, 0))
    frame = to_frame(rows)
    cols = ["impl", "check", "status", "err", "ref_err", "allowed", "max_abs", "mismatch_frac", "worst", "detail"]
    with pd.option_context("display.width", 250, "display.max_colwidth", 120, "display.float_format", "{:.4g}".format):
        print(frame[cols].to_string(index=False))
    return 0 if (frame["status"] != "fail").all() else 1


def cmd_compile(args) -> int:
    from harness import compile_check
    from harness.ops import BUILTIN

    res = compile_check.run(args.op or list(BUILTIN), args.target or list(compile_check.TARGETS))
    frame = pd.DataFrame([r.__dict__ for r in res])
    with pd.option_context("display.width", 200, "display.max_colwidth", 90, "display.float_format", "{:.2f}".format):
        print(frame.to_string(index=False))
    bad = frame[~frame["ok"]]
    print(f"compiled {int(frame['ok'].sum())}/{len(frame)} kernel variants for {', '.join(args.target or compile_check.TARGETS)}")
    return 0 if bad.empty else 1


def cmd_report(args) -> int:
    from reports.build import build

    b = build(args.csv, args.out, mutants=args.mutants or [], perf=args.perf or [], gate=args.gate or [],
              baseline=args.baseline, baseline_perf=args.baseline_perf, threshold=args.slower)
    print(f"report: {b.rows} rows ({b.failed_rows} failing) -> {b.out}/report.html, junit.xml, merged.csv, diff.csv")
    if args.baseline:
        print(f"baseline diff vs {args.baseline}: {b.diff_rows} changed rows, {b.regress} REGRESS")
    return 1 if b.regress else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "rocm"))
        p.add_argument("--fp8-format", default=None, choices=("e4m3fn", "e4m3fnuz"), help="CPU only")
        p.add_argument("--impl", action="append", help="implementation name, or module:attr to load one (repeatable)")

    p = sub.add_parser("list", help="ops, implementations, catalogs")
    common(p)
    p.set_defaults(fn=cmd_list)
    for name, expect_fail in (("run", False), ("mutants", True)):
        p = sub.add_parser(name, help="parity run" if name == "run" else "run every mutant; each must be flagged")
        common(p)
        p.add_argument("--op", action="append")
        p.add_argument("--kind", action="append", choices=("reference", "fused", "compiled", "external", "mutant"))
        p.add_argument("--profile", default=None, help="ci | nightly | dev (default: $VP_PROFILE or ci)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--generated", type=int, default=None, help="override the profile's generated-case count")
        p.add_argument("--shard", default=None, help="i/n: run the i-th of n deterministic slices")
        p.add_argument("--case", default=None, help="only cases whose id contains this text")
        p.add_argument("--csv", default=f"runs/{name}.csv")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument("--junit", default=None, help="also write JUnit XML here")
        p.set_defaults(fn=cmd_run, expect_fail=expect_fail)
        if expect_fail:
            p.set_defaults(kind=["mutant"])
    p = sub.add_parser("compile", help="compile every kernel for NVIDIA/AMD targets (no GPU needed)")
    p.add_argument("--op", action="append")
    p.add_argument("--target", action="append", choices=("sm90", "gfx942", "gfx950"))
    p.set_defaults(fn=cmd_compile)
    p = sub.add_parser("repro", help="re-run one case and print every check")
    common(p)
    p.add_argument("case_id")
    p.set_defaults(fn=cmd_repro)
    p = sub.add_parser("report", help="merge run CSVs into report.html, junit.xml, merged.csv, diff.csv")
    p.add_argument("--csv", action="append", required=True, help="parity CSV (repeatable: shards are merged)")
    p.add_argument("--mutants", action="append", help="mutants-run CSV for the kill matrix (repeatable)")
    p.add_argument("--perf", action="append", help="benchmark CSV of reports.rows.PerfRow (repeatable)")
    p.add_argument("--gate", action="append", help="gate CSV of reports.rows.GateRow (repeatable)")
    p.add_argument("--baseline", default=None, help="a previous run's parity CSV; exit 1 on any REGRESS")
    p.add_argument("--baseline-perf", default=None, help="a previous run's perf CSV (SLOWER rows)")
    p.add_argument("--slower", type=float, default=0.10, help="perf slowdown threshold (0.10 = 10%%)")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(fn=cmd_report)
    args = ap.parse_args(argv)
    return args.fn(args)
