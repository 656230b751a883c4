"""Tasks in worker processes, each result handed back as soon as it completes, each task under a
time limit.

``run(fn, tasks, jobs)`` yields ``(index, outcome)`` in completion order, never in submission
order: one slow or hung task holds back nothing else, and a caller stopped by Ctrl-C or SIGTERM
still has every result that completed before it. ``outcome`` is ``fn(task)``, or a ``Lost``:

  timeout  the task ran past ``timeout_s``. Its worker's Python stack (every thread) is taken
           first: ``py-spy dump`` when py-spy is on PATH, then faulthandler (registered on
           SIGUSR1 in every worker, so it answers even from inside a C call such as a GPU sync),
           written to ``stack_dir/<name(task)>.txt``; then the worker is killed and replaced.
  died     the worker process ended mid-task (a segfault, an abort, the OOM killer).

A task may ``emit(obj)`` partial results while it runs; a ``Lost`` carries what its task emitted
(a parity case reports each implementation as it finishes: those before a hang keep their rows).
An exception raised by ``fn`` is raised again in the caller, as from ``concurrent.futures``.

Workers are spawned (``multiprocessing`` "spawn": no CUDA state is forked) and each runs
``initializer(*initargs)`` once. ``jobs <= 1`` without ``isolate`` runs the tasks in this process,
where the limit is a SIGALRM that interrupts Python code only (a hang inside a C call outlives
it: ``isolate=True`` runs even one job in a worker process, which can be killed).
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path

STACK_WAIT_S = 3.0  # how long a timed-out worker gets to write its stack before it is killed


@dataclass(frozen=True)
class Lost:
    """A task that yielded no result: ``reason`` "timeout" (past the limit; the worker was killed)
    or "died" (the worker process ended). ``parts``: what the task ``emit``-ted before."""
    reason: str
    seconds: float  # from the task's start to the verdict
    detail: str  # one line: the limit or the exit code, and where the stack is
    stack: str = ""  # the worker's Python stack at the limit ("" when none could be taken)
    stack_path: str = ""
    parts: tuple = ()

    def innermost(self, n: int = 2) -> str:
        """The last ``n`` ``File ..., line ...`` frames of the stack's current thread, innermost first."""
        return innermost_frames(self.stack, n)


