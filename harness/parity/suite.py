"""A parity run: plan (op × implementation × case), run with progress, rows (their summary: ``reports.summary``).

Cases per op: the whole catalog (``big`` entries only in profiles that ask for them) plus
``profile.generated`` hypothesis-drawn cases, deterministic for ``seed``.
"""
from __future__ import annotations

import hashlib
import shlex
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm

from cases import base
from cases.profiles import Profile, generated_count
from harness import compare, devices, pool
from harness.parity import runners
from harness.parity import stages
from harness.devices import Device
from harness.ledger import verdicts as ledger_verdicts
from harness.registry import Impl, OpSpec, Registry, nan_policy_of
from reports.rows import FAILING, ParityRow, Provenance, git_sha, parity_row


class NothingSelected(ValueError):
    """The run's selection matches no (implementation, case) pair: a mistake, refused before any work."""


@dataclass
class Tally:
    """How far a run got: ``done`` of ``total`` (implementation, case) runs, ``interrupted`` when Ctrl-C
    or SIGTERM cut it short (its rows are those of the runs that completed)."""
    done: int = 0
    total: int = 0
    interrupted: bool = False


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


def plan_cases(spec: OpSpec, profile: Profile, *, seed: int = 0, generated: int | None = None,
               interpreted: bool = False, named: bool = True) -> list[Planned]:
    """The op's named catalog (none with ``named=False``), then its generated cases for ``seed``."""
    cat = spec.catalog(big=profile.big) if named else []
    n = generated_count(spec, profile, interpreted=interpreted, generated=generated)
    gen = base.draw(spec.strategy(), n, rng_seed=seed) if n else []
    return [Planned(spec, c) for c in cat + gen]


def coverage(rows: list, reg: Registry, *, ops: list[str], profile: Profile, dev: Device,
             generated: int | None = None) -> list[str]:
    """What a run's rows covered, and what the larger profiles and the nightly add (the lines ``run``
    ends with): ops, implementations, cases (catalog + generated) and checks that ran; per larger
    profile (``cases.profiles.PROFILES``, by generated count) the cases it would add to these ops on
    this device (generated, and GPU-sized catalog entries), and what runs only in the nightly."""
    from cases.profiles import PROFILES

    cases = {(r.op, r.case) for r in rows}
    impls = sorted({(r.op, r.impl) for r in rows})
    kinds = sorted({r.kind for r in rows})
    n_cat = sum(len(reg.ops[op].catalog(big=profile.big)) for op in ops)
    n_gen = sum(generated_count(reg.ops[op], profile, interpreted=dev.interpreted, generated=generated) for op in ops)
    where = f"{dev.kind} ({'Triton interpreter' if dev.interpreted else dev.name})"
    n_ops = len({op for op, _ in cases})
    out = [(f"covered: {n_ops} op{'s' * (n_ops != 1)}, {len(impls)} implementation{'s' * (len(impls) != 1)} "
            f"({', '.join(kinds)}), "
            f"{len(cases):,} cases of a plan of {n_cat:,} catalog + {n_gen:,} generated, {len(rows):,} checks; "
            f"profile {profile.name} on {where}")]
    for p in sorted(PROFILES.values(), key=lambda p: p.generated):
        if p.generated <= profile.generated and p.big <= profile.big:
            continue
        gen = sum(max(0, generated_count(reg.ops[op], p, interpreted=dev.interpreted) -
                      generated_count(reg.ops[op], profile, interpreted=dev.interpreted, generated=generated))
                  for op in ops)
        big = sum(len(reg.ops[op].catalog(big=True)) - len(reg.ops[op].catalog(big=False))
                  for op in ops) if p.big and not profile.big else 0
        on_gpu = sum(len(reg.ops[op].catalog(big=p.big)) + generated_count(reg.ops[op], p, interpreted=False)
                     for op in ops)
        out.append(f"--profile {p.name} adds {gen:,} generated cases" + (f" and {big} GPU-sized catalog cases"
                                                                          if big else "")
                   + (f" here (on a GPU, uncapped: {on_gpu:,} cases in all)" if dev.interpreted else ""))
    out.append("the nightly (python -m harness nightly, on a GPU) adds "
               + ("torch.compile of every chain (--kind compiled), " if dev.interpreted else "")
               + "the store-timing timelines, GPU-only checks, the end-to-end gate and benchmarks; "
                 "python -m harness mutants shows that every check bites")
    return out


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


