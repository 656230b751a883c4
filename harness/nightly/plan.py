"""The nightly's plan: which steps ``python -m harness nightly`` runs, with which arguments, worker
counts, CPU priority, environment and time limits (``Step``, ``plan``: pure, nothing is started
here; ``harness.nightly.steps`` runs them)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.ops import BUILTIN, builtin_specs

# the ops the nightly checks (OpSpec.nightly), in harness.ops.BUILTIN order
OPS = tuple(name for name, spec in builtin_specs().items() if spec.nightly)
# op -> its nightly group (OpSpec.nightly_group): the ops of a group share one parity step
NIGHTLY_GROUP = {name: spec.nightly_group for name, spec in builtin_specs().items() if spec.nightly_group}
# parity workers of an op relative to the others (OpSpec.parity_weight: implementations per case)
PARITY_WEIGHT = {name: spec.parity_weight for name, spec in builtin_specs().items() if spec.parity_weight != 1}
# Phase 0 oversubscribes the host (H200 nightly of 2026-11-29: 26 processes on 16 cores). The gate's runs
# are the longest that cannot be split (600 problems each; the plain greedy run 183-205 s there), and two
# layouts ran out of their 384 s while parity and timelines finished in 230-358 s: every step but the gate
# and the short GPU checks runs at this lower CPU priority, so the gate keeps its cores. Not the compiled
# step either: each catalog case recompiles (35-54 s a case when it ran niced, with one inductor compile
# thread: 41 of 42 cases of a third of the catalog in its 414 s), so its cases are the other long pole
BACKGROUND_NICE = 5
# The warmup collects on the catalog plus this many generated cases per op, not the steps' whole plan.
# Its collect pass builds every case's inputs and calls every implementation (about 0.1 s a case and
# implementation on the H200 host); on the whole nightly plan that alone outlasted the warmup's 10 % of
# a 530 s budget on a fresh H200 (2026-12-01), nothing got compiled, and verify_attention's parity
# workers compiled 784 kernels themselves (608 s summed). Variants are products of a few discrete
# parameters (dtypes, head dims, block sizes, flags): a sample of the draws meets nearly all of them,
# and a variant it misses is compiled by the first step that launches it (its compile_s shows that).
WARMUP_GENERATED = 300
# Shares of --budget-s. The warmup's plan took 30 s to compile and 56 s to collect on a fresh H200
# (2026-12-01; 250 variants), the collect mostly one chunk of big verify_attention cases: with them
# spread it fits in 15 %; a quarter is its ceiling, and what it leaves goes to correctness, which ends
# at 75 % of the budget from the start. The benchmarks get the rest (bench --quick: 76 rows in 106 s; with
# the two sampling ops' shapes, 2026-12-07 on an H100 host, its 104 s of a 520 s budget ran out in the sixth op).
WARMUP_SHARE = 0.25
CORRECTNESS_ENDS = 0.75


@dataclass
class Step:
    name: str
    argv: list[str]
    budget_s: float
    phase: int = 0  # -1: the warmup, alone first; 0: concurrent correctness steps; 1: alone afterwards
    # (benchmarks); 2: report
    nice: int = 0  # CPU priority increment of the step's processes (0: normal)
    log: Path | None = None
    proc: subprocess.Popen | None = None
    t0: float = 0.0
    wall_s: float = 0.0
    rc: int | None = None
    timed_out: bool = False
    fails: list[str] = field(default_factory=list)
    compile_s: float | None = None  # Triton compile seconds its log reports (warmup: wall; others: summed)
    env: dict = field(default_factory=dict)  # added to the step's environment
    until_s: float | None = None  # must end by this many seconds after the nightly's start (its budget_s
    # shrinks to what is left of that when it starts: a short warmup leaves its time to the steps after it)


def worker_counts(cores: int, gate_runs: int) -> dict[str, int]:
    """Worker processes per step on a machine with ``cores`` CPU cores. On one GPU the steps are
    host-bound (launches, syncs, Python), so the processes of all concurrent steps together are
    sized to about twice the cores (a process waiting on the GPU leaves its core to another):
    parity per op and timelines per family get ``cores // 8`` each, the gate per layout up to its
    runs (``gate_runs``) capped at ``cores // 6``. Measured on the H200 host (16 cores): 31
    processes in all (3 per parity op, 1 per timeline family, 5 per gate layout, torch.compile
    in every parity worker) left each about half a core and no step finished in 380 s. The gate's
    share went from ``cores // 5`` to ``cores // 6`` when the acceptance step took its third worker
    (an H100 host, 2026-12-07: the gate layouts took 94-108 s of a 352 s limit with 3 workers each)."""
    per = max(1, cores // 8)
    return {"parity": per, "timelines": per, "gate": max(1, min(gate_runs, cores // 6))}


def parity_jobs(per: int, weight: float, cores: int) -> int:
    """Parity workers of an op of ``weight`` (``OpSpec.parity_weight``) when an op of weight 1 gets
    ``per``: a heavier op gets ``per · weight`` up to a quarter of the cores (never fewer than
    ``per``); a lighter one (weight < 1) ``per · weight`` rounded down, at least 1."""
    if weight < 1:
        return max(1, int(per * weight))
    return max(per, min(int(per * weight), cores // 4))


def plan(out: Path, *, profile: str, device: str, budget_s: float, jobs: int | None, layouts: list[str] | None,
         families: list[str] | None, bench: bool, gate: bool, ops: list[str] | None = None,
         generated: int | None = None, timelines: int | None = None, cores: int | None = None,
         gate_jobs: int | None = None, compiled_shards: int = 1, day: int | None = None, warmup: bool = True,
         case_timeout_s: float | None = None, cuda_sync: str = "blocking",
         compare_on: str = "device") -> list[Step]:
    """The steps, with their time limits: on a GPU first the warmup alone (``harness.gpu.warmup``: the
    Triton variants the parity steps launch on their catalogs and the first ``WARMUP_GENERATED``
    generated cases per op, compiled once in parallel into Triton's cache) in at most
    ``WARMUP_SHARE`` of the budget, then correctness until ``CORRECTNESS_ENDS`` of it from the start
    (what the warmup leaves unused goes to correctness), benchmarks in the rest. Parity and timeline steps run every case under ``case_timeout_s`` (default: the device's,
    ``harness.parity.suite.default_case_timeout``): a stalled case is a ``timeout`` row, never a slow step.
    ``generated`` overrides the generated parity cases per op (default: the profile's),
    ``timelines`` the generated timelines per family (default: the profile's; 500 per family in
    the nightly profile). ``jobs`` and ``gate_jobs`` override the parity workers per op and the
    gate's per layout (default: ``worker_counts``). ``compiled_shards`` > 1 runs one rotating slice
    of the compiled step's catalog per night (``compiled_shard``; ``day`` defaults to today).

    The parity steps run the reference, fused and external implementations on every case; the
    ``compiled`` ones (torch.compile of the reference chain) run the catalog only, in a step of
    their own: each new shape, dtype or layout of a generated case costs them a recompile
    (about 2-3 s each on the H200 host), which took most of the parity steps' time when they ran
    every case."""
    from cases import e2e_gate
    from harness import compare, devices

    gp = "full" if device != "cpu" else "cpu-lite"
    gprof = e2e_gate.PROFILES[gp]
    cores = cores or os.cpu_count() or 1
    workers = worker_counts(cores, 2 + len(gprof.paths) + len(gprof.path_mutants))
    if jobs is not None:
        workers["parity"] = workers["timelines"] = jobs
    if gate_jobs is not None:
        workers["gate"] = gate_jobs
    py = [sys.executable, "-m", "harness"]
    par = CORRECTNESS_ENDS * budget_s
    gen = [] if generated is None else ["--generated", str(generated)]
    kinds = ["--kind", "reference", "--kind", "fused", "--kind", "external"]
    from harness.parity import suite

    limit = case_timeout_s if case_timeout_s is not None else (
        suite.CASE_TIMEOUT_INTERPRETED_S if device == "cpu" else suite.CASE_TIMEOUT_S)
    watchdog = ["--case-timeout-s", f"{limit:g}"]
    steps = []
    if warmup and device != "cpu":  # the interpreter compiles nothing
        from cases import profiles

        warm_gen = min(generated if generated is not None else profiles.PROFILES[profile].generated,
                       WARMUP_GENERATED)
        steps.append(Step("warmup", py + ["warmup", "--device", device, "--profile", profile, "--jobs",
                                          str(min(cores, 16)), "--kind", "fused", "--kind", "external"]
                          + [a for op in ops or OPS for a in ("--op", op)] + ["--generated", str(warm_gen)],
                          WARMUP_SHARE * budget_s, phase=-1))
    for op, group in parity_groups(list(ops or OPS)).items():
        # the group's workers: the sum of its ops' weights, as it does their work (its heaviest op's alone gave the
        # three acceptance ops one worker: 7,814 of 9,172 runs when its 352 s ran out, an H100 host, 2026-12-07)
        weight = sum(PARITY_WEIGHT.get(o, 1) for o in group)
        steps.append(Step(f"parity:{op}", py + ["run", *(a for o in group for a in ("--op", o)), "--device", device,
                                                "--profile", profile, "--quiet",
                                                "--jobs", str(parity_jobs(workers["parity"], weight, cores)),
                                                "--csv", str(out / f"parity-{op}.parquet"),
                                                "--junit", str(out / f"parity-{op}.xml"), "--stage-times"]
                          + kinds + gen + watchdog, par, nice=BACKGROUND_NICE))
    if device != "cpu":  # torch.compile's Triton backend needs a GPU; on the CPU `compiled` refuses anyway
        shard = compiled_shard(compiled_shards, day)
        steps.append(Step("parity:compiled",
                          py + ["run", "--device", device, "--profile", profile, "--quiet",
                                # one process per op, at most a fifth of the cores:
                                # inductor's compiles, not the processes, bound this step
                                "--jobs", str(min(len(ops or OPS), max(1, cores // 5))),
                                "--kind", "compiled", "--generated", "0", "--csv",
                                str(out / "parity-compiled.parquet"), "--junit",
                                str(out / "parity-compiled.xml"), "--stage-times",
                                # inductor compiles each catalog case (35-54 s a case, measured): a longer limit
                                "--case-timeout-s", f"{max(limit, 300):g}"]
                          + [a for op in ops or OPS for a in ("--op", op)]
                          + ([] if shard is None else ["--shard", shard]), par))  # normal priority: see below
    from cases import timelines as tl

    tl_gen = (["--generated", str(timelines)] if timelines is not None
              else ["--generated", "500"] if profile == "nightly" else [])
    chosen = families or sorted(tl.FAMILIES)
    for fam in [f for f in chosen if tl.FAMILIES[f].nightly_with not in chosen]:
        twins = [a for f in chosen if tl.FAMILIES[f].nightly_with == fam for a in ("--family", f)]  # in its step
        steps.append(Step(f"timelines:{fam}", py + ["timelines", "--device", device, "--profile", profile,
                                                    "--family", fam, *twins, "--quiet", "--jobs",
                                                    str(parity_jobs(workers["timelines"], tl.FAMILIES[fam].nightly_weight,
                                                                    cores)),
                                                    "--csv", str(out / f"timelines-{fam}.parquet")] + tl_gen + watchdog,
                          par,
                          nice=BACKGROUND_NICE))
    steps.append(Step("gpu", py + ["gpu", "--out", str(out / "gpu")], par))
    if gate:
        for lay in layouts or e2e_gate.LAYOUTS:
            steps.append(Step(f"gate:{lay}", py + ["gate", "--device", device, "--profile", gp, "--layout", lay,
                                                   "--jobs", str(workers["gate"]), "--csv", str(out / f"gate-{lay}.csv")],
                              par))
    for s in steps:
        if s.phase == 0:
            s.until_s = par
            s.env = {compare.COMPARE_ON_ENV: compare_on}  # where the checks compute (harness.compare.home)
            if device == "cuda":  # the steps share one GPU: a process waiting for it sleeps (harness.devices)
                s.env[devices.SYNC_ENV] = cuda_sync
    if bench:
        # the small shape set: the full one (nox -s bench) took longer than the whole 20 % on the H200
        # (qk_norm_rope 62 s, mla 31 s, verify_attention 2 of 24 shapes when its 109 s ran out)
        steps.append(Step("bench", py + ["bench", "--out", str(out / "bench"), "--quick"],
                          (1 - CORRECTNESS_ENDS) * budget_s, phase=1))
    return steps


def parity_groups(ops: list[str]) -> dict[str, list[str]]:
    """The parity steps: step op -> the ops whose cases it runs, in ``harness.ops.BUILTIN`` order: an op of
    no group alone; the chosen ops of one group (``OpSpec.nightly_group``) together, in the step of the
    first of them."""
    groups: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    for op in sorted(ops, key=lambda o: BUILTIN.index(o) if o in BUILTIN else len(BUILTIN)):
        g = NIGHTLY_GROUP.get(op)
        if g is None:
            groups[op] = [op]
        else:
            groups.setdefault(first.setdefault(g, op), []).append(op)
    return groups


def compiled_shard(shards: int, day: int | None = None) -> str | None:
    """The compiled step's slice tonight: ``i/n`` with i = day number (days since 1970-01-01,
    UTC) mod n + 1, so n consecutive nights cover the whole catalog; None for one shard."""
    if shards < 1:
        raise ValueError(f"--compiled-shards: expected >= 1, got {shards}")
    if shards == 1:
        return None
    day = int(time.time() // 86400) if day is None else day
    return f"{day % shards + 1}/{shards}"
