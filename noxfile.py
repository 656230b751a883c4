"""Every user-facing entry point: `nox -s parity`, `nox -s tests`, `nox -s mutants`, `nox -s compile`,
`nox -s report`, `nox -s gate`, `nox -s sglang`, `nox -s vllm`, `nox -s fuzz`, `nox -s warmup`, `nox -s dev`.

One environment for all of them and for the user's shell: ``.venv`` at the top of the checkout
(``VP_VENV`` moves it). The first session makes it; the others reuse it, and reinstall only when
``pyproject.toml``, ``constraints/cpu.txt`` or the engine pins change (a stamp file in the venv says
what it holds). ``source .venv/bin/activate`` then gives a shell where ``python -m harness`` /
``verify-parity`` and every printed repro line run as printed.

Installs are vendor-safe. On a CPU machine the venv takes the pins of ``constraints/cpu.txt``
(torch 2.13.0 CPU build, triton 3.9.0, numpy 2.4.6). On a CUDA or ROCm runner (``nvidia-smi`` /
``rocm-smi`` present, or ``VP_SYSTEM_TORCH=1``) the venv sees the runner's own site-packages and
installs no torch or triton at all, so a ROCm torch is never replaced by CUDA wheels. Arguments
after ``--`` go to the underlying command.
"""
from __future__ import annotations

import glob
import hashlib
import os
import shutil
import sys
from pathlib import Path

import nox

nox.options.sessions = ["parity", "tests"]
nox.options.reuse_existing_virtualenvs = True

SYSTEM_TORCH = os.environ.get("VP_SYSTEM_TORCH") == "1" or bool(shutil.which("nvidia-smi") or shutil.which("rocm-smi"))
DEVICE = os.environ.get("VP_DEVICE", "auto" if SYSTEM_TORCH else "cpu")
# SGLang's kernel files (harness.adapters.sglang); --no-deps: its serving stack is not needed, and its
# torch pin must never replace a runner's torch
SGLANG = "sglang==0.5.23"
# vLLM's kernel files (harness.adapters.vllm); --no-deps as for SGLang: the kernels need torch and triton only
VLLM = "vllm==0.34.0"
VENV = Path(os.environ.get("VP_VENV", ".venv"))
STAMP = ".verify-parity-installed"


def _wanted() -> str:
    """What the environment must hold: the files and pins an install reads, hashed."""
    h = hashlib.sha256()
    for f in ("pyproject.toml", "constraints/cpu.txt"):
        h.update(Path(f).read_bytes())
    h.update(f"{SYSTEM_TORCH} {SGLANG} {VLLM} {sys.version_info[:2]}".encode())
    return h.hexdigest()


def _install(session: nox.Session):
    """The one environment (module docstring), made or brought up to date; returns ``run(*args, env=None)``,
    which runs ``python *args`` in it."""
    py = VENV / "bin" / "python"
    stamp = VENV / STAMP
    if not py.exists():
        session.log(f"making {VENV} (one environment for every session and your shell)")
        session.run(sys.executable, "-m", "venv", *(["--system-site-packages"] if SYSTEM_TORCH else []), str(VENV),
                    external=True)
    if not stamp.exists() or stamp.read_text() != _wanted():
        pip = (str(py), "-m", "pip", "install", "-q")
        if SYSTEM_TORCH:
            session.run(str(py), "-c", "import torch, triton; print('runner torch', torch.__version__, 'triton', "
                                       "triton.__version__)", external=True)
            session.run(*pip, "-e", ".[sglang-jit]", external=True)
        else:
            session.run(*pip, "-c", "constraints/cpu.txt", "-e", ".[cpu,sglang-jit]", external=True)
        session.run(*pip, "--no-deps", SGLANG, VLLM, external=True)  # the engine adapters' kernel files (tests,
        # nox -s sglang / vllm)
        stamp.write_text(_wanted())
    else:
        session.log(f"{VENV} is up to date (pyproject.toml and the pins unchanged)")

    bin_dir = (VENV / "bin").resolve()
    base = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(VENV.resolve())}

    def run(*args, env=None):
        session.run(str(py), *args, env={**base, **(env or {})}, external=True)

    return run


def _jobs() -> str:
    return os.environ.get("VP_JOBS", str(os.cpu_count() or 1) if DEVICE == "cpu" else "1")


# ``nox -s parity``'s profile on a CPU machine when neither ``--profile`` nor ``VP_PROFILE`` names one: every
# op and implementation on the whole catalog + 30 generated cases per op, about 4.4 CPU minutes (2-2.5 on 2 free cores)
# (docs/reports.md, "Where a CPU run's time goes"); the run's last lines say what ci and nightly add
CPU_PROFILE = "dev"


def parity_profile_args(args: list[str]) -> list[str]:
    """``--profile dev`` on a CPU machine unless the arguments or ``VP_PROFILE`` choose; nothing on a GPU (the
    harness's own default, ci, or ``VP_PROFILE``)."""
    chosen = os.environ.get("VP_PROFILE") or any(a == "--profile" or a.startswith("--profile=") for a in args)
    return [] if DEVICE != "cpu" or chosen else ["--profile", CPU_PROFILE]