def innermost_frames(stack: str, n: int = 2) -> str:
    """faulthandler prints the innermost frame first, ``traceback`` last: both give innermost first here."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack)
    cur = next((b for b in blocks if b.startswith("Current thread")), blocks[0] if blocks else "")
    frames = [ln.strip() for ln in cur.splitlines() if ln.strip().startswith("File ")]
    if "most recent call first" not in cur:
        frames.reverse()
    return " <- ".join(frames[:n])


_EMIT = None  # set while a task runs: how emit() reaches the caller


def emit(obj) -> None:
    """Hand a partial result of the running task to the caller (kept if the task is ``Lost``)."""
    if _EMIT is not None:
        _EMIT(obj)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", name)[:150] or "task"


def _stack_file(stack_dir, name: str, text: str) -> str:
    if not stack_dir or not text:
        return ""
    d = Path(stack_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{_safe(name)}.txt"
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------- worker side

def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when its parent dies (a SIGKILLed run leaves no hung workers)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(conn, fn, initializer, initargs, stack_path: str) -> None:
    global _EMIT
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us
    _die_with_parent()
    fh = open(stack_path, "w")  # noqa: SIM115 (faulthandler writes to it until the process ends)
    faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
    try:
        if initializer is not None:
            initializer(*initargs)
    except BaseException:
        conn.send(("init-error", None, traceback.format_exc()))
        return
    conn.send(("ready", None, None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        i, task = msg
        _EMIT = lambda obj, i=i: conn.send(("part", i, obj))  # noqa: E731
        try:
            out = ("done", i, fn(task))
        except BaseException as exc:
            tb = traceback.format_exc()
            try:
                pickle.dumps(exc)
            except Exception:
                exc = None
            out = ("error", i, (exc, tb))
        _EMIT = None
        try:
            conn.send(out)
        except Exception as exc:  # an unpicklable result
            conn.send(("error", i, (None, f"task {i}: its result cannot be sent back: {exc!r}")))


# ----------------------------------------------------------------------------- caller side

class _Worker:
    def __init__(self, ctx, fn, initializer, initargs, tmp: str):
        fd, self.stack_file = tempfile.mkstemp(prefix="stack-", suffix=".txt", dir=tmp)
        os.close(fd)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, fn, initializer, initargs, self.stack_file))
        self.proc.start()
        child.close()
        self.ready = False
        self.task: int | None = None
        self.t0 = 0.0
        self.parts: list = []

    def start(self, i: int, task) -> None:
        self.conn.send((i, task))
        self.task, self.t0, self.parts = i, time.monotonic(), []

    def messages(self):
        """Every message the worker has sent so far; ("eof", ...) once its end of the pipe is closed."""
        try:
            while self.conn.poll():
                yield self.conn.recv()
        except (EOFError, OSError):
            yield ("eof", None, None)

    def stack(self) -> str:
        """py-spy's dump (when installed) and faulthandler's, of the worker as it is now."""
        text = ""
        pid = self.proc.pid
        spy = shutil.which("py-spy")
        if spy:
            try:
                r = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
                text = f"py-spy dump --pid {pid}:\n{r.stdout}{r.stderr}\n" if r.stdout or r.stderr else ""
            except (OSError, subprocess.SubprocessError):
                pass
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            return text
        deadline, size = time.monotonic() + STACK_WAIT_S, -1
        while time.monotonic() < deadline:  # until the dump stops growing
            time.sleep(0.1)
            now = os.path.getsize(self.stack_file)
            if now and now == size:
                break
            size = now
        return f"faulthandler (pid {pid}):\n{Path(self.stack_file).read_text(errors='replace')}" + \
            (f"\n{text}" if text else "")

    def ask_to_stop(self) -> None:
        """Tell an idle worker to exit, without waiting for it (``stop`` waits)."""
        if self.proc.is_alive() and self.task is None:  # a second None (from stop) is never read
            with contextlib.suppress(OSError):
                self.conn.send(None)

    def stop(self, now: bool = False) -> None:
        if self.proc.is_alive() and not now and self.task is None:
            self.ask_to_stop()
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


def run(fn, tasks: list, jobs: int, *, initializer=None, initargs: tuple = (), timeout_s: float | None = None,
        stack_dir=None, name=lambda task: "task", isolate: bool = False, poll_s: float = 0.2):
    """``(index, fn(task) or Lost)`` for every task, in completion order (module docstring).
    ``name(task)`` names a timed-out task's stack file in ``stack_dir``."""
    if not tasks:
        return
    if jobs <= 1 and not isolate:
        yield from _in_process(fn, tasks, timeout_s, stack_dir, name)
        return
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="vp-pool-")
    pending = deque(range(len(tasks)))
    left = len(tasks)  # tasks not yet yielded
    workers: list[_Worker] = []
    try:
        workers = [_Worker(ctx, fn, initializer, initargs, tmp) for _ in range(min(max(jobs, 1), len(tasks)))]
        while left:
            for w in workers:
                if w.ready and w.task is None and pending:
                    i = pending.popleft()
                    w.start(i, tasks[i])
            wait([w.conn for w in workers] + [w.proc.sentinel for w in workers], timeout=poll_s)
            for k, w in enumerate(workers):
                eof = False
                for kind, i, payload in w.messages():
                    if kind == "ready":
                        w.ready = True
                    elif kind == "part":
                        w.parts.append(payload)
                    elif kind == "done":
                        w.task = None
                        left -= 1
                        yield i, payload
                    elif kind == "error":
                        exc, tb = payload
                        raise (exc if exc is not None else RuntimeError(tb)) from RuntimeError(
                            f"in a worker process, task {i}:\n{tb}")
                    elif kind == "init-error":
                        raise RuntimeError(f"a worker process failed to start:\n{payload}")
                    else:
                        eof = True
                lost = None
                if eof or not w.proc.is_alive():
                    w.proc.join(5)
                    if w.task is None and not w.ready:
                        raise RuntimeError(f"a worker process ended during start-up (exit code {w.proc.exitcode})")
                    if w.task is not None:
                        secs = time.monotonic() - w.t0
                        lost = Lost("died", secs, f"the worker process ended (exit code {w.proc.exitcode}) "
                                                  f"{secs:.1f} s into the task", parts=tuple(w.parts))
                elif w.task is not None and timeout_s and time.monotonic() - w.t0 > timeout_s:
                    secs = time.monotonic() - w.t0
                    stack = w.stack()
                    path = _stack_file(stack_dir, name(tasks[w.task]), stack)
                    lost = Lost("timeout", secs, f"no result in {secs:.0f} s (limit {timeout_s:g} s): the worker "
                                                 f"was killed" + (f"; stack: {path}" if path else ""),
                                stack=stack, stack_path=path, parts=tuple(w.parts))
                else:
                    continue
                i, w.task = w.task, None
                w.stop(now=True)
                workers[k] = _Worker(ctx, fn, initializer, initargs, tmp) if pending else None
                if lost is not None:
                    left -= 1
                    yield i, lost
            workers = [w for w in workers if w is not None]
    finally:
        for w in filter(None, workers):  # every idle worker exits at once, then each is waited for (<= 5 s)
            w.ask_to_stop()
        for w in filter(None, workers):
            w.stop(now=w.task is not None)
        shutil.rmtree(tmp, ignore_errors=True)


class _Expired(BaseException):
    """Raised by SIGALRM in the running task (a BaseException: the task's own ``except Exception``
    must not swallow it)."""

    def __init__(self, stack: str):
        super().__init__("task time limit")
        self.stack = stack


def _in_process(fn, tasks, timeout_s, stack_dir, name):
    global _EMIT
    armed = (timeout_s and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
             and signal.getitimer(signal.ITIMER_REAL)[0] == 0)  # someone else's timer (pytest-timeout) wins

    def expire(signum, frame):
        raise _Expired("Current thread (most recent call last):\n" + "".join(traceback.format_stack(frame)))

    for i, task in enumerate(tasks):
        parts: list = []
        _EMIT = parts.append
        prev = signal.signal(signal.SIGALRM, expire) if armed else None
        t0 = time.monotonic()
        try:
            if armed:
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                out = fn(task)
            finally:
                if armed:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except _Expired as exp:
            secs = time.monotonic() - t0
            path = _stack_file(stack_dir, name(task), exp.stack)
            out = Lost("timeout", secs, f"no result in {secs:.0f} s (limit {timeout_s:g} s): interrupted"
                                        + (f"; stack: {path}" if path else ""),
                       stack=exp.stack, stack_path=path, parts=tuple(parts))
        finally:
            _EMIT = None
            if armed:
                signal.signal(signal.SIGALRM, prev)
        yield i, out


