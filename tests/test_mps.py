"""harness.nightly.mps: the nightly's private MPS daemon, with a stand-in control binary on PATH that records
how it was called (the real one needs an NVIDIA GPU)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness.nightly import mps
from harness.nightly import run as nightly
from harness.nightly import steps as nightly_steps

FAKE = """#!/bin/sh
# records: args, the pipe directory it was given, and stdin (the quit command)
echo "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$FAKE_MPS_LOG"
if [ "$1" != "-d" ]; then cat >> "$FAKE_MPS_LOG"; fi
exit ${FAKE_MPS_RC:-0}
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / mps.CONTROL
    exe.write_text(FAKE)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    return log


@pytest.fixture
def no_control(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)


def test_on_starts_a_private_daemon_and_quits_it(fake_control, tmp_path):
    with mps.daemon("on", tmp_path / "m", log=lambda m: None) as env:
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        assert Path(pipe).is_dir() and Path(pipe).is_relative_to(tmp_path / "m")
        assert Path(env["CUDA_MPS_LOG_DIRECTORY"]).is_dir()
        assert fake_control.read_text().splitlines() == [f"args=-d pipe={pipe} log={env['CUDA_MPS_LOG_DIRECTORY']}"]
    calls = fake_control.read_text().splitlines()
    assert calls[1:] == [f"args= pipe={pipe} log={env['CUDA_MPS_LOG_DIRECTORY']}", "quit"]


def test_the_daemon_is_quit_when_the_block_raises(fake_control, tmp_path):
    with pytest.raises(KeyError):
        with mps.daemon("on", tmp_path / "m", log=lambda m: None):
            raise KeyError("a step blew up")
    assert fake_control.read_text().splitlines()[-1] == "quit"


def test_off_starts_nothing(fake_control, tmp_path):
    with mps.daemon("off", tmp_path / "m") as env:
        assert env == {}
    assert not fake_control.exists()


def test_on_without_the_binary_is_a_typed_error_naming_it(no_control, tmp_path):
    with pytest.raises(mps.MpsUnavailable, match=mps.CONTROL):
        with mps.daemon("on", tmp_path / "m"):
            pass


def test_on_when_the_daemon_fails_to_start_is_a_typed_error(fake_control, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_RC", "3")
    with pytest.raises(mps.MpsUnavailable, match="exited 3"):
        with mps.daemon("on", tmp_path / "m", log=lambda m: None):
            pass


@pytest.mark.parametrize("device,binary", [("cpu", True), ("rocm", True), ("cuda", False)])
def test_auto_runs_without_where_it_cannot(request, tmp_path, device, binary):
    request.getfixturevalue("fake_control" if binary else "no_control")
    said = []
    with mps.daemon("auto", tmp_path / "m", device=device, log=said.append) as env:
        assert env == {}
    assert said and said[0].startswith("mps: off")


def test_a_callers_daemon_is_kept(fake_control, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "theirs"))
    with mps.daemon("on", tmp_path / "m", log=lambda m: None) as env:
        assert env == {}
    assert not fake_control.exists()


@pytest.mark.parametrize("flags", [["--mps", "on"], []], ids=["on", "default"])
def test_nightly_makes_the_correctness_steps_and_only_them_clients(fake_control, tmp_path, monkeypatch, flags):
    """On an NVIDIA machine with the daemon's binary the default (auto) uses it, as ``on`` does."""
    ran = []

    def fake_run_steps(steps, out, **kw):
        for s in steps:
            ran.append((s.phase, s.name, s.env.get("CUDA_MPS_PIPE_DIRECTORY")))
            s.rc, s.wall_s = 0, 0.0

    monkeypatch.setattr(nightly_steps, "run_steps", fake_run_steps)
    nightly.main(["--out", str(tmp_path / "n"), "--profile", "dev", "--device", "cuda", *flags,
                  "--no-gate", "--budget-s", "60"])
    pipe = str((tmp_path / "n" / "mps" / "pipe").resolve())
    phases = {p for p, _, _ in ran}
    assert {-1, 0, 1, 2} <= phases, ran
    assert all((env == pipe) == (p == 0) for p, _, env in ran), ran
    assert fake_control.read_text().splitlines()[-1] == "quit"
