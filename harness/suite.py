"""A parity run: plan (op × implementation × case), run with progress, rows, summary.

Cases per op: the whole catalog (``big`` entries only in profiles that ask for them) plus
``profile.generated`` hypothesis-drawn cases, deterministic for ``seed``.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

import pandas as pd
from tqdm import tqdm

from cases import base
from cases.profiles import Profile
from harness import devices, runners
from harness.devices import Device
from harness.ledger import verdicts as ledger_verdicts
from harness.registry import Impl, OpSpec, Registry
from reports.rows import ParityRow, Provenance, git_sha


@dataclass(frozen=True)
class Planned:
    spec: OpSpec
    case: object

    @property
    def display(self) -> str:
        return base.display_id(self.spec.name, self.case)

    @property
    def full_id(self) -> str:
        return base.case_id(self.spec.name, self.case)


def generated_count(spec: OpSpec, profile: Profile, *, interpreted: bool, generated: int | None = None) -> int:
    """``generated`` when given; else the profile's count, capped by the op under the interpreter."""
    if generated is not None:
        return generated
    if interpreted and spec.interpreter_generated is not None:
        return min(profile.generated, spec.interpreter_generated)
    return profile.generated


def plan_cases(spec: OpSpec, profile: Profile, *, seed: int = 0, generated: int | None = None,
               interpreted: bool = False) -> list[Planned]:
    cat = spec.catalog(big=profile.big)
    n = generated_count(spec, profile, interpreted=interpreted, generated=generated)
    gen = base.draw(spec.strategy(), n, rng_seed=seed) if n else []
    return [Planned(spec, c) for c in cat + gen]


def shard(items: list, spec: str | None) -> list:
    """``i/n``: the deterministic i-th of n slices (round robin), 1-based."""
    if not spec:
        return items
    i, n = (int(x) for x in spec.split("/"))
    if not 1 <= i <= n:
        raise ValueError(f"--shard: expected i/n with 1 <= i <= n, got {spec!r}")
    return items[i - 1::n]


def provenance(dev: Device, profile: Profile, seed: int) -> Provenance:
    v = devices.versions()
    return Provenance(git_sha=git_sha(), device=f"{dev.kind}:{dev.name}", arch=dev.arch, fp8_format=dev.fp8_format,
                      torch=v["torch"], triton=v["triton"], shim=dev.shim, profile=profile.name, seed=seed)


def repro_line(p: Planned, impl: Impl, dev: Device) -> str:
    """The command that reruns one (case, implementation) as printed, in a fresh process: a plugin
    loaded by ``--impl module:attr`` is loaded again (``Impl.impl_arg``), from the current directory too."""
    return f"python -m harness repro '{p.full_id}' --impl {shlex.quote(impl.impl_arg)} --device {dev.kind}"


def rows_for(p: Planned, impl: Impl, dev: Device, res: runners.CaseResult, prov: Provenance,
             ledger: tuple = ()) -> list[ParityRow]:
    """The rows of one (implementation, case) run. With a ``ledger`` (harness.ledger), failing checks an
    entry explains are ``known``, and an entry covering the case whose checks all passed adds a failing
    ``ledger:<id>`` row (the known failure did not happen)."""
    common = dict(op=p.spec.name, impl=impl.name, kind=impl.kind, case=p.display, fp8_policy=impl.fp8_policy,
                  precision=impl.precision, repro=repro_line(p, impl, dev), seconds=res.seconds, **prov.__dict__)
    if res.refused:
        return [ParityRow(check="can_handle", status="refused", err=float("nan"), ref_err=float("nan"),
                          allowed=float("nan"), max_abs=float("nan"), max_rel=float("nan"), mismatch_frac=float("nan"),
                          nan_inf_mismatch=0, worst="", detail=res.refused, known="", **common)]
    known, silent = ledger_verdicts(ledger, p.spec.name, impl.name, p.case,
                                    [r.check for r in res.records if not r.passed])
    rows = [ParityRow(check=r.check, status="pass" if r.passed else "known" if r.check in known else "fail",
                      err=r.err, ref_err=r.ref_err, allowed=r.allowed, max_abs=r.max_abs, max_rel=r.max_rel,
                      mismatch_frac=r.mismatch_frac, nan_inf_mismatch=r.nan_inf_mismatch, worst=r.worst,
                      detail=r.detail, known=known.get(r.check, ""), **common)
            for r in res.records]
    nan = float("nan")
    rows += [ParityRow(check=f"ledger:{e.id}", status="fail", err=nan, ref_err=nan, allowed=nan, max_abs=nan,
                       max_rel=nan, mismatch_frac=nan, nan_inf_mismatch=0, worst="",
                       detail=f"known failure did not happen (none of {', '.join(e.checks)} failed): fixed? narrow "
                              f"or remove the entry. Cause: {e.cause}. Upstream: {e.upstream}", known=e.id, **common)
             for e in silent]
    return rows