@nox.session(venv_backend="none")
def parity(session: nox.Session) -> None:
    """Parity of every op: catalog + generated cases. Profile: ``-- --profile ci | nightly | dev`` or
    ``VP_PROFILE``; neither: dev on a CPU machine (the Triton interpreter: the whole catalog + 30 generated
    cases per op, about 4.4 CPU minutes), ci on a GPU."""
    run = _install(session)
    args = list(session.posargs or [])
    profile = parity_profile_args(args)
    if profile:
        session.log(f"CPU: --profile {CPU_PROFILE} (every op and implementation, the whole catalog + 30 generated "
                    f"cases per op); `-- --profile ci` or VP_PROFILE=ci for CI's depth (820 more generated cases, about 1.6x the CPU time)")
    run("-m", "harness", "run", "--device", DEVICE, "--jobs", _jobs(), "--csv", "runs/parity.csv",
        *profile, *args, env={"VP_DEVICE": DEVICE})


@nox.session(venv_backend="none")
def warmup(session: nox.Session) -> None:
    """Compile every Triton variant the parity plan launches into Triton's cache (TRITON_CACHE_DIR), once, in
    parallel, before a timed run; the plan takes `run`'s arguments (`-- --shard 1/2`). Nothing to do on the CPU."""
    run = _install(session)
    run("-m", "harness", "warmup", "--device", DEVICE, *session.posargs, env={"VP_DEVICE": DEVICE})


