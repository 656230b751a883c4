"""tests/zygote.py: a CLI run forked from the zygote behaves as a fresh ``python -m harness`` process. A
stand-in ``harness`` package in the run's directory (first on ``sys.path``, as with ``-m``) reports what
it sees; on a machine with CUDA the same tests run through a plain subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests import zygote
from tests.helpers import harness_cli, subprocess_env

REPORT = textwrap.dedent('''
    import json, os, sys
    import torch
    print(json.dumps({"threads": torch.get_num_threads(), "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "probe": os.environ.get("VP_PROBE"),
                      "interpret": os.environ.get("TRITON_INTERPRET"), "triton": "triton" in sys.modules,
                      "stdin": sys.stdin.read()}))
    sys.stdout.flush()
    if sys.argv[1] == "raise":
        raise ValueError("planted")
    if sys.argv[1] == "hang":
        import time
        time.sleep(60)
    sys.exit(int(sys.argv[2]))
''')


@pytest.fixture
def stand_in(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "__main__.py").write_text(REPORT)
    return tmp_path


def test_a_child_sees_its_own_argv_cwd_environment_and_no_triton(stand_in):
    """Planted: the zygote importing Triton (then ``triton.language``'s own @jit helpers are compiled
    functions in a child that asks for the interpreter), the request's argv or environment not applied."""
    env = {k: v for k, v in subprocess_env(VP_PROBE="42", TRITON_INTERPRET="1").items()}
    r = harness_cli(["run", "3"], cwd=stand_in, env=env, timeout=300)
    seen = json.loads(r.stdout)
    assert r.returncode == 3, r.stderr
    assert seen["argv"] == [str(stand_in / "harness" / "__main__.py"), "run", "3"]
    assert seen["path0"] == str(stand_in) and seen["cwd"] == str(stand_in)
    assert seen["probe"] == "42" and seen["interpret"] == "1" and not seen["triton"] and seen["stdin"] == ""
    r = harness_cli(["run", "0"], cwd=stand_in, env={k: v for k, v in env.items() if k != "VP_PROBE"}, timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout)["probe"] is None  # nothing left from the previous run


def test_a_child_has_the_thread_count_its_environment_asks_for(stand_in):
    """OpenMP reads OMP_NUM_THREADS when torch loads, in the zygote: a child asking for another count gets a
    zygote started with it. Planted: one zygote for every environment (the child ran cpu_count threads)."""
    plain = {k: v for k, v in subprocess_env().items() if k != "OMP_NUM_THREADS"}
    assert harness_cli(["run", "0"], cwd=stand_in, env=plain, timeout=300).returncode == 0  # a zygote without it
    r = harness_cli(["run", "0"], cwd=stand_in, env={**plain, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout)["threads"] == 1, (r.stdout, r.stderr)


def test_an_uncaught_exception_is_exit_1_with_its_traceback(stand_in):
    r = harness_cli(["raise"], cwd=stand_in, env=subprocess_env(), timeout=300)
    assert r.returncode == 1 and "ValueError: planted" in r.stderr and "Traceback" in r.stderr, r.stderr


def test_a_run_past_its_timeout_is_killed_and_the_next_one_runs(stand_in):
    with pytest.raises(subprocess.TimeoutExpired) as e:
        harness_cli(["hang"], cwd=stand_in, env=subprocess_env(), timeout=3)
    assert json.loads(e.value.output)["argv"][1] == "hang"
    assert harness_cli(["run", "5"], cwd=stand_in, env=subprocess_env(), timeout=300).returncode == 5


def test_the_zygote_is_used_exactly_where_the_machine_has_no_cuda_device(monkeypatch):
    import torch

    assert zygote.usable() == (not torch.cuda.is_available() and sys.platform != "win32")
    monkeypatch.setenv("VP_TEST_ZYGOTE", "0")
    assert not zygote.usable()
