"""python -m harness <command>: the parser of every command (``main``), then the command's body
(``harness.cli.commands``). A bad argument is one line on stderr and exit status 2 (``harness.usage``),
before any work starts. Nothing heavy is imported here: a command's arguments, whose choices come from the
registry, are added only when that command is parsed, so ``--help`` runs without torch."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import ids, usage
from harness.cli.commands import (
    DELEGATED, cmd_compile, cmd_gate, cmd_list, cmd_repro, cmd_report, cmd_run, cmd_serve, cmd_timelines)
from harness.cli.setup import plugin_spec


DESCRIPTION = """Does each fused kernel of the target-verify path compute exactly what its unfused chain
computes, on every shape and KV timeline? Each command has its own --help. A mistaken argument
is refused in one line (exit status 2) before any work starts, and no results file is touched."""

EXAMPLES = """examples (one per command):
  PROG list                                  ops, implementations, catalog cases, timelines
  PROG run --op qk_norm_rope                 parity of one op: summary table, one repro line per failure
  PROG repro 'qk_norm_rope/dsv4-verify-b8-l3-h16' --impl fused    one case again, every check
  PROG mutants                               every planted bug must be flagged (the kill matrix)
  PROG timelines --family k3-mla-fp8         store-timing timelines against the logical KV truth
  PROG compile                               every kernel compiled for sm90/gfx942/gfx950, no GPU needed
  PROG gpu --out runs/gpu                    GPU only: launch counts, graph replay, full-size determinism
  PROG bench --out runs                      GPU benchmarks: ours vs the chain vs torch.compile vs peers
  PROG warmup --profile nightly              GPU: a plan's kernel variants compiled up front, in parallel
  PROG nightly --out runs/nightly            all of it under a time budget, then the report
  PROG report --csv runs/parity.csv --out runs/report    HTML, JUnit, merged rows (Parquet), baseline-diff CSV
  PROG gate                                  end-to-end gate on micro-models (accuracy, agreement)
  PROG serve --layout qwen35-gqa             the micro-engine as an OpenAI-compatible server
