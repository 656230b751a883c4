"""Small helpers for the harness's own tests."""
from __future__ import annotations

import fcntl
import os
import pickle
from pathlib import Path

import pytest
import torch

from harness.parity import runners

ROOT = Path(__file__).resolve().parents[1]


def harness_cli(args, *, cwd=ROOT, env: dict[str, str] | None = None, timeout: float = 600):
    """``python -m harness *args`` as a user runs it from ``cwd`` with ``env`` (default: this process's), output
    captured as text (``subprocess.CompletedProcess``). A fresh process, forked from ``tests.zygote`` where the
    machine has no CUDA device (without the ~2 s of ``import torch`` each)."""
    from tests import zygote

    return zygote.run_harness(args, cwd=cwd, env=dict(os.environ) if env is None else env, timeout=timeout)


def harness_imports(*args, cwd=ROOT, env: dict[str, str] | None = None, timeout: float = 300):
    """``python -X importtime -m harness *args`` (a fresh interpreter: no zygote, whose torch is imported
    already) -> the process and the top-level names of every module it imported."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", *map(str, args)], cwd=cwd,
                       capture_output=True, text=True, env=env or subprocess_env(), timeout=timeout)
    imported = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    return r, imported


def subprocess_env(*front: str | Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: this checkout (and ``front``) first on PYTHONPATH,
    the caller's PYTHONPATH kept after it (a runner that provides packages through PYTHONPATH
    keeps them), ``extra`` set."""
    path = [str(x) for x in (*front, ROOT)] + [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def failed_checks(spec, impl, case, device) -> list[str]:
    res = runners.run_case(spec, impl, case, device)
    assert not res.refused, f"{impl.key} refused {case}: {res.refused}"
    return [r.check for r in res.records if not r.passed]


def assert_passes(spec, impl, case, device) -> None:
    res = runners.run_case(spec, impl, case, device)
    assert not res.refused, f"{impl.key} refused {case}: {res.refused}"
    bad = [r for r in res.records if not r.passed]
    assert not bad, "\n".join(f"{r.check}: err={r.err:.4g} allowed={r.allowed:.4g} {r.detail} {r.worst}" for r in bad)
    assert res.records, "no check ran"


def assert_bad_input_named(fn, kw, arg, make, err, *, kept: str = "") -> None:
    """``fn(**kw)`` with ``kw[arg] = make(kw)`` raises ``err`` naming ``arg``; when ``kept`` names a
    buffer the call writes (other than ``arg``), its bytes are as before: no partial write."""
    before = kw[kept].view(torch.uint8).clone() if kept else None
    kw[arg] = make(kw)
    with pytest.raises(err) as info:
        fn(**kw)
    assert info.value.arg == arg
    if kept and arg != kept:
        assert torch.equal(kw[kept].view(torch.uint8), before), f"{kept} written before {arg} was refused"


def bad_inputs(table: list) -> pytest.MarkDecorator:
    """Parametrises a test over ``table``'s (argument, make, error) rows as ``arg, make, err``, each
    row's id its argument and its index in the table."""
    return pytest.mark.parametrize("arg,make,err", table, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(table)])


def once_per_session(name: str, worker_id: str, tmp_path_factory, compute):
    """``compute()`` once per pytest session, its value shared by every xdist worker (pytest-xdist's recipe:
    a file in the session's temporary root, under a lock). A module fixture recomputed in each worker that
    takes one of its module's tests cost the fuzzer's sweep 9 recomputations on a 16-worker GPU host."""
    if worker_id == "master":  # no xdist: one process
        return compute()
    root = tmp_path_factory.getbasetemp().parent  # shared by this session's workers only
    path = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return pickle.loads(path.read_bytes())
        value = compute()
        path.write_bytes(pickle.dumps(value))
        return value



VLLM_MISSING = "vllm is not installed (pip install --no-deps vllm==0.34.0)"


def vllm_kernels_load() -> bool:
    """vLLM's kernel files load through ``harness.adapters.vllm.load``; with ``VP_REQUIRE_VLLM=1`` (CI) their
    absence is an error, not a skip."""
    from harness.adapters import vllm

    try:
        vllm.load()
    except vllm.VLLMUnavailable:
        if os.environ.get("VP_REQUIRE_VLLM") == "1":
            raise
        return False
    return True