def _where(p: Planned, impl: Impl, dev: Device, seconds: float, prov: Provenance) -> dict:
    """The columns of every row of one (implementation, case) run but the check's own (``parity_row``)."""
    return dict(op=p.spec.name, impl=impl.name, kind=impl.kind, case=p.display, fp8_policy=impl.fp8_policy,
                precision=impl.precision, nan_policy=nan_policy_of(p.spec, impl), repro=repro_line(p, impl, dev),
                seconds=seconds, **prov.__dict__)


def rows_for(p: Planned, impl: Impl, dev: Device, res: runners.CaseResult, prov: Provenance,
             ledger: tuple = ()) -> list[ParityRow]:
    """The rows of one (implementation, case) run. With a ``ledger`` (harness.ledger), failing checks an
    entry explains are ``known``, and an entry covering the case whose checks all passed adds a failing
    ``ledger:<id>`` row (the known failure did not happen). A row without a check's measures (refused,
    ledger) is that of a record with none (``compare.Record``'s defaults: NaN)."""
    where = _where(p, impl, dev, res.seconds, prov)
    if res.refused:
        return [parity_row(compare.Record("can_handle", False, detail=res.refused), status="refused", **where)]
    known, silent = ledger_verdicts(ledger, p.spec.name, impl.name, p.case,
                                    [r.check for r in res.records if not r.passed],
                                    inputs=lambda: built_inputs(p, dev))
    rows = [parity_row(r, status="pass" if r.passed else "known" if r.check in known else "fail",
                       known=known.get(r.check, ""), **where)
            for r in res.records]
    rows += [parity_row(compare.Record(f"ledger:{e.id}", False,
                                       detail=f"known failure did not happen (none of {', '.join(e.checks)} failed): "
                                              f"fixed? narrow or remove the entry. Cause: {e.cause}. "
                                              f"Upstream: {e.upstream}"),
                        status="fail", known=e.id, **where)
             for e in silent]
    return rows


_BUILT: dict = {}  # the last case's inputs (rows_for asks once per implementation of a case)


def built_inputs(p: Planned, dev: Device) -> dict:
    """The keyword arguments planned case ``p`` gives an implementation (``OpSpec.build_inputs``, the same
    seeded draws as the run's), on the host: what a ``harness.ledger.KnownFailureOnInputs`` reads."""
    import torch

    key = (p.spec.name, p.full_id, dev)
    if key not in _BUILT:
        _BUILT.clear()
        _BUILT[key] = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                       for k, v in p.spec.build_inputs(p.case, dev).items()}
    return _BUILT[key]


_WORKER: tuple | None = None


def worker_init(device_kind: str, fp8_format: str, plugin_specs: tuple[str, ...]) -> None:
    """A spawned worker's start (``spawn_map``; ``harness.gpu.warmup_worker`` too): its device and registry."""
    global _WORKER
    import torch

    from harness.ops import default_registry
    from harness.registry import cwd_on_path

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


CASE_TIMEOUT_S = 120.0  # a compiled backend: a cold case compiles a few Triton variants, seconds each
CASE_TIMEOUT_INTERPRETED_S = 900.0  # the Triton interpreter on a shared CPU


def default_case_timeout(dev: Device) -> float:
    """The per-case time limit (``--case-timeout-s``) when none is given."""
    return CASE_TIMEOUT_INTERPRETED_S if dev.interpreted else CASE_TIMEOUT_S


def spawn_map(fn, tasks: list, jobs: int, dev: Device, plugin_specs: tuple[str, ...] = (), *,
              timeout_s: float | None = None, stack_dir=None, name=lambda task: "task", isolate: bool = False):
    """``(index, fn(task) or pool.Lost)`` for every task AS IT COMPLETES (``harness.pool.run``), in
    ``jobs`` spawned processes, each with its own device and registry (built-ins, mutants, entry
    points, ``plugin_specs``; ``worker_state()``); ``jobs`` <= 1 without ``isolate`` runs in this
    process (``fn`` then finds the caller's ``set_worker_state``). A task past ``timeout_s`` is a
    ``Lost`` (its stack in ``stack_dir/<name(task)>.txt``; the worker killed and replaced). Ctrl-C or
    SIGTERM stops the workers; what completed before was yielded. Each worker gets one OpenBLAS
    thread (the jobs already fill the cores; the interpreter's ``tl.dot`` products are tiny: with
    the default thread count a worker burnt 1.6x the CPU time for the same wall time on the 2-core
    machine)."""
    import os

    blas = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # inherited by the spawned workers (read when numpy loads)
    try:
        yield from pool.run(fn, tasks, jobs, initializer=worker_init, initargs=(dev.kind, dev.fp8_format, plugin_specs),
                            timeout_s=timeout_s, stack_dir=stack_dir, name=name, isolate=isolate)
    finally:
        if blas is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = blas


