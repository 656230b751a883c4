"""The mutant kill matrix: every mutant × check family (parity, timeline, gate), and the same
targeted runs for the clean implementations, which must pass all of them.

  parity    the op suite (``harness.parity.runners.run_case``: the first run and the poisoned-allocator
            run, which sees scratch read before it is written) on a fixed targeted catalog subset
            per op (``OpSpec.kill``); for a path mutant, the registered
            kernels it runs — which are clean, so parity is *expected* to let it through;
  timeline  ``harness.timelines.runner`` checks (prepare, visible_kv, attn, state) on the op's targeted
            timelines, the op implementation plugged into each family's clean fused path; a path
            mutant runs its own families;
  gate      the dispatch decisions the timeline runner observed (``gate:*`` records);
  e2e       (``--e2e``, GPU) the end-to-end gate on the micro-models: killed, invisible (the gate
            passes it), or n/a (no micro-model runs it) — ``e2e_column``.
A mutant is killed when any family flags it; a run stops a mutant's timelines at the first
kill (the matrix needs which families catch it, not how often). Exit status: non-zero when a
mutant survives or a clean implementation fails anything.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace


from cases import timelines as tl
from cases.mutants import timelines as mt
from harness.parity import runners
from harness.timelines import runner as timeline
from harness.timelines import path as path_mod
from harness.registry import Impl, Registry



@dataclass(frozen=True)
class KillRow:
    subject: str  # op/impl or path mutant name
    kind: str  # mutant | path-mutant | clean
    parity: str  # killed | passed | refused (no targeted case ran) | "-"
    timeline: str
    gate: str
    parity_checks: str
    timeline_checks: str
    gate_checks: str
    first_failure: str
    seconds: float
    doc: str
    e2e: str = "not run"  # killed | invisible (the gate passes it) | n/a (no micro-model runs it) | not run
    e2e_detail: str = ""

    @property
    def killed(self) -> bool:
        return "killed" in (self.parity, self.timeline, self.gate, self.e2e)


def _catalog(spec, names):
    named = {c.name: c for c in spec.catalog(big=True)}
    return [named[n] for n in names]


def _parity(reg: Registry, impl: Impl, dev, record=None) -> tuple[str, set, str]:
    spec = reg.ops[impl.op]
    bad, ran, first = set(), 0, ""
    for case in _catalog(spec, spec.kill.cases if spec.kill else ()):
        res = runners.run_case(spec, impl, case, dev, determinism=False, poisoned=False, poisoned_alloc=True)
        if record:
            record(impl, case, res)
        if res.refused:
            continue
        ran += 1
        for r in res.records:
            if not r.passed:
                bad.add(r.check)
                first = first or f"parity {impl.key} {case.name} [{r.check}] {r.detail or r.worst}"[:240]
    if not ran:
        return "refused", bad, first
    return ("killed" if bad else "passed"), bad, first


def _timelines(paths_and_timelines, dev, *, stop_at_kill: bool) -> tuple[str, str, set, set, str]:
    tl_bad, gate_bad, first = set(), set(), ""
    for path, t in paths_and_timelines:
        recs = timeline.run_timeline(path, t, dev.torch_device, dev.fp8_dtype, stop_on_failure=stop_at_kill)
        for s in path_mod.failures(recs):
            (gate_bad if s.family == "gate" else tl_bad).add(s.record.check.split(":r")[0])
            first = first or (f"timeline {path.name} {t.name or t.steps} step {s.step} ({s.mode}) layer {s.layer} "
                              f"[{s.record.check}] {s.record.detail or s.record.worst}")[:240]
        if stop_at_kill and (tl_bad or gate_bad):
            break
    state = lambda b: "killed" if b else "passed"  # noqa: E731
    return state(tl_bad), state(gate_bad), tl_bad, gate_bad, first


def _op_paths(reg: Registry, impl: Impl):
    named = {t.name: t for t in tl.catalog()}
    spec = reg.ops[impl.op]
    slot = {"attn": "attn", "accept": "accept", "tree-accept": "accept"}.get(spec.role, "prepare")
    for tname in spec.kill.timelines if spec.kill else ():
        t = named[tname]
        path = path_mod.clean_path(reg, t.family)
        yield replace(path, name=f"{t.family}:{impl.key}", **{slot: impl}), t


def _row(subject, kind, par, tls, secs, doc) -> KillRow:
    p_state, p_bad, p_first = par
    t_state, g_state, t_bad, g_bad, t_first = tls
    return KillRow(subject, kind, p_state, t_state, g_state, ",".join(sorted(p_bad)), ",".join(sorted(t_bad)),
                   ",".join(sorted(g_bad)), p_first or t_first, round(secs, 1), doc)


def build(reg: Registry, dev, *, only: str | None = None, progress=print, record=None) -> list[KillRow]:
    """The matrix rows, clean implementations first. ``record(impl, case, result)``, when given, sees
    every parity run (``harness.parity.runners.CaseResult``), e.g. to write them as parity rows."""
    rows = []
    named = {t.name: t for t in tl.catalog()}
    subjects = []
    for spec in reg.ops.values():  # OpSpec.kill.clean: the implementations that must pass everything
        subjects += [("clean", reg.impls[f"{spec.name}/{n}"]) for n in (spec.kill.clean if spec.kill else ())]
    subjects += [("mutant", i) for i in reg.impls.values() if i.kind == "mutant"]
    subjects += [("path-mutant", m) for m in mt.PATH_MUTANTS]
    if progress and not only:  # cases/mutants/gpu/: flagged only by harness.gpu.checks, never judged here
        from harness.gpu import mutants as gpu

        progress(f"skipped  {gpu.skip_note()}")
    for kind, subj in subjects:
        name = subj.key if isinstance(subj, Impl) else subj.name
        if only and only not in name:
            continue
        t0 = time.perf_counter()
        if kind == "path-mutant":
            par_bad, par_first, states = set(), "", []
            for key in subj.kernels(reg):  # the kernels it runs, on their own targeted catalogs
                s, bad, first = _parity(reg, reg.impls[key], dev, record)
                states.append(s)
                par_bad |= bad
                par_first = par_first or first
            par = ("killed" if par_bad else "passed", par_bad, par_first)
            pairs = [(subj.path(reg, f), named[f"{f}/{mt.PATH_TIMELINE}"]) for f in subj.families]
            tls = _timelines(pairs, dev, stop_at_kill=True)
        else:
            par = _parity(reg, subj, dev, record)
            tls = _timelines(list(_op_paths(reg, subj)), dev, stop_at_kill=kind == "mutant")
        row = _row(name, kind, par, tls, time.perf_counter() - t0, subj.doc)
        rows.append(row)
        if progress:
            verdict = ("KILLED" if row.killed else "SURVIVED") if kind != "clean" else ("FAIL" if row.killed else "ok")
            progress(f"{verdict:8s} {name:55s} parity={row.parity:7s} timeline={row.timeline:7s} "
                     f"gate={row.gate:7s} {row.seconds:6.1f}s")
    return rows


def e2e_column(rows: list[KillRow], reg: Registry, dev, *, problems: int | None = None, jobs: int = 1,
               progress=print, profile=None, layouts=None) -> list[KillRow]:
    """The end-to-end column: every mutant through the gate (``cases.e2e_gate`` profile
    ``killmatrix``) on each micro-model layout whose path runs it, against the reference path on
    the same problems. ``killed`` when on some layout its speculative output departs from the
    reference greedy output (agreement, near-ties excused) or McNemar finds it worse; ``invisible``
    when no layout shows either, ``n/a`` when no
    layout runs it. Meant for a GPU: under the interpreter a fused path costs tens of seconds per
    problem."""
    from dataclasses import replace

    from cases import e2e_gate
    from harness.e2e import gate

    impl_keys = tuple(r.subject for r in rows if r.kind == "mutant")
    path_names = tuple(r.subject for r in rows if r.kind == "path-mutant")
    prof = replace(profile or e2e_gate.PROFILES["killmatrix"], impl_mutants=impl_keys, path_mutants=path_names)
    gate_rows = gate.run(reg, dev, prof, layouts=layouts or e2e_gate.LAYOUTS, problems=problems, jobs=jobs,
                         progress=progress)
    by: dict[str, list] = {}
    for g in gate_rows:
        by.setdefault(g.path, []).append(g)
    out = []
    for r in rows:
        if r.kind == "clean":
            out.append(r)
            continue
        got = by.get(r.subject, [])
        if not got:
            out.append(replace(r, e2e="n/a", e2e_detail="no micro-model layout runs it"))
            continue
        th = prof.thresholds  # relative to the reference path only: the model's own accuracy is not the mutant's
        failed = [g for g in got if g.exact_agreement + g.tie_divergences / g.problems < th.min_agreement
                  or (g.p_value < th.alpha and g.worse > g.better)]
        detail = "; ".join(f"{g.layout}: acc {g.accuracy:.3f} vs {g.ref_accuracy:.3f}, agree {g.exact_agreement:.3f}, "
                           f"p {g.p_value:.2g}" for g in got)
        out.append(replace(r, e2e="killed" if failed else "invisible", e2e_detail=detail[:400]))
    return out


def verdict(rows: list[KillRow]) -> tuple[list[KillRow], list[KillRow]]:
    """(survivors, failing clean implementations)."""
    return ([r for r in rows if r.kind != "clean" and not r.killed],
            [r for r in rows if r.kind == "clean" and r.killed])


def frame(rows: list[KillRow]):
    import pandas as pd

    return pd.DataFrame([r.__dict__ for r in rows])


