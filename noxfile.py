"""Every user-facing entry point: `nox -s parity`, `nox -s tests`, `nox -s mutants`, `nox -s compile`,
`nox -s report`, `nox -s gate`, `nox -s sglang`, `nox -s fuzz`, `nox -s warmup`.

Installs are vendor-safe. On a CPU machine the session venv takes the pins of
``constraints/cpu.txt`` (torch 2.13.0 CPU build, triton 3.9.0, numpy 2.4.6). On a CUDA or
ROCm runner (``nvidia-smi``/``rocm-smi`` present, or ``VP_SYSTEM_TORCH=1``) the venv sees the
runner's own site-packages and installs no torch or triton at all, so a ROCm torch is never
replaced by CUDA wheels. Arguments after ``--`` go to the underlying command.
"""
from __future__ import annotations

import glob
import os
import shutil

import nox

nox.options.sessions = ["parity", "tests"]
nox.options.reuse_existing_virtualenvs = True

SYSTEM_TORCH = os.environ.get("VP_SYSTEM_TORCH") == "1" or bool(shutil.which("nvidia-smi") or shutil.which("rocm-smi"))
VENV_PARAMS = ["--system-site-packages"] if SYSTEM_TORCH else []
DEVICE = os.environ.get("VP_DEVICE", "auto" if SYSTEM_TORCH else "cpu")
# SGLang's kernel files (harness.adapters.sglang); --no-deps: its serving stack is not needed, and its
# torch pin must never replace a runner's torch
SGLANG = "sglang==0.5.23"


def _install(session: nox.Session) -> None:
    if SYSTEM_TORCH:
        session.run("python", "-c", "import torch, triton; print('runner torch', torch.__version__, 'triton', triton.__version__)")
        session.install("-e", ".")
    else:
        session.install("-c", "constraints/cpu.txt", "-e", ".[cpu]")


def _jobs() -> str:
    return os.environ.get("VP_JOBS", str(os.cpu_count() or 1) if DEVICE == "cpu" else "1")


@nox.session(venv_params=VENV_PARAMS)
def parity(session: nox.Session) -> None:
    """Parity of every op: catalog + generated cases (VP_PROFILE: ci | nightly | dev)."""
    _install(session)
    args = session.posargs or []
    session.run("python", "-m", "harness", "run", "--device", DEVICE, "--jobs", _jobs(), "--csv", "runs/parity.csv",
                *args, env={"VP_DEVICE": DEVICE})


@nox.session(venv_params=VENV_PARAMS)
def warmup(session: nox.Session) -> None:
    """Compile every Triton variant the parity plan launches into Triton's cache (TRITON_CACHE_DIR), once, in
    parallel, before a timed run; the plan takes `run`'s arguments (`-- --shard 1/2`). Nothing to do on the CPU."""
    _install(session)
    session.run("python", "-m", "harness", "warmup", "--device", DEVICE, *session.posargs, env={"VP_DEVICE": DEVICE})


# ``VP_TESTS=all`` runs the tests marked ``slow`` too (the nightly's test step, gpu-run.yml, does); without it
# ``nox -s tests`` deselects them (docs/reports.md: which they are, and what else covers them in CI)
TESTS_ENV = "VP_TESTS"


@nox.session(venv_params=VENV_PARAMS)
def tests(session: nox.Session) -> None:
    """The harness's own tests (pytest-xdist: one worker per core, ``VP_WORKERS`` to change it). On a GPU
    machine they run on the GPU, every worker sharing it (docs/gpu-tests.md). Tests marked ``slow`` run only
    with ``VP_TESTS=all`` (the nightly)."""
    _install(session)
    session.install("--no-deps", SGLANG)  # tests/test_sglang.py checks the adapters
    workers = os.environ.get("VP_WORKERS", "auto")
    marks = [] if os.environ.get(TESTS_ENV) == "all" else ["-m", "not slow"]
    session.run("python", "-m", "pytest", "-n", workers, "-q", "--durations=15", *marks, *session.posargs,
                env={"VP_DEVICE": DEVICE, "VP_REQUIRE_SGLANG": "1"})


@nox.session(venv_params=VENV_PARAMS)
def sglang(session: nox.Session) -> None:
    """SGLang 0.5.23's own kernels (harness.adapters.sglang: split-KV and shared-KV verify attention, the
    fused qk-norm-rope store) over the ci profile, against their known-failure ledger
    (cases/ledgers/sglang.py): fails on any failure not in the ledger, and on a known failure that did not
    happen. runs/sglang.csv. `-- --generated 20` for a quick slice."""
    _install(session)
    session.install("--no-deps", SGLANG)
    session.run("python", "-m", "harness", "run", "--device", DEVICE, "--profile", "ci", "--jobs", _jobs(),
                "--impl", "harness.adapters.sglang:IMPLS", "--ledger", "sglang", "--csv", "runs/sglang.csv",
                *session.posargs, env={"VP_DEVICE": DEVICE})


