"""What ``python -m harness mutants`` reports. The default run: the kill matrix (``harness.mutants.killmatrix``:
mutant × parity / timeline / gate checks on the targeted catalogs and timelines), its CSV, the op
mutants' parity rows and the verdict (a surviving mutant or a failing clean row fails the run).
A ``--broad`` run (the whole parity suite over the mutants): which check killed each mutant."""
from __future__ import annotations


import pandas as pd


def run_kill_matrix(reg, dev, prof, *, seed: int, csv, kill_matrix, junit=None, e2e: bool = False,
                    e2e_problems=None, jobs: int = 1, quiet: bool = False) -> int:
    """mutant × (parity, timeline, gate) on targeted catalogs and timelines; clean impls must pass all.
    The op mutants' parity rows go to ``csv`` (``report --mutants``; ``junit`` too when given), the
    matrix to ``kill_matrix``; ``e2e`` adds the end-to-end gate column. Exit status 1 on a survivor
    or a failing clean row."""
    from harness.mutants import killmatrix
    from harness.parity import suite
    from reports.rows import write_csv, write_frame

    prov = suite.provenance(dev, prof, seed)
    parity = []
    progress = None if quiet else lambda m: print(m, flush=True)

    def record(impl, case, res):
        if impl.kind == "mutant":
            parity.extend(suite.rows_for(suite.Planned(reg.ops[impl.op], case), impl, dev, res, prov))

    print("\nkill matrix (targeted parity catalogs + store-timing timelines):", flush=True)
    rows = killmatrix.build(reg, dev, progress=progress, record=record)
    print(f"mutant parity rows: {len(parity)} -> {write_csv(parity, csv)}")
    if junit:
        from reports import junit as junit_xml
        from reports.rows import to_frame

        print(f"junit -> {junit_xml.write(to_frame(parity), junit)}")
    if e2e:
        print("\nkill matrix e2e column (the gate on the micro-models):", flush=True)
        rows = killmatrix.e2e_column(rows, reg, dev, problems=e2e_problems, jobs=jobs, progress=progress)
        for r in rows:
            if r.kind != "clean":
                print(f"e2e {r.e2e:9s} {r.subject}: {r.e2e_detail}")
    path = write_frame(killmatrix.frame(rows), kill_matrix)
    survivors, broken = killmatrix.verdict(rows)
    n_mut = sum(r.kind != "clean" for r in rows)
    print(f"kill matrix -> {path}: {n_mut - len(survivors)}/{n_mut} mutants killed; "
          f"{sum(r.kind == 'clean' for r in rows) - len(broken)}/{sum(r.kind == 'clean' for r in rows)} clean pass")
    for r in survivors:
        print(f"SURVIVED {r.subject}: {r.doc}")
    for r in broken:
        print(f"CLEAN FAILS {r.subject}: {r.first_failure}")
    return 1 if survivors or broken else 0


def print_kills(frame: pd.DataFrame) -> int:
    """A mutant parity run's rows -> per mutant: cases run, cases failed, the checks that flagged it;
    a KILLED line (with a repro) or a SURVIVED line each. Exit status 1 when one survived."""
    from reports.rows import failing

    per = frame.groupby("impl").agg(failed_cases=("status", lambda s: 0), runs=("case", "nunique"))
    failed = frame[failing(frame["status"])].groupby("impl")  # a mutant that hangs (timeout) is flagged too
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
