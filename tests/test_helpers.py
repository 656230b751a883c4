"""tests/helpers.py's own parts that the suite's speed rests on."""
from __future__ import annotations

from tests.helpers import once_per_session


class _Session:
    """A stand-in for pytest's tmp_path_factory under xdist: each worker's base temp in one session root."""

    def __init__(self, root, worker):
        self.base = root / f"popen-{worker}"

    def getbasetemp(self):
        return self.base


def test_once_per_session_computes_once_for_every_worker(tmp_path):
    """Workers gw0 and gw1 of one session ask for the same value: computed once, read back by the other (a
    fresh copy); without xdist ("master") it is computed in place. Planted: a file per worker (or no file)
    computes it twice."""
    calls = []

    def compute():
        calls.append(1)
        return {"rows": [1, 2, 3]}

    first = once_per_session("value", "gw0", _Session(tmp_path, "gw0"), compute)
    second = once_per_session("value", "gw1", _Session(tmp_path, "gw1"), compute)
    assert first == second == {"rows": [1, 2, 3]} and first is not second and len(calls) == 1
    assert once_per_session("value", "master", _Session(tmp_path, "master"), compute) == first and len(calls) == 2
