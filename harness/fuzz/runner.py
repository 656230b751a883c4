"""The worker subprocess (``worker_main``: one job a line on stdin, one JSON answer a line), its
handle in the parent (``Worker``: restarted after a crash or a hang, so a segfault is a result),
and ``run``: every job of a plan through a pool of workers."""
from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from harness.fuzz.call import GOOD, device_fault, execute
from harness.fuzz.strategies import CLASSES, Job

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 60.0


def worker_main(device_kind: str) -> int:
    """Read one job (a JSON line) from stdin at a time, answer one JSON line on the original
    stdout; everything else (prints, warnings, tracebacks) goes to stderr."""
    import faulthandler

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    faulthandler.enable()
    from harness import devices

    device = devices.select(device_kind)
    import fused  # noqa: F401 - Triton prepared before any kernel import

    from harness.devices import synchronize

    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        job = Job.from_dict(json.loads(line))
        t0 = time.perf_counter()
        try:
            res = execute(job, device)
            synchronize(device)  # a fault of the call that surfaces only now is still the call's
        except Exception as e:  # noqa: BLE001 - the harness itself failed on this job: say so
            where = traceback.extract_tb(e.__traceback__)[-1]
            res = {"outcome": "segfault", "detail": f"device fault: {type(e).__name__}: {e}", "fatal": True} \
                if device_fault(e) else \
                {"outcome": "crash", "detail": f"harness error building or checking the call "
                                               f"({Path(where.filename).name}:{where.lineno}): {type(e).__name__}: {e}"}
        res["seconds"] = round(time.perf_counter() - t0, 4)
        fatal = res.pop("fatal", False)
        proto.write(json.dumps(res) + "\n")
        proto.flush()
        if fatal:  # a CUDA fault poisons the context: end here, the parent starts a fresh worker
            os._exit(3)
    return 0


class Worker:
    """One long-lived worker subprocess; ``run`` sends it a job and waits up to ``timeout`` seconds.
    A worker that died (segfault, abort) or hung (then killed) is replaced on the next job."""

    START_TIMEOUT_S = 300.0

    def __init__(self, device: str):
        self.device = device
        self.proc: subprocess.Popen | None = None
        self.err = None
        self.buf = b""

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
        self.err = tempfile.TemporaryFile()
        self.buf = b""
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.fuzz", "--worker", "--device", self.device],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, cwd=ROOT, env=env)
        ready = self._read(self.START_TIMEOUT_S)
        if not isinstance(ready, dict) or not ready.get("ready"):
            raise RuntimeError(f"bad-input worker did not start: {ready!r}; stderr: {self._stderr_since(0)[-3000:]}")

    def _stderr_since(self, offset: int) -> str:
        if self.err is None:
            return ""
        self.err.seek(offset)
        return self.err.read().decode(errors="replace")

    def _death(self, text: str) -> str:
        """faulthandler's report of a dying worker, shortened: the error and the innermost frames."""
        lines = [ln.strip() for ln in text.splitlines()]
        fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
        frames = [ln for ln in lines if ln.startswith('File "')][:3]
        return "; ".join(fatal[:1] + frames) or " | ".join(lines[-4:])

    def _read(self, timeout: float):
        """A JSON line, None on timeout, "eof" when the process ended."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return "eof"
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def run(self, job: Job, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.err.seek(0, os.SEEK_END)
        err_at = self.err.tell()
        try:
            self.proc.stdin.write((json.dumps(job.as_dict()) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        got = self._read(timeout)
        if got is None:
            self.stop()
            return {"outcome": "hang", "detail": f"no answer within {timeout:g} s (worker killed)"}
        if got == "eof":
            rc = self.proc.wait()
            why = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
            self.proc = None
            return {"outcome": "segfault", "detail": f"worker died ({why}): {self._death(self._stderr_since(err_at))}"}
        return got


# ----------------------------------------------------------------------------- every job of a plan, through a pool

@dataclass
class Result:
    job: Job
    outcome: str
    detail: str
    expect: str
    seconds: float = float("nan")
    repro: str = ""

    @property
    def bad(self) -> bool:
        return self.outcome not in GOOD


def repro_line(job: Job, device: str, timeout: float) -> str:
    t = "" if timeout == DEFAULT_TIMEOUT_S else f" --timeout {timeout:g}"
    return f"python -m harness.fuzz --device {device}{t} --one {shlex.quote(json.dumps(job.as_dict()))}"


def run(jobs: list[Job], *, device: str, timeout: float = DEFAULT_TIMEOUT_S, stop_after: int = 0, workers: int = 1,
        progress: Callable[[Result], None] | None = None) -> list[Result | None]:
    """Run every job in worker subprocesses. ``stop_after`` > 0: once a (class, op) has that many bad
    outcomes, its remaining jobs are skipped (None in the result list)."""
    bad_count: Counter = Counter()
    pool = [Worker(device) for _ in range(max(1, workers))]
    free = list(pool)
    import threading

    lock = threading.Lock()

    def one(job: Job) -> Result | None:
        key = (job.cls, job.op)
        with lock:
            if stop_after and bad_count[key] >= stop_after:
                return None
            w = free.pop()
        try:
            got = w.run(job, timeout)
        finally:
            with lock:
                free.append(w)
        res = Result(job, got["outcome"], got.get("detail", ""), CLASSES[job.cls].expected(job.op),
                     got.get("seconds", float("nan")))
        if res.bad:
            res.repro = repro_line(job, device, timeout)
            with lock:
                bad_count[key] += 1
        if progress:
            progress(res)
        return res

    try:
        with ThreadPoolExecutor(max_workers=len(pool)) as ex:
            return list(ex.map(one, jobs))
    finally:
        for w in pool:
            w.stop()