"""


JOBS_HELP = "worker processes (default $VP_JOBS or 1); rows keep the plan's order"
PROFILE_HELP = "default: $VP_PROFILE or ci"


def _common(p) -> None:
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "rocm"))
    p.add_argument("--fp8-format", default=None, choices=("e4m3fn", "e4m3fnuz"), help="CPU only")
    p.add_argument("--impl", action="append",
                   help="implementation name, or module:attr to load one (an Impl, a list or a callable "
                        "returning either), module:attr[name,name] to load only those (repeatable)")


def _list(p) -> None:
    _common(p)
    p.set_defaults(fn=cmd_list)


def _run_or_mutants(p, expect_fail: bool) -> None:
    from cases import profiles
    from harness.ops import BUILTIN

    name = "mutants" if expect_fail else "run"
    _common(p)
    p.add_argument("--op", action="append", choices=BUILTIN)
    p.add_argument("--kind", action="append", choices=("reference", "fused", "compiled", "external", "mutant"))
    p.add_argument("--profile", default=None, choices=sorted(profiles.PROFILES), help=PROFILE_HELP)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generated", type=usage.count, default=None,
                   help="override the profile's generated-case count")
    p.add_argument("--shard", type=usage.shard, default=None, metavar="I/N",
                   help="i/n (1 <= i <= n): run the i-th of n deterministic slices")
    p.add_argument("--case", default=None, help="only cases whose id contains this text")
    p.add_argument("--generated-only", action="store_true",
                   help="only the generated (hypothesis-drawn) cases, none of the named catalog")
    p.add_argument("--jobs", type=usage.positive_int, default=None, help=JOBS_HELP)
    p.add_argument("--csv", type=usage.output_file, default=f"runs/{name}.csv",
                   help="parity rows, CSV (a name ending in .parquet: Parquet)"
                   + (" (of the op mutants, also in the kill matrix)" if expect_fail else ""))
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


def _timelines(p) -> None:
    from cases import profiles
    from cases import timelines as tl
    from cases.mutants import timelines as mt

    _common(p)
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
    p.add_argument("--profile", default=None, choices=sorted(profiles.PROFILES), help=PROFILE_HELP)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generated", type=usage.count, default=None,
                   help="generated timelines per family (default: profile/10)")
    p.add_argument("--shard", type=usage.shard, default=None, metavar="I/N",
                   help="i/n (1 <= i <= n): run the i-th of n deterministic slices of the timelines")
    p.add_argument("--jobs", type=usage.positive_int, default=None, help=JOBS_HELP)
    p.add_argument("--case-timeout-s", type=usage.finite_float(0.0), default=None,
                   help="per-timeline time limit, as for `run` (its rows read 'timeout'; default 120, interpreter 900)")
    p.add_argument("--csv", type=usage.output_file, default="runs/timelines.csv")
    p.add_argument("--quiet", action="store_true", help="no progress bar (failures and the summary still print)")
    p.set_defaults(fn=cmd_timelines)


def _compile(p) -> None:
    from harness.ops import BUILTIN

    p.add_argument("--op", action="append", choices=BUILTIN)
    p.add_argument("--target", action="append", choices=("sm90", "gfx942", "gfx950"))
    p.add_argument("--impl", action="append", type=plugin_spec,
                   help="module:attr[name,...]: compile the Triton kernels its implementations declare "
                        "(Impl.compile_specs) instead of the built-in ones (repeatable; with --op: both)")
    p.set_defaults(fn=cmd_compile)


def _repro(p) -> None:
    _common(p)
    p.add_argument("case_id")
    p.set_defaults(fn=cmd_repro)


def _report(p) -> None:
    src = usage.input_file
    p.add_argument("--csv", action="append", type=src, required=True,
                   help="parity CSV or Parquet file (repeatable: shards are merged)")
    p.add_argument("--mutants", action="append", type=src, help="mutants-run CSV for the kill matrix (repeatable)")
    p.add_argument("--perf", action="append", type=src, help="benchmark CSV of reports.rows.PerfRow (repeatable)")
    p.add_argument("--gate", action="append", type=src, help="gate CSV of reports.rows.GateRow (repeatable)")
    p.add_argument("--kill-matrix", action="append", type=src,
                   help="targeted kill-matrix CSV of `harness mutants` (repeatable)")
    p.add_argument("--timelines", action="append", type=src,
                   help="timelines CSV of reports.rows.TimelineRow (repeatable: shards and families are merged)")
    p.add_argument("--baseline", type=src, default=None,
                   help="a previous run's parity rows (its report's merged.parquet, or a CSV); exit 1 on any REGRESS")
    p.add_argument("--baseline-perf", type=src, default=None, help="a previous run's perf CSV (SLOWER rows)")
    p.add_argument("--slower", type=usage.finite_float(0.0), default=0.10,
                   help="perf slowdown threshold: SLOWER when p20 > baseline p80 * (1 + this) (0.10 = 10%%)")
    p.add_argument("--out", type=usage.output_dir, required=True, help="output directory")
    p.set_defaults(fn=cmd_report)


def _gate(p) -> None:
    from cases import e2e_gate

    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "rocm"))
    p.add_argument("--profile", default=None, choices=sorted(e2e_gate.PROFILES),
                   help="cases/e2e_gate.py (default: cpu-lite on the CPU, else full; sampled, sampled-full: "
                        "temperature > 0, speculative vs plain sampling)")
    p.add_argument("--layout", action="append", choices=e2e_gate.LAYOUTS,
                   help="micro-model layout (repeatable; default: all)")
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


def _serve(p) -> None:
    from cases import e2e_gate
    from cases.mutants import timelines as mt

    p.add_argument("--layout", default="qwen35-gqa", choices=e2e_gate.LAYOUTS)
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


# every command in the order --help lists them: (its line in --help, what adds its arguments; None: a
# delegated command, whose own parser reads the rest of the line). A command's arguments are added only
# when that command is parsed: their choices come from the registry, and --help imports no torch.
COMMANDS = {
    "list": ("ops, implementations, catalogs, timelines", _list),
    "run": ("parity run", lambda p: _run_or_mutants(p, False)),
    "mutants": ("run every mutant; each must be flagged", lambda p: _run_or_mutants(p, True)),
    "timelines": ("store-timing timelines: clean paths vs the logical truth", _timelines),
    "compile": ("compile every kernel for NVIDIA/AMD targets (no GPU needed)", _compile),
    "gpu": ("GPU-only checks: launch counts, CUDA/HIP graph replay, determinism (python -m harness gpu --help)",
            None),
    "bench": ("benchmarks of every op into PerfRow CSVs (python -m harness bench --help)", None),
    "nightly": ("the whole nightly: parity, timelines, GPU checks, gate, benchmarks, report "
                "(python -m harness nightly --help)", None),
    "warmup": ("compile every Triton variant a parity plan launches, up front, in parallel "
               "(python -m harness warmup --help)", None),
    "repro": ("re-run one case and print every check", _repro),
    "report": ("merge run CSVs (or Parquet files) into report.html, junit.xml, merged.parquet, diff.csv", _report),
    "gate": ("end-to-end gate: accuracy, agreement, acceptance, McNemar vs the reference path", _gate),
    "serve": ("the micro-engine as an OpenAI-compatible HTTP server on loopback", _serve),
}


def build_parser(argv: list[str], prog: str = "python -m harness") -> usage.ArgumentParser:
    """The parser of ``argv``: every command listed, the arguments of ``argv[0]``'s only (none for a
    top-level ``--help``, which so imports neither torch nor the registry)."""
    ap = usage.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EXAMPLES.replace("PROG", prog),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, (text, add) in COMMANDS.items():
        p = sub.add_parser(name, help=text)
        if add is not None and argv and argv[0] == name:
            add(p)
    return ap


def main(argv: list[str] | None = None) -> int:
    """``python -m harness`` and the ``verify-parity`` console script (pyproject [project.scripts])."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        from harness.registry import cwd_on_path

        cwd_on_path()  # --impl module:attr finds modules in the current directory from both
        return DELEGATED[argv[0]](argv[1:])
    prog = "verify-parity" if Path(sys.argv[0]).name == "verify-parity" else "python -m harness"
    ap = build_parser(argv, prog)
    args = ap.parse_args(argv)
    from harness.registry import cwd_on_path

    cwd_on_path()
    return usage.guarded(f"{prog} {args.cmd}", _dispatch, args)


def _dispatch(args) -> int:
    if getattr(args, "jobs", 1) is None:
        args.jobs = usage.env_int("VP_JOBS", 1)
    return args.fn(args)