def _worker_run(task) -> list[runners.CaseResult]:
    """One case's implementations in a worker (``spawn_map``); each result is emitted as it finishes."""
    op, impl_keys, case = task
    dev, reg = _WORKER
    stages.count_triton_compiles()
    return runners.run_impls(reg.ops[op], [reg.impls[k] for k in impl_keys], case, dev, emit=pool.emit)


def _local_run(task) -> list[runners.CaseResult]:
    """``_worker_run`` in this process, on the caller's own ``Impl`` objects."""
    spec, impls, case = task
    stages.count_triton_compiles()
    return runners.run_impls(spec, impls, case, _WORKER[0], emit=pool.emit)


def _groups(work) -> list[tuple]:
    """(planned, [impl, ...]) per case, in plan order: the implementations of one case run together
    (``runners.run_impls``: inputs, reference and oracle once per case)."""
    groups: list[tuple] = []
    for p, impl in work:
        if groups and groups[-1][0] is p:
            groups[-1][1].append(impl)
        else:
            groups.append((p, [impl]))
    return groups


def schedule(groups) -> list[int]:
    """The order in which the cases of ``groups`` go to the workers: costliest first by their op's
    ``OpSpec.case_cost`` (longest-processing-time first: a long case that starts last keeps its worker
    busy while the others idle), plan order among equal costs and for ops without one (cost 0). The
    rows come back in plan order whatever this is."""
    def cost(g: int) -> float:
        p = groups[g][0]
        return float(p.spec.case_cost(p.case)) if p.spec.case_cost is not None else 0.0

    return sorted(range(len(groups)), key=lambda g: -cost(g))


def _results(groups, dev: Device, jobs: int, plugin_specs: tuple[str, ...], reg: Registry | None = None, *,
             timeout_s: float | None = None, stack_dir=None, isolate: bool = False):
    """(group index, [CaseResult | pool.Lost per impl]) as each case completes. ``jobs`` > 1 (or
    ``isolate``) runs cases in spawned processes, each rebuilding the registry (built-ins, mutants,
    entry points, ``plugin_specs``); else in this process, on the given ``Impl`` objects."""
    if jobs <= 1 and not isolate:
        set_worker_state(dev, reg)
        tasks = [(p.spec, impls, p.case) for p, impls in groups]
        results = spawn_map(_local_run, tasks, 1, dev, timeout_s=timeout_s, stack_dir=stack_dir,
                            name=lambda t: stack_name(t[0].name, t[2]))
    else:
        tasks = [(p.spec.name, [i.key for i in impls], p.case) for p, impls in groups]
        results = spawn_map(_worker_run, tasks, jobs, dev, plugin_specs, timeout_s=timeout_s, stack_dir=stack_dir,
                            name=lambda t: stack_name(t[0], t[2]), isolate=isolate)
    try:
        for g, res in results:
            yield g, (res if not isinstance(res, pool.Lost) else _split_lost(res, len(groups[g][1])))
    finally:
        results.close()


def stack_name(op: str, case) -> str:
    """A timed-out case's stack file name: its display id (shortened) and a hash of its full id."""
    h = hashlib.sha1(base.case_id(op, case).encode()).hexdigest()[:10]
    return f"{base.display_id(op, case)[:80]}-{h}"


@dataclass(frozen=True)
class Unfinished:
    """An implementation of a lost case (``pool.Lost``) that has no result: the one running when the
    case was lost (``blocked_by`` None), or one after it (``blocked_by``: that one's index)."""
    lost: pool.Lost
    blocked_by: int | None = None


def _split_lost(lost: pool.Lost, n: int) -> list:
    """Per implementation of a lost case: the result it emitted (``runners.run_impls``), else ``Unfinished``."""
    done = {part[1]: part[2] for part in lost.parts if part[0] == "done"}
    started = [part[1] for part in lost.parts if part[0] == "start"]
    running = started[-1] if started and started[-1] not in done else None
    return [done[j] if j in done else Unfinished(lost, None if j == running else running) for j in range(n)]


