"""Every op benchmark in one run: ``python -m harness.bench --out DIR [--quick] [--op OP ...]``.

Runs every op with a benchmark (``OpSpec.bench``; or the ``--op`` ones) on the GPU, prints
progress, a summary of speedups per (op, impl, mode) and the table of ours per shape
(``perf.table``: graph-replayed and eager us, x vs the reference chain, torch.compile, the op's
other baselines and external impls, % of copy; 'missing' where not measured), and writes
DIR/perf.csv (one ``reports.rows.PerfRow`` per (op, impl, shape, mode): eager p20/p50/p80, or the
graph-replayed median, ratios to the reference chain and to torch.compile of it in the same mode,
achieved bandwidth against the copy bandwidth measured in the run, launches), DIR/table.csv, and
each op's own wide CSV in DIR/<op>/. ``--quick`` is the small set (well under 3 minutes on an H200);
the default is the nightly's full set. Exit 1 when a fused kernel makes another number of
launches than it must. Without a GPU: says that nothing was measured, writes nothing, exits 0.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from harness import usage
from harness.ops import builtin_specs

# op name -> the name of its benchmark module (OpSpec.bench), in harness.ops.BUILTIN order; imported when it runs
# (they import torch: --help does not)
OPS = {name: spec.bench for name, spec in builtin_specs().items() if spec.bench}


def parser() -> argparse.ArgumentParser:
    ap = usage.ArgumentParser(prog="python -m harness.bench", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=lambda s: Path(usage.output_dir(s)), required=True,
                    help="directory for perf.csv and <op>/ CSVs")
    ap.add_argument("--quick", action="store_true", help="the small shape set of every op")
    ap.add_argument("--op", action="append", choices=sorted(OPS), help="only this op (repeatable; default: all)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from harness.bench import perf  # here, after parsing: --help imports no torch

    mods = [importlib.import_module(OPS[name]) for name in dict.fromkeys(args.op or OPS)]
    return perf.run_ops(mods, out=args.out, quick=args.quick, nested=True)


if __name__ == "__main__":
    sys.exit(main())
