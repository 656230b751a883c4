"""A private CUDA MPS daemon for the nightly's concurrent steps.

Without MPS, the ~40 processes of the nightly's correctness phase each hold their own CUDA context and
the GPU time-slices between them: one context's kernels run at a time, and the GPU reads as busy while
it switches. Under MPS (NVIDIA's Multi-Process Service) the processes' work shares one context on the
device, their kernels run side by side, and the host becomes the limit (measured on one H200, the
nightly's phase-0 steps for 70 s each side by side: docs/nightly.md).

``daemon(mode, root)`` starts ``nvidia-cuda-mps-control -d`` with its pipe and log directories under
``root`` (nothing else on the machine talks to it: only processes whose environment names that pipe
directory become its clients), yields the environment the steps need, and quits the daemon when the
block ends, even on an exception. It changes no device setting (compute mode, MIG, clocks).

Modes: ``off`` starts nothing; ``on`` requires the control binary (``MpsUnavailable`` names what is
missing); ``auto`` starts it when the binary is on PATH and the device is an NVIDIA GPU, else runs
without. A caller that already runs an MPS daemon (``CUDA_MPS_PIPE_DIRECTORY`` set) keeps its own.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
MODES = ("off", "on", "auto")


class MpsUnavailable(RuntimeError):
    """``--mps on`` where no MPS daemon can be started."""


def _control(env: dict, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CONTROL, *args], input=stdin, capture_output=True, text=True, env=env, timeout=30)


@contextlib.contextmanager
def daemon(mode: str, root: Path, *, device: str = "cuda", log=print) -> Iterator[dict]:
    """Yields the environment to add to the steps that should be MPS clients ({} when none)."""
    if mode not in MODES:
        raise ValueError(f"mps: expected one of {MODES}, got {mode!r}")
    if mode == "off":
        yield {}
        return
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        log(f"mps: using the caller's daemon (CUDA_MPS_PIPE_DIRECTORY={os.environ['CUDA_MPS_PIPE_DIRECTORY']})")
        yield {}
        return
    why = None
    if device != "cuda":
        why = f"device is {device!r}, not an NVIDIA GPU"
    elif shutil.which(CONTROL) is None:
        why = f"{CONTROL} is not on PATH"
    if why:
        if mode == "on":
            raise MpsUnavailable(f"mps: --mps on, but {why}")
        log(f"mps: off ({why})")
        yield {}
        return
    root = Path(root).resolve()
    add = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    for d in add.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **add)
    r = _control(env, "-d")
    if r.returncode != 0:
        msg = f"mps: {CONTROL} -d exited {r.returncode}: {(r.stderr or r.stdout).strip()}"
        if mode == "on":
            raise MpsUnavailable(msg)
        log(msg + "; running without")
        yield {}
        return
    log(f"mps: on (a private daemon, pipe {add['CUDA_MPS_PIPE_DIRECTORY']})")
    try:
        yield add
    finally:
        q = _control(env, stdin="quit\n")
        if q.returncode != 0:
            log(f"mps: quit exited {q.returncode}: {(q.stderr or q.stdout).strip()}")
