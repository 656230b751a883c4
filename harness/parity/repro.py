"""``python -m harness repro CASE_ID``: one case (a FAIL line's id, ``harness.ids.parse_case_id``)
run through the named implementations with every check, one table row per check."""
from __future__ import annotations

import pandas as pd

from cases import base
from harness.ids import parse_case_id
from harness.usage import UsageError


def run(reg, dev, prof, case_id: str, impl_names, loaded) -> int:
    """``impl_names``: names of the op's implementations (default ``fused``; ``module:attr`` specs are
    skipped: ``loaded``, what they registered, is run instead). Exit status 1 when a check failed."""
    from harness.parity import runners
    from harness.parity.suite import Planned, provenance, rows_for
    from reports.rows import to_frame

    spec, case = parse_case_id(reg, case_id)
    op = spec.name
    full = base.display_id(op, case)
    # the case as run, every axis spelled out: a partial id ran unstated defaults without saying so
    print(f"case: {full}" + ("" if full == case_id else f"  (from {case_id!r}: the axes it leaves out take their defaults)"))
    chosen = [(n, reg.impls.get(f"{op}/{n}")) for n in impl_names or ["fused"] if ":" not in n]
    chosen += [(i.name, i) for i in loaded if i.op == op]
    if not chosen:
        raise UsageError("--impl", f"{', '.join(impl_names)} provides no implementation of {op}")
    for name, impl in chosen:
        if impl is None:
            raise UsageError("--impl", f"unknown implementation {name!r} for {op}; "
                                       f"known: {', '.join(i.name for i in reg.for_op(op))}")
    rows = []
    for name, impl in chosen:
        res = runners.run_case(spec, impl, case, dev)
        rows += rows_for(Planned(spec, case), impl, dev, res, provenance(dev, prof, 0))
    frame = to_frame(rows)
    cols = ["impl", "check", "status", "err", "ref_err", "allowed", "max_abs", "mismatch_frac", "worst", "detail"]
    with pd.option_context("display.width", 250, "display.max_colwidth", 120, "display.float_format", "{:.4g}".format):
        print(frame[cols].to_string(index=False))
    return 0 if (frame["status"] != "fail").all() else 1