_WORKER: tuple | None = None


def _worker_init(device_kind: str, fp8_format: str, plugin_specs: tuple[str, ...]) -> None:
    global _WORKER
    import torch

    from harness.registry import cwd_on_path, default_registry

    # One intra-op thread per worker: the jobs already fill the cores. With torch's default (one thread
    # per core in every worker) 4 workers on the 16-core H200 host ran the harness's CPU-side comparisons
    # 16x slower (qk_norm_rope generated cases: 10.2 s a case against 0.62 s with one thread), and the
    # nightly's concurrent steps made it worse (docs/nightly.md)
    torch.set_num_threads(1)
    cwd_on_path()
    dev = devices.select(device_kind, fp8_format=fp8_format if device_kind == "cpu" else None)
    _WORKER = (dev, default_registry(extra=plugin_specs))


def worker_state() -> tuple:
    """(device, registry) of this process: set in spawned workers by ``spawn_map``, or by the
    caller (``set_worker_state``) when the same task function runs in-process."""
    return _WORKER


def set_worker_state(dev: Device, reg: Registry) -> None:
    global _WORKER
    _WORKER = (dev, reg)


def spawn_map(fn, tasks: list, jobs: int, dev: Device, plugin_specs: tuple[str, ...] = ()):
    """``fn(task)`` for every task, in order, in ``jobs`` spawned processes, each with its own
    device and registry (built-ins, mutants, entry points, ``plugin_specs``; ``worker_state()``).
    Ctrl-C or SIGTERM cancels what has not started. Each worker gets one OpenBLAS thread (the
    jobs already fill the cores; the interpreter's ``tl.dot`` products are tiny: with the default
    thread count a worker burnt 1.6x the CPU time for the same wall time on the 2-core machine)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    blas = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # inherited by the spawned workers (read when numpy loads)
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                                 initargs=(dev.kind, dev.fp8_format, plugin_specs)) as ex:
            try:
                yield from ex.map(fn, tasks, chunksize=1)
            except BaseException:
                ex.shutdown(wait=False, cancel_futures=True)
                raise
    finally:
        if blas is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = blas


def _worker_run(task) -> list[runners.CaseResult]:
    op, impl_keys, case = task
    dev, reg = _WORKER
    return runners.run_impls(reg.ops[op], [reg.impls[k] for k in impl_keys], case, dev)


def _results(work, dev: Device, jobs: int, plugin_specs: tuple[str, ...]):
    """(planned, impl, CaseResult) in plan order. The implementations of one case run together
    (``runners.run_impls``: inputs, reference and oracle once per case); ``jobs`` > 1 runs cases
    in spawned processes, each rebuilding the registry (built-ins, mutants, entry points,
    ``plugin_specs``)."""
    groups: list[tuple] = []  # (planned, [impl, ...]) in plan order
    for p, impl in work:
        if groups and groups[-1][0] is p:
            groups[-1][1].append(impl)
        else:
            groups.append((p, [impl]))
    if jobs <= 1:
        results = (runners.run_impls(p.spec, impls, p.case, dev) for p, impls in groups)
    else:
        tasks = [(p.spec.name, [i.key for i in impls], p.case) for p, impls in groups]
        results = spawn_map(_worker_run, tasks, jobs, dev, plugin_specs)
    for (p, impls), res in zip(groups, results):
        yield from ((p, impl, r) for impl, r in zip(impls, res))


def run(reg: Registry, *, dev: Device, profile: Profile, ops: list[str], impls: list[Impl], seed: int = 0,
        shard_spec: str | None = None, generated: int | None = None, progress: bool = True,
        case_filter: str | None = None, jobs: int = 1, plugin_specs: tuple[str, ...] = (),
        ledger: tuple = ()) -> list[ParityRow]:
    prov = provenance(dev, profile, seed)
    work = []
    for op in ops:
        spec = reg.ops[op]
        planned = shard(plan_cases(spec, profile, seed=seed, generated=generated, interpreted=dev.interpreted),
                        shard_spec)
        if case_filter:
            planned = [p for p in planned if case_filter in p.display or case_filter in p.full_id]
        work += [(p, i) for p in planned for i in impls if i.op == op]
    rows: list[ParityRow] = []
    bar = tqdm(total=len(work), desc="parity", unit="run", disable=not progress, file=sys.stderr, dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 15.0)
    n_fail = 0
    done = 0
    try:
        for p, impl, res in _results(work, dev, jobs, plugin_specs):
            bar.update(1)
            new = rows_for(p, impl, dev, res, prov, ledger)
            n_fail += any(r.status == "fail" for r in new)
            bar.set_postfix_str(f"{impl.name} fail={n_fail}")
            rows += new
            done += 1
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (a CI time limit): keep what ran, say so
        print(f"\ninterrupted: {done} of {len(work)} runs done; rows so far are kept", file=sys.stderr)
    return rows


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (op, impl): cases, cases passing every check, failing, refused; worst err/allowed; the
    implementation's fp8_policy and precision class as its rows state them."""
    if frame.empty:
        return frame
    keys = ["op", "impl", "kind", "case"]
    f = frame.assign(failed=frame["status"] == "fail", refused=frame["status"] == "refused",
                     known=frame["status"] == "known", ratio=frame["err"] / frame["allowed"])
    per_case = f.groupby(keys).agg(failed=("failed", "any"), refused=("refused", "all"), known=("known", "any"),
                                   ratio=("ratio", "max"), seconds=("seconds", "first"))
    per_case["known"] &= ~per_case["failed"]  # a case with a failure the ledger does not explain counts as failed
    out = per_case.groupby(keys[:3]).agg(
        cases=("failed", "size"), passed=("failed", lambda x: int((~x).sum())), failed=("failed", "sum"),
        known=("known", "sum"), refused=("refused", "sum"), worst_err_over_allowed=("ratio", "max"),
        seconds=("seconds", "sum"))
    out["passed"] -= out["refused"] + out["known"]
    out = out.reset_index()
    if "fp8_policy" in frame:  # each implementation's fp8 overflow policy, as its rows state it
        pol = frame.groupby(keys[:3])["fp8_policy"].agg(lambda p: ",".join(sorted({str(x) for x in p if x == x})))
        out.insert(3, "fp8_policy", out.set_index(keys[:3]).index.map(pol).fillna(""))
    if "precision" in frame:  # each implementation's declared precision class (harness.tolerance), beside it
        prec = frame.groupby(keys[:3])["precision"].agg(lambda p: ",".join(sorted({str(x) for x in p if x == x})))
        out.insert(4 if "fp8_policy" in out else 3, "precision", out.set_index(keys[:3]).index.map(prec).fillna(""))
    return out


def failures(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "fail"]
