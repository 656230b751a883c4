"""Command-line arguments, checked before any work starts: argparse with one-line errors,
typed values (``--shard i/n``, counts, output paths) and the error for what only shows after
parsing (an unknown implementation, a bad environment variable).

A usage error is one line on stderr, ``PROG: error: MESSAGE``, and exit status 2, whether
argparse finds it (``ArgumentParser``) or the command does (``UsageError``, caught by
``main``). Output paths are checked at parse time, so that a run never ends on a path it
cannot write: ``output_file`` refuses a directory and a path under a file or an unwritable
directory; nothing is created until the command writes.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path



class UsageError(ValueError):
    """A command-line argument (or the environment variable that stands for one) that cannot
    work, found after parsing. ``arg`` names it: ``--impl``, ``VP_PROFILE``, a file. (Not an op's
    ``VerifyParityInputError``, whose module imports torch: ``--help`` imports none.)"""

    def __init__(self, arg: str, message: str):
        self.arg = arg
        super().__init__(f"{arg}: {message}")


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line (``--help`` still prints the usage) and that takes no abbreviated
    option (argparse's default would read ``timelines --case 5`` as ``--case-timeout-s 5``: a silently
    accepted mistake); subparsers inherit both."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def one_line(message) -> str:
    """A message as one line (a plugin's exception, an argument with a newline in it)."""
    return " | ".join(part for part in str(message).splitlines() if part.strip())


def usage_errors() -> tuple[type[BaseException], ...]:
    """What ``main`` turns into one line and exit 2: usage errors, the ops' typed input errors, a device
    not present. The input errors' module (it imports torch) is not imported here: one was raised only where
    it had been, and ``list``'s errors come without torch."""
    from harness.devices import DeviceUnavailable

    checks = sys.modules.get("reference.checks")
    return (UsageError, DeviceUnavailable) + ((checks.VerifyParityInputError,) if checks is not None else ())


def guarded(prog: str, fn: Callable[..., int], *args) -> int:
    """``fn(*args)``, with a usage error found after parsing printed as one line (exit 2)."""
    try:
        return fn(*args)
    except usage_errors() as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `verify-parity list | head`: the reader left; no traceback, no flush error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low``."""
    def parse(text: str) -> int:
        v = _int(text)
        if v < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return v

    parse.__name__ = f"int>={low}"
    return parse


positive_int = at_least(1)
count = at_least(0)


def port(text: str) -> int:
    v = _int(text)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535 (0: any free one), got {text!r}")
    return v


def finite_float(low: float, *, strict: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite float >= ``low`` (> ``low`` with ``strict``)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v) or v < low or (strict and v == low):
            raise argparse.ArgumentTypeError(f"expected a finite number {'>' if strict else '>='} {low:g}, "
                                             f"got {text!r}")
        return v

    return parse


def shard(text: str) -> str:
    """``i/n`` with 1 <= i <= n (``harness.parity.suite.shard``: the i-th of n slices, 1-based), as "i/n"."""
    parts = text.split("/")
    try:
        i, n = (int(x) for x in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        i = n = None
    if i is None or not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"expected i/n with 1 <= i <= n (the i-th of n slices), got {text!r}")
    return f"{i}/{n}"


def env_int(name: str, default: int, parse: Callable[[str], int] = positive_int) -> int:
    """An integer default from the environment (e.g. ``VP_JOBS``), checked like the flag."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(name, str(exc)) from None


def _creatable(path: Path, what: str) -> None:
    """``path`` does not exist: its nearest existing ancestor must be a writable directory."""
    anc = path.absolute().parent
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create {what} {str(path)!r}: {str(anc)!r} is a file")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot create {what} {str(path)!r}: directory {str(anc)!r} is not writable")


def _writable(text: str, what: str, mode: int, denied: str) -> str:
    """``text`` as given: an existing path that grants ``mode`` (else ``denied``), or one ``_creatable``."""
    p = Path(text)
    if p.exists():
        if not os.access(p, mode):
            raise argparse.ArgumentTypeError(denied)
        return text
    _creatable(p, what)
    return text


def output_file(text: str) -> str:
    """An argparse ``type``: a file the command will write (checked now, created later)."""
    if not text or Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; expected a file path")
    return _writable(text, "file", os.W_OK, f"{text!r} is not writable")


def output_dir(text: str) -> str:
    """An argparse ``type``: a directory the command will write into (checked now, created later)."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; expected a directory")
    return _writable(text, "directory", os.W_OK | os.X_OK, f"directory {text!r} is not writable")


def input_file(text: str) -> str:
    """An argparse ``type``: an existing, readable file."""
    p = Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"no such file {text!r}")
    if not p.is_file() or not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text!r} is not a readable file")
    return text


def input_dir(text: str) -> str:
    """An argparse ``type``: an existing directory."""
    p = Path(text)
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; expected a directory" if p.exists()
                                         else f"no such directory {text!r}")
    return text
