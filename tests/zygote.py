"""``python -m harness ...`` for the tests, without each run paying for ``import torch``.

A CLI test's process spends ~1.6-2 s of its ~2.5 s of start-up importing torch and numpy (2-core CI
machine, 2026-12-07); the suite starts about a hundred of them. A zygote is a fresh interpreter, started
once per test worker, that imports those two (not Triton, nothing of the harness, nothing of pytest) and
then forks one child per run; one zygote per value of the environment torch reads when it loads
(``IMPORT_TIME_ENV``: thread counts). The child takes the run's environment, working directory, ``sys.path``
(the directory first, then ``PYTHONPATH``, then the interpreter's own) and standard streams
(``/dev/null`` in, files out), and runs the ``harness`` package as ``__main__`` exactly as ``-m``
does, then exits through the interpreter's normal shutdown: the exit code, an uncaught exception's
traceback and ``atexit`` behave as in a fresh process. Every harness module is imported inside the
child, after its environment is set (``TRITON_INTERPRET`` and ``VP_DEVICE`` included).

Used only where a machine has no CUDA device (a fork after CUDA starts is unsafe, and GPU runners
have the cores to spare) and ``VP_TEST_ZYGOTE`` is not ``0``. Tests that need a process started from a
shell line (a printed repro run as printed, interpreter flags such as ``-X importtime``, signals sent
to a running CLI) keep ``subprocess``.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

SERVER = r"""
import json, os, sys
import numpy, torch  # what every CLI process imports first; not triton: triton.language decorates its own
# helpers with @jit at import, interpreted or compiled as TRITON_INTERPRET says then, which is the child's to set

_own = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
BASE = [p for p in sys.path[1:] if p not in _own]  # the interpreter's own entries (stdlib, site-packages)


def _line(fd):
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            raise SystemExit(0)  # the test worker has gone
        buf += chunk
    return json.loads(buf)


def _child(req):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    sys.path[:] = [req["cwd"], *[p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p], *BASE]
    import importlib
    import runpy

    importlib.invalidate_caches()
    sys.argv = ["-m", *req["args"]]  # run_module puts the module's path in argv[0], as -m does
    runpy.run_module("harness", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


while True:
    req = _line(0)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _child(req)
    os.write(1, (json.dumps({"pid": pid}) + "\n").encode())
    _, status = os.waitpid(pid, 0)
    os.write(1, (json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n").encode())
"""


def usable() -> bool:
    if os.environ.get("VP_TEST_ZYGOTE", "1") == "0" or not hasattr(os, "fork"):
        return False
    import torch

    return not torch.cuda.is_available()


# read when torch loads, not later: OpenMP's and torch's thread counts (a child given OMP_NUM_THREADS=1 by a
# zygote started without it ran 2 intra-op threads on the 2-core machine, and the suite slowed by ~10 %)
IMPORT_TIME_ENV = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH_", "PYTORCH_")


def import_time_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of ``env`` that torch reads at import: one zygote per distinct value of it."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)))


class Zygote:
    """One zygote process (module docstring), started with ``imported`` (``import_time_env``) as that part
    of its environment; ``run`` is ``subprocess.run(capture_output=True, text=True)`` of ``python -m harness
    *args``."""

    def __init__(self, imported: tuple[tuple[str, str], ...]):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and not k.startswith(IMPORT_TIME_ENV)}
        env.update(imported)
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, bufsize=0)
        self.buf = b""

    def _line(self, deadline: float | None) -> dict | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the test zygote exited (code {self.proc.wait()})")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, args: list[str], *, cwd, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "harness", *args]
        with tempfile.TemporaryDirectory(prefix="vp-zygote-") as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            req = {"args": args, "cwd": os.fspath(cwd), "env": env, "stdout": out, "stderr": err}
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            started = self._line(time.monotonic() + 300)  # the first request waits for the zygote's imports
            if started is None:
                raise RuntimeError("the test zygote did not answer within 300 s")
            pid = started["pid"]
            done = self._line(time.monotonic() + timeout)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self._line(None)
            read = lambda p: open(p, encoding="utf-8", errors="replace").read()  # noqa: E731
            if done is None:
                raise subprocess.TimeoutExpired(cmd, timeout, output=read(out), stderr=read(err))
            return subprocess.CompletedProcess(cmd, done["rc"], read(out), read(err))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_ZYGOTES: dict[tuple, Zygote] = {}  # by import_time_env


def run_harness(args, *, cwd, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m harness *args`` in ``cwd`` with exactly ``env``, output captured as text: through the
    zygote started with ``env``'s import-time part where ``usable()``, else a plain subprocess."""
    args = [str(a) for a in args]
    if not usable():
        return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    key = import_time_env(env)
    z = _ZYGOTES.get(key)
    if z is None or z.proc.poll() is not None:
        z = _ZYGOTES[key] = Zygote(key)
        atexit.register(z.close)
    return z.run(args, cwd=cwd, env=env, timeout=timeout)
