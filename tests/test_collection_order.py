"""The suite's collection order (tests/conftest.py): the tests marked ``long`` are spaced evenly, so that each of
pytest-xdist's workers starts with its share of them (``--dist worksteal`` cuts the collection into contiguous
slices). Planted: collecting them first (what the suite did until 2026-12-07) puts them all in the first slices."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import spread_evenly
from tests.helpers import ROOT, subprocess_env


def _shares(flags: list[bool], workers: int) -> list[int]:
    """Long tests in each worker's first slice, as xdist's worksteal cuts it: each idle worker in turn takes
    len(pending) // workers_left of the pending tests, in collection order."""
    pending, shares = list(flags), []
    for w in range(workers):
        take = len(pending) // (workers - w)
        shares.append(sum(pending[:take]))
        del pending[:take]
    return shares


@pytest.mark.parametrize("n, n_long, workers", [(3385, 48, 16), (3385, 48, 2), (100, 7, 16), (10, 10, 4), (5, 0, 2)])
def test_every_workers_slice_holds_its_share_of_the_long_tests(n, n_long, workers):
    items = [("long", i) for i in range(n_long)] + [("short", i) for i in range(n_long, n)]  # clustered: the worst
    out = spread_evenly(items, lambda it: it[0] == "long")
    assert sorted(out, key=lambda it: it[1]) == items  # a reordering, each kind in its own order
    assert [i for k, i in out if k == "long"] == list(range(n_long))
    shares = _shares([k == "long" for k, _ in out], workers)
    assert max(shares) - min(shares) <= 1, shares


PLUGIN = """
import json, os


def pytest_collection_finish(session):
    with open(os.environ["VP_ORDER_OUT"], "w") as fh:
        json.dump(["long" in item.keywords for item in session.items], fh)
"""


def test_the_suite_collects_its_long_tests_spread(tmp_path):
    """The suite's own collection, through its conftest: with 16 workers no slice holds more than one long
    test over another's."""
    (tmp_path / "order_plugin.py").write_text(PLUGIN)
    out = tmp_path / "order.json"
    env = subprocess_env(VP_ORDER_OUT=str(out))
    env["PYTHONPATH"] = f"{tmp_path}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "order_plugin",
                        "-p", "no:cacheprovider", "tests"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    flags = json.loads(out.read_text())
    assert sum(flags) >= 16, sum(flags)  # the marked tests (compile per op and target, kill matrices, CLI plants)
    shares = _shares(flags, 16)
    assert max(shares) - min(shares) <= 1, shares