@nox.session(venv_params=VENV_PARAMS)
def fuzz(session: nox.Session) -> None:
    """The bad-input fuzzer (harness/fuzz/) deeper than the tests: 8 drawn inputs per class, op and argument
    instead of 1, every call in a worker subprocess; fails on any crash, segfault, hang, wrong answer, partial write,
    refusal of a legal input or error not naming the argument. `-- --classes stride device` for a slice."""
    _install(session)
    session.run("python", "-m", "harness.fuzz", "--device", DEVICE, "--examples", "8", "--jobs", _jobs(),
                *session.posargs, env={"VP_DEVICE": DEVICE})


@nox.session(venv_params=VENV_PARAMS)
def mutants(session: nox.Session) -> None:
    """Every mutant against the suite; fails if any survives."""
    _install(session)
    session.run("python", "-m", "harness", "mutants", "--device", DEVICE, "--csv", "runs/mutants.csv",
                *session.posargs, env={"VP_DEVICE": DEVICE})


@nox.session(venv_params=VENV_PARAMS)
def compile(session: nox.Session) -> None:
    """Compile every kernel for sm90, gfx942 and gfx950 (no GPU needed)."""
    _install(session)
    env = {"TRITON_INTERPRET": "0", "VP_DEVICE": "compile"}
    session.run("python", "-m", "harness", "compile", *session.posargs, env=env)


@nox.session(venv_params=VENV_PARAMS)
def report(session: nox.Session) -> None:
    """runs/report/{report.html, junit.xml, merged.parquet, diff.csv} from the results in runs/: parity*.csv
    and parity*.parquet (shards merged), and mutants*.csv, perf*.csv, gate*.csv, kill_matrix*.csv,
    timelines*.csv[.gz] when present. `-- --baseline OLD/merged.parquet` (or a CSV) diffs against a previous
    run and fails on any REGRESS."""
    _install(session)
    parity = sorted(glob.glob("runs/parity*.csv") + glob.glob("runs/parity*.parquet"))
    if not parity:
        session.error("no runs/parity*.csv or runs/parity*.parquet: run `nox -s parity` (or its shards) first")
    args = [a for p in parity for a in ("--csv", p)]
    for flag, pattern in (("--mutants", "runs/mutants*.csv"), ("--perf", "runs/perf*.csv"), ("--gate", "runs/gate*.csv"),
                          ("--kill-matrix", "runs/kill_matrix*.csv"), ("--timelines", "runs/timelines*.csv*")):
        args += [a for p in sorted(glob.glob(pattern)) for a in (flag, p)]
    session.run("python", "-m", "harness", "report", *args, "--out", "runs/report", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def gate(session: nox.Session) -> None:
    """End-to-end gate: micro-models on held-out GSM8K-style problems through the reference,
    fused and path-mutant paths; runs/gate.csv. Profile: cpu-lite on the CPU, full on a GPU
    (`-- --profile full`). On the CPU the generation runs go to one process per core (VP_JOBS)."""
    _install(session)
    session.run("python", "-m", "harness", "gate", "--device", DEVICE, "--jobs", _jobs(), "--csv", "runs/gate.csv",
                *session.posargs, env={"VP_DEVICE": DEVICE})


@nox.session(venv_params=VENV_PARAMS)
def gpu(session: nox.Session) -> None:
    """GPU-only checks: launch counts (torch.profiler), CUDA/HIP graph capture + replay with new inputs
    vs eager (the gate's decision included), full-size determinism; planted mutants must be flagged.
    runs/gpu/gpu_checks.csv. On a machine without a GPU it says so and checks nothing."""
    _install(session)
    session.run("python", "-m", "harness", "gpu", "--out", "runs/gpu", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def bench(session: nox.Session) -> None:
    """Benchmarks of every op (fused vs reference chain vs torch.compile of it, side by side in one run):
    runs/perf.csv (PerfRow per mode, eager and graph-replayed: p50, ratios, bandwidth vs measured copy
    bandwidth, launches) and runs/table.csv, the table of ours per op and shape it prints last.
    `-- --quick` for the small set. Needs a GPU (without one it says so and measures nothing)."""
    _install(session)
    session.run("python", "-m", "harness", "bench", "--out", "runs", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def nightly(session: nox.Session) -> None:
    """The whole nightly in one run (GPU runners): parity per op, timelines per family, GPU-only checks
    and the gate concurrently, then benchmarks alone, then runs/nightly/report (HTML, JUnit, merged.parquet).
    `-- --budget-s 600`, `-- --baseline OLD/merged.parquet`; on a CPU machine `-- --profile dev`."""
    _install(session)
    session.run("python", "-m", "harness", "nightly", "--device", DEVICE, "--out", "runs/nightly", *session.posargs,
                env={"VP_DEVICE": DEVICE})
