"""The suite's own processes run one torch intra-op thread unless the caller sets ``OMP_NUM_THREADS``
(tests/conftest.py says why: xdist already runs a worker per core)."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

from tests.helpers import subprocess_env


def test_a_test_process_and_its_subprocesses_run_the_thread_count_the_environment_names():
    """Planted: dropping conftest's ``OMP_NUM_THREADS`` default fails here on any machine with two cores or
    more (the variable is unset, and a subprocess then runs a thread per core)."""
    want = int(os.environ["OMP_NUM_THREADS"])
    assert torch.get_num_threads() == want
    code = "import torch; print(torch.get_num_threads())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert r.returncode == 0 and int(r.stdout) == want, r.stderr