def lost_rows(p: Planned, impl: Impl, dev: Device, u: Unfinished, prov: Provenance,
              impls: list[Impl]) -> list[ParityRow]:
    """The row of an implementation whose case gave no result: status ``timeout`` (the case ran past
    its limit) or ``fail`` (the worker process died), check ``timeout`` / ``run``, the detail saying
    where it hung and where the stack is on disk (or which implementation was running instead)."""
    lost = u.lost
    if u.blocked_by is not None:
        detail = (f"not run: {impls[u.blocked_by].name} {'timed out' if lost.reason == 'timeout' else 'died'} "
                  f"first on this case")
    else:
        where = lost.innermost()
        detail = lost.detail + (f"; at {where}" if where else "")
    timed_out = lost.reason == "timeout"
    return [parity_row(compare.Record("timeout" if timed_out else "run", False, detail=detail),
                       status="timeout" if timed_out else "fail", **_where(p, impl, dev, lost.seconds, prov))]


def run(reg: Registry, *, dev: Device, profile: Profile, ops: list[str], impls: list[Impl], seed: int = 0,
        shard_spec: str | None = None, generated: int | None = None, progress: bool = True,
        case_filter: str | None = None, generated_only: bool = False, jobs: int = 1, plugin_specs: tuple[str, ...] = (),
        ledger: tuple = (), case_timeout_s: float | None = None, stack_dir=None, isolate: bool = False,
        stage_table: stages.Table | None = None, tally: Tally | None = None) -> list[ParityRow]:
    """Every planned (case, implementation) run's rows, in plan order. Cases complete in any order
    (one slow or hung case holds back nothing); a case past ``case_timeout_s`` (default:
    ``default_case_timeout``) gets ``timeout`` rows, its stack in ``stack_dir``. Ctrl-C or SIGTERM
    keeps every row that completed (``tally`` says how many and that the run was cut short).
    ``stage_table`` collects the stages' wall time (``harness.parity.stages``). A selection (ops,
    implementations, ``case_filter``, ``generated_only``) that matches no (implementation, case) pair before
    the shard is taken raises ``NothingSelected`` before any case runs; an empty shard of a non-empty
    selection is no error. ``generated_only``: no case of the named catalogs, the generated ones only."""
    prov = provenance(dev, profile, seed)
    tally = Tally() if tally is None else tally
    work, selected = [], 0
    for op in ops:
        spec = reg.ops[op]
        planned = plan_cases(spec, profile, seed=seed, generated=generated, interpreted=dev.interpreted,
                             named=not generated_only)
        if case_filter:
            kept = [p for p in planned if case_filter in p.display or case_filter in p.full_id]
            # the slice first, then the filter: a shard holds the same cases with and without --case
            planned = [p for p in shard(planned, shard_spec) if case_filter in p.display or case_filter in p.full_id]
        else:
            kept = planned
            planned = shard(planned, shard_spec)
        n_impls = sum(i.op == op for i in impls)
        selected += len(kept) * n_impls
        work += [(p, i) for p in planned for i in impls if i.op == op]
    if not selected:
        raise NothingSelected("matches no (implementation, case) pair")
    tally.total = len(work)
    groups = _groups(work)
    timeout = default_case_timeout(dev) if case_timeout_s is None else case_timeout_s
    by_group: dict[int, list[ParityRow]] = {}
    bar = tqdm(total=len(work), desc="parity", unit="run", disable=not progress, file=sys.stderr, dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 15.0)
    n_fail = 0
    done = 0
    order = schedule(groups)
    results = _results([groups[g] for g in order], dev, jobs, plugin_specs, reg, timeout_s=timeout or None,
                       stack_dir=stack_dir, isolate=isolate)
    try:
        for k, res in results:
            g = order[k]
            p, g_impls = groups[g]
            new = []
            for impl, r in zip(g_impls, res):
                t0 = time.perf_counter()
                if isinstance(r, runners.CaseResult):
                    new += rows_for(p, impl, dev, r, prov, ledger)
                    if stage_table is not None:
                        stage_table.add(p.spec.name, r.stages)
                else:  # Unfinished
                    new += lost_rows(p, impl, dev, r, prov, g_impls)
                if stage_table is not None:
                    stage_table.add(p.spec.name, {"rows": time.perf_counter() - t0}, run=False)
            by_group[g] = new
            n_fail += any(r.status in FAILING for r in new)
            done += len(g_impls)
            tally.done = done
            bar.update(len(g_impls))
            bar.set_postfix_str(f"{p.spec.name} fail={n_fail}")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (a CI time limit): keep what ran, say so
        tally.interrupted = True
        print(f"\ninterrupted: {done} of {len(work)} runs done; rows so far are kept", file=sys.stderr)
    finally:
        results.close()
        bar.close()
    return [r for g in sorted(by_group) for r in by_group[g]]