# ``VP_TESTS=all`` runs the tests marked ``slow`` too (the nightly's test step, gpu-run.yml, does); without it
# ``nox -s tests`` deselects them (docs/reports.md: which they are, and what else covers them in CI)
TESTS_ENV = "VP_TESTS"


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The harness's own tests (pytest-xdist: one worker per core, ``VP_WORKERS`` to change it). On a GPU
    machine they run on the GPU, every worker sharing it (docs/gpu-tests.md). Tests marked ``slow`` run only
    with ``VP_TESTS=all`` (the nightly)."""
    run = _install(session)
    workers = os.environ.get("VP_WORKERS", "auto")
    marks = [] if os.environ.get(TESTS_ENV) == "all" else ["-m", "not slow"]
    run("-m", "pytest", "-n", workers, "--dist", "worksteal", "-q", "--durations=15", *marks, *session.posargs,
        env={"VP_DEVICE": DEVICE, "VP_REQUIRE_SGLANG": "1", "VP_REQUIRE_VLLM": "1"})


@nox.session(venv_backend="none")
def sglang(session: nox.Session) -> None:
    """SGLang 0.5.23's own kernels over the ci profile, against their known-failure ledger
    (cases/ledgers/sglang.py): its Triton ones (harness.adapters.sglang: split-KV and shared-KV verify attention,
    the fused qk-norm-rope store) and its JIT-compiled CUDA ones (harness.adapters.sglang_jit: the fp8 KV/Q
    prepare, DeepSeek-V4's q and kv norm+RoPE, EAGLE's greedy tree verify; built first, timed, into VP_SGLANG_JIT_CACHE; refused in one line
    where the machine lacks CUDA, nvcc or SM90). Fails on any failure not in the ledger, and on a known failure
    that did not happen. runs/sglang.csv. `-- --generated 20` for a quick slice."""
    run = _install(session)
    run("-m", "harness.adapters.sglang_jit", "--head-dims", "64,128,256,512")
    run("-m", "harness", "run", "--device", DEVICE, "--profile", "ci", "--jobs", _jobs(),
        "--impl", "harness.adapters.sglang:IMPLS", "--impl", "harness.adapters.sglang_jit:IMPLS",
        "--ledger", "sglang", "--csv", "runs/sglang.csv", *session.posargs, env={"VP_DEVICE": DEVICE})


@nox.session(venv_backend="none")
def vllm(session: nox.Session) -> None:
    """vLLM 0.34.0's own kernels (harness.adapters.vllm: greedy rejection_sample, unified attention 2D/3D,
    the Triton MLA decode and folded verify kernels) over the ci profile, against their known-failure ledger
    (cases/ledgers/vllm.py): fails on any failure not in the ledger, and on a known failure that did not
    happen. runs/vllm.csv. `-- --generated 20` for a quick slice."""
    run = _install(session)
    run("-m", "harness", "run", "--device", DEVICE, "--profile", "ci", "--jobs", _jobs(),
        "--impl", "harness.adapters.vllm:IMPLS", "--ledger", "vllm", "--csv", "runs/vllm.csv",
        *session.posargs, env={"VP_DEVICE": DEVICE})


@nox.session(venv_backend="none")
def fuzz(session: nox.Session) -> None:
    """The bad-input fuzzer (harness/fuzz/) deeper than the tests: 8 drawn inputs per class, op and argument
    instead of 1, every call in a worker subprocess; fails on any crash, segfault, hang, wrong answer, partial write,
    refusal of a legal input or error not naming the argument. `-- --classes stride device` for a slice."""
    run = _install(session)
    run("-m", "harness.fuzz", "--device", DEVICE, "--examples", "8", "--jobs", _jobs(),
        *session.posargs, env={"VP_DEVICE": DEVICE})


@nox.session(venv_backend="none")
def mutants(session: nox.Session) -> None:
    """Every mutant against the suite; fails if any survives."""
    run = _install(session)
    run("-m", "harness", "mutants", "--device", DEVICE, "--csv", "runs/mutants.csv",
        *session.posargs, env={"VP_DEVICE": DEVICE})


@nox.session(venv_backend="none")
def compile(session: nox.Session) -> None:
    """Compile every kernel for sm90, gfx942 and gfx950 (no GPU needed)."""
    run = _install(session)
    env = {"TRITON_INTERPRET": "0", "VP_DEVICE": "compile"}
    run("-m", "harness", "compile", *session.posargs, env=env)


@nox.session(venv_backend="none")
def report(session: nox.Session) -> None:
    """runs/report/{report.html, junit.xml, merged.parquet, diff.csv} from the results in runs/: parity*.csv
    and parity*.parquet (shards merged), and mutants*.csv, perf*.csv, gate*.csv, kill_matrix*.csv,
    timelines*.csv[.gz] when present. `-- --baseline OLD/merged.parquet` (or a CSV) diffs against a previous
    run and fails on any REGRESS."""
    run = _install(session)
    parity = sorted(glob.glob("runs/parity*.csv") + glob.glob("runs/parity*.parquet"))
    if not parity:
        session.error("no runs/parity*.csv or runs/parity*.parquet: run `nox -s parity` (or its shards) first")
    args = [a for p in parity for a in ("--csv", p)]
    for flag, pattern in (("--mutants", "runs/mutants*.csv"), ("--perf", "runs/perf*.csv"), ("--gate", "runs/gate*.csv"),
                          ("--kill-matrix", "runs/kill_matrix*.csv"), ("--timelines", "runs/timelines*.csv*")):
        args += [a for p in sorted(glob.glob(pattern)) for a in (flag, p)]
    run("-m", "harness", "report", *args, "--out", "runs/report", *session.posargs)


@nox.session(venv_backend="none")
def gate(session: nox.Session) -> None:
    """End-to-end gate: micro-models on held-out GSM8K-style problems through the reference,
    fused and path-mutant paths; runs/gate.csv. Profile: cpu-lite on the CPU, full on a GPU
    (`-- --profile full`). On the CPU the generation runs go to one process per core (VP_JOBS)."""
    run = _install(session)
    run("-m", "harness", "gate", "--device", DEVICE, "--jobs", _jobs(), "--csv", "runs/gate.csv",
        *session.posargs, env={"VP_DEVICE": DEVICE})


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """GPU-only checks: launch counts (torch.profiler), CUDA/HIP graph capture + replay with new inputs
    vs eager (the gate's decision included), full-size determinism; planted mutants must be flagged.
    runs/gpu/gpu_checks.csv. On a machine without a GPU it says so and checks nothing."""
    run = _install(session)
    run("-m", "harness", "gpu", "--out", "runs/gpu", *session.posargs)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Benchmarks of every op (fused vs reference chain vs torch.compile of it, side by side in one run):
    runs/perf.csv (PerfRow per mode, eager and graph-replayed: p50, ratios, bandwidth vs measured copy
    bandwidth, launches) and runs/table.csv, the table of ours per op and shape it prints last.
    `-- --quick` for the small set. Needs a GPU (without one it says so and measures nothing)."""
    run = _install(session)
    run("-m", "harness", "bench", "--out", "runs", *session.posargs)


@nox.session(venv_backend="none")
def nightly(session: nox.Session) -> None:
    """The whole nightly in one run (GPU runners): parity per op, timelines per family, GPU-only checks
    and the gate concurrently, then benchmarks alone, then runs/nightly/report (HTML, JUnit, merged CSV).
    `-- --budget-s 600`, `-- --baseline OLD/merged.csv`; on a CPU machine `-- --profile dev`."""
    run = _install(session)
    run("-m", "harness", "nightly", "--device", DEVICE, "--out", "runs/nightly", *session.posargs,
        env={"VP_DEVICE": DEVICE})


@nox.session(venv_backend="none", default=False)
def dev(session: nox.Session) -> None:
    """Make (or bring up to date) the one environment, .venv, and say how to use it: `source .venv/bin/activate`
    gives a shell where `python -m harness ...`, `verify-parity ...` and every printed repro line run."""
    run = _install(session)
    run("-c", "import harness, torch; print('verify-parity in', harness.__path__[0], '| torch', torch.__version__)")
    session.log(f"your shell: source {VENV}/bin/activate   (then: verify-parity list, or a repro line as printed)")
