"""The CLI end to end, as a user runs it: progress, CSV, summary table, repro lines, exit codes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from tests.helpers import ROOT, harness_cli, harness_imports, subprocess_env


def _run(*args, timeout=900, env=None):
    env = subprocess_env(**(env or {}))  # VP_DEVICE as chosen by conftest
    return harness_cli(args, env=env, timeout=timeout)


def test_list():
    r = _run("list")
    assert r.returncode == 0, r.stderr
    assert "qk_norm_rope" in r.stdout and "mutant-store-left-on-in-verify" in r.stdout and "shim=" in r.stdout
    line = next(x for x in r.stdout.splitlines() if "fused-shared-kv-bf16p" in x)
    assert "precision=bf16-p" in line and "precision=exact-fp32" in r.stdout  # each impl's declared class
    from cases import timelines as tl

    lines = r.stdout.splitlines()
    assert any(x.strip().startswith("cases: ") and "one-token-one-head" in x for x in lines)  # catalog case names
    assert f"timeline families: {', '.join(sorted(tl.FAMILIES))}" in lines
    assert any(x.startswith("timelines: ") and "qwen35-gqa/width-1" in x for x in lines)


def test_list_piped_into_a_reader_that_left_is_no_traceback():
    """``verify-parity list | head -1``: the reader closes the pipe; the CLI stops quietly (exit 141, as a
    program killed by SIGPIPE) instead of a BrokenPipeError traceback. The pipe's read end is closed before
    the CLI starts, so its first write fails whatever the timing."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([sys.executable, "-m", "harness", "list"], cwd=ROOT, env=subprocess_env(),
                           stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert r.returncode == 128 + signal.SIGPIPE, r.stderr
    assert "Traceback" not in r.stderr and "Error" not in r.stderr, r.stderr


HEAVY = ("torch", "triton", "pandas", "numpy", "hypothesis")


@pytest.mark.parametrize("cmd", ["", "list", "run", "mutants", "timelines", "compile", "gpu", "bench", "nightly", "warmup",
                                 "repro", "report", "gate", "serve"],
                         ids=lambda cmd: f"{cmd or 'harness'}-help")  # not the id "gpu": conftest skips it off a GPU
def test_help_imports_no_torch(cmd):
    """``python -m harness [CMD] --help`` imports none of torch, triton, pandas, numpy, hypothesis (read off
    ``-X importtime``, not a clock: the 2-core machine's load makes wall times noisy); measured at 0.05 s of
    imports against 1.8 s before (docs/cli.md). Planted: before, every command imported torch (``harness.usage``
    subclassed the ops' input error, whose module imports torch) and pandas, and the parser built every
    command's choices from the registry; ``timelines``, ``gate``, ``serve``, ``nightly``, ``gpu`` and ``bench
    --help`` imported torch for their choices (the model families, the micro-model layouts, the benchmark
    modules) until those were declared without it (``cases.base.composite``, ``cases.e2e_gate.LAYOUTS``)."""
    r, imported = harness_imports(*cmd.split(), "--help")
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-2000:]
    assert imported and not imported & set(HEAVY), sorted(imported & set(HEAVY))


FAST_PLUGIN = """
from harness.registry import Deferred, Impl

MINE = [Impl("verify_accept", "mine", "external", Deferred("reference.verify_accept.chain:verify_accept"),
             doc="a plugin whose module imports no torch")]
"""


@pytest.mark.parametrize("args", [("list",), ("list", "--impl", "fused"), ("list", "--device", "cpu"),
                                  ("list", "--impl", "fast_plugin:MINE"), ("list", "--impl", "nosuch")])
def test_list_imports_no_torch(tmp_path, args):
    """``list`` reads declarations only: the registry (every op's spec, catalog and mutants, a plugin whose
    module imports no torch), the timelines and the device's name import none of torch, triton, pandas, numpy,
    hypothesis; torch comes with the work (``run``), not with the catalog. 2.4-3.4 s before, 0.26 s after on
    the 2-core CPU (docs/cli.md). Planted: an ``import torch`` at the top of a catalog, a mutant module or
    ``harness/tolerance.py`` fails it, as the registry's imports of the reference chains did before."""
    (tmp_path / "fast_plugin.py").write_text(FAST_PLUGIN)
    r, imported = harness_imports(*args, cwd=tmp_path, env=subprocess_env(tmp_path))
    assert r.returncode == (2 if "nosuch" in args else 0), r.stderr[-2000:]
    assert "unknown implementation(s) nosuch" in r.stderr if "nosuch" in args else "device: cpu" in r.stdout
    assert imported and not imported & set(HEAVY), sorted(imported & set(HEAVY))
    if "fast_plugin:MINE" in args:
        assert any(x.strip().startswith("- mine ") and "[fast_plugin:MINE]" in x for x in r.stdout.splitlines())


def test_list_and_the_run_header_state_the_generated_counts_the_run_draws():
    """``list``'s "generated per run" and the run header's "generated cases" per op are the number of
    generated cases the run plans on this device (``cases.profiles.generated_count``: the profile's count, an op's
    interpreter cap under the interpreter). Planted: before, ``list`` said 300 for every op on the CPU,
    where a ci run draws 150 verify_accept and 40 verify_attention cases."""
    from cases import profiles
    from harness import devices
    from harness.ops import default_registry
    from cases.profiles import generated_count

    dev = devices.select(os.environ.get("VP_DEVICE", "auto"))
    reg = default_registry(with_mutants=False, with_plugins=False)
    prof = profiles.current("ci")
    r = _run("list", env={"VP_PROFILE": "ci"})
    lines = r.stdout.splitlines()
    listed = {op: int(lines[i + 1].split(f"generated per run ({prof.name}): ")[1].split()[0])
              for i, line in enumerate(lines) for op in reg.ops if line.startswith(f"{op}: ")}
    want = {op: generated_count(spec, prof, interpreted=dev.interpreted) for op, spec in reg.ops.items()}
    assert listed == want, (listed, want)
    h = _run("run", "--case", "nomatch-xyz", "--quiet", env={"VP_PROFILE": "ci"})  # the header, then refused
    header = h.stdout.split("generated cases: ", 1)[1].split(";", 1)[0]
    assert dict((op, int(n)) for op, n in (x.split() for x in header.split(", "))) == want, h.stdout


def _profile_sizes(text: str) -> dict:
    """The profile sizes a document states: ``dev`` (N generated cases per op), ``ci`` (N), ``nightly`` (N ...),
    and the ops' interpreter caps (`op` N inside the ``OpSpec.interpreter_generated`` parenthesis)."""
    import re

    flat = " ".join(text.split())
    sizes = {m[0]: int(m[1].replace(",", "")) for m in re.findall(r"`(dev|ci|nightly)` \((\d[\d,]*)", flat)}
    caps = flat.split("`OpSpec.interpreter_generated`:", 1)[1].split(")", 1)[0]
    return sizes | {m[0]: int(m[1]) for m in re.findall(r"`(\w+)` (\d+)", caps)}


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_the_docs_state_the_profile_sizes_the_code_has(doc):
    """README and docs/cli.md state each profile's count and each op's interpreter cap as ``cases.profiles``
    and the op specs have them. Planted: before, they said ci draws 300 per op, with no cap."""
    from cases import profiles
    from harness.ops import default_registry

    reg = default_registry(with_mutants=False, with_plugins=False)
    want = {p.name: p.generated for p in profiles.PROFILES.values()}
    want |= {op: spec.interpreter_generated for op, spec in reg.ops.items() if spec.interpreter_generated is not None}
    assert _profile_sizes((ROOT / doc).read_text()) == want


def test_run_writes_csv_with_provenance_and_prints_summary(tmp_path):
    csv = tmp_path / "rows.csv"
    r = _run("run", "--op", "qk_norm_rope", "--impl", "fused", "--generated", "3", "--case", "one-token", "--csv", str(csv))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "passed" in r.stdout and "qk_norm_rope" in r.stdout
    df = pd.read_csv(csv)
    assert set(df["status"]) == {"pass"}
    from harness import devices

    dev = devices.select(os.environ.get("VP_DEVICE", "auto"))
    if dev.interpreted:
        assert df["shim"].str.startswith("vp-interp-shim").all() and (df["device"] == "cpu:cpu").all()
    else:  # compiled kernels: no shim in the provenance
        assert df["shim"].isna().all() and df["device"].str.startswith(dev.kind).all()
    for col in ("git_sha", "torch", "triton", "profile", "seed", "repro"):
        assert df[col].notna().all(), col
    # the run ends saying what it covered and what the larger profiles and the nightly add
    cov = next(line for line in r.stdout.splitlines() if line.startswith("covered: "))
    assert f" {df['case'].nunique()} cases of a plan of " in cov and f" {len(df):,} checks;" in cov, cov
    assert cov.startswith("covered: 1 op, 1 implementation (fused), "), cov
    assert "--profile nightly adds " in r.stdout and "python -m harness nightly" in r.stdout, r.stdout


def test_mutant_run_prints_repro_and_fails_when_one_survives(tmp_path):
    r = _run("run", "--op", "qk_norm_rope", "--impl", "mutant-store-left-on-in-verify", "--generated", "0",
             "--case", "dsv4-verify-b1-l3-h8", "--csv", str(tmp_path / "m.csv"), "--quiet")
    assert r.returncode == 1
    line = next(l for l in r.stdout.splitlines() if "repro:" in l).split("repro: ", 1)[1]
    assert line.startswith("python -m harness repro '")
    rr = subprocess.run(line.replace("python", sys.executable, 1), shell=True, cwd=ROOT, capture_output=True,
                        text=True, env=subprocess_env(), timeout=600)
    assert rr.returncode == 1 and "fail" in rr.stdout, rr.stdout + rr.stderr


def test_repro_catalog_name_passes():
    r = _run("repro", "qk_norm_rope/one-token-one-head", "--impl", "fused", "--impl", "reference")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "numeric:q_out" in r.stdout


def test_shard_slices_are_a_partition(tmp_path):
    from harness.parity.suite import shard

    items = list(range(10))
    parts = [shard(items, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == items


def test_unknown_impl_is_a_clear_error(tmp_path):
    r = _run("run", "--impl", "nope", "--generated", "0", "--csv", str(tmp_path / "x.csv"))
    assert r.returncode != 0 and "unknown implementation" in r.stderr


def test_mutants_command_kills_every_qk_mutant_with_a_repro(tmp_path):
    # tiny-rows-eps-visible, tiny-rows-decode and nonunified-tiny-rows (the non-unified layer's mutants)
    r = _run("mutants", "--op", "qk_norm_rope", "--generated", "0", "--case", "tiny-rows",
             "--csv", str(tmp_path / "m.csv"), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    for m in ("mutant-rope-style-swapped-q", "mutant-eps-outside-sqrt", "mutant-store-left-on-in-verify",
              "mutant-nonunified-skips-paged-store", "mutant-bf16-row-in-fp8-cache", "mutant-pad-byte-written"):
        assert f"KILLED {m}" in r.stdout
    assert r.stdout.count("repro: python -m harness repro") >= 3 and "SURVIVED" not in r.stdout


def test_mutants_command_fails_when_one_survives(tmp_path):
    """On a unit-scale case the eps mutant is invisible: the command must say so and fail."""
    r = _run("mutants", "--op", "qk_norm_rope", "--impl", "mutant-eps-outside-sqrt", "--generated", "0",
             "--case", "one-token-one-head", "--csv", str(tmp_path / "m.csv"), "--quiet")
    assert r.returncode == 1 and "SURVIVED mutant-eps-outside-sqrt" in r.stdout, r.stdout + r.stderr


def test_jobs_give_the_same_rows_in_the_same_order(tmp_path):
    args = ("run", "--op", "qk_norm_rope", "--impl", "fused", "--impl", "mutant-eps-outside-sqrt",
            "--generated", "4", "--case", "rows", "--quiet")
    one = _run(*args, "--csv", str(tmp_path / "one.csv"))
    two = _run(*args, "--jobs", "2", "--csv", str(tmp_path / "two.csv"))
    assert one.returncode == two.returncode == 1, one.stdout + two.stdout  # the mutant fails tiny-rows cases
    cols = ["op", "impl", "case", "check", "status", "err"]
    a, b = pd.read_csv(tmp_path / "one.csv")[cols], pd.read_csv(tmp_path / "two.csv")[cols]
    assert len(a) > 0 and a.equals(b)


def test_timelines_csv_is_timeline_rows_with_provenance_and_a_repro_that_reruns_the_path(tmp_path):
    """cmd_timelines writes reports.rows.TimelineRow: the columns it always had, in their order, then the
    run's repro and the provenance; the repro reruns the same timeline on the same (non-default) path."""
    from reports import frames
    from reports.rows import Provenance, TimelineRow, columns
    from tests.report_runs import TIMELINE, timeline_cli

    csv = tmp_path / "tl.csv"
    r = timeline_cli("--family", "qwen35-gqa", "--path", "reference+reference", "--generated", "0",
                     "--timeline", TIMELINE, "--quiet", "--csv", csv)
    assert r.returncode == 0, r.stdout + r.stderr
    df = pd.read_csv(csv)
    old = ["path", "timeline", "model_family", "step", "mode", "layer", "family", "check", "status", "err", "allowed",
           "detail"]
    assert list(df.columns) == columns(TimelineRow) == old + ["repro"] + columns(Provenance)
    assert len(df) > 0 and set(df["status"]) == {"pass"} and set(df["path"]) == {"qwen35-gqa:reference+reference"}
    assert (df["device"] == "cpu:cpu").all() and df["shim"].str.startswith("vp-interp-shim").all()
    for col in ("git_sha", "arch", "fp8_format", "torch", "triton", "profile", "seed"):
        assert df[col].notna().all(), col
    assert len(frames.read([csv, csv], TimelineRow)) == len(df)  # the report reads it; a shard passed twice counts once
    (repro,) = set(df["repro"])
    assert repro.startswith("python -m harness timelines --device cpu --timeline 'timeline:family=qwen35-gqa,")
    assert repro.endswith(" --path reference+reference")
    rr = subprocess.run(repro.replace("python", sys.executable, 1) + f" --quiet --csv {tmp_path / 'again.csv'}",
                        shell=True, cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=subprocess_env())
    assert rr.returncode == 0, rr.stdout + rr.stderr
    again = pd.read_csv(tmp_path / "again.csv")
    cols = ["path", "step", "mode", "layer", "check", "status"]
    assert again[cols].equals(df[cols])


def test_subprocess_env_keeps_the_callers_pythonpath(monkeypatch):
    """CLI subprocesses of the tests put this checkout first and keep the caller's PYTHONPATH
    (the H200 runner's datasets came through it; replacing it failed two tests there)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/a", "/opt/b"]))
    env = subprocess_env("/plugins", HF_HUB_OFFLINE="1")
    assert env["PYTHONPATH"].split(os.pathsep) == ["/plugins", str(ROOT), "/opt/a", "/opt/b"]
    assert env["HF_HUB_OFFLINE"] == "1"
    monkeypatch.delenv("PYTHONPATH")
    assert subprocess_env()["PYTHONPATH"] == str(ROOT)


def test_mutants_kill_matrix_writes_the_op_mutants_parity_rows_to_csv(tmp_path, device):
    """``mutants --csv`` in the default kill-matrix mode: the op mutants' parity rows (what ``nox -s report``
    reads as runs/mutants*.csv), besides the matrix itself. One mutant, in-process (the matrix narrowed by
    ``killmatrix.build(only=...)``): its parity rows fail, and the report's kill matrix reads it KILLED."""
    import functools
    import signal
    from unittest import mock

    from harness.cli import main as cli
    from harness.mutants import killmatrix
    from reports import frames, html

    subject = "qk_norm_rope/mutant-eps-outside-sqrt"
    csv, km = tmp_path / "mutants.csv", tmp_path / "km.csv"
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        with mock.patch.object(killmatrix, "build", functools.partial(killmatrix.build, only=subject)):
            # the session's device: --device cpu in-process on a GPU runner would turn the interpreter on here
            rc = cli.main(["mutants", "--device", device.kind, "--csv", str(csv), "--kill-matrix", str(km), "--quiet"])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert rc == 0
    rows = frames.read([csv])
    assert set(rows["impl"]) == {"mutant-eps-outside-sqrt"} and (rows["status"] == "fail").any()
    assert set(pd.read_csv(km)["subject"]) == {subject}
    assert html.kill_matrix(rows).set_index("impl").loc["mutant-eps-outside-sqrt", "killed"] == "KILLED"


# ----------------------------------------------------------------------------- a mistaken command wipes nothing

@pytest.mark.parametrize("extra", [(), ("--shard", "1/2")], ids=["whole", "shard"])
def test_a_selection_that_matches_nothing_is_a_usage_error_and_keeps_the_last_csv(tmp_path, extra):
    """``--case`` matching no case: exit 2, one line naming ``--case``, the previous CSV byte-identical,
    with or without ``--shard`` (the selection is judged before the slice is taken). Planted: writing the
    (empty) rows before checking them leaves a header-only CSV (what a mistyped case did to a 1,984-row
    run before); with ``--shard`` the check was skipped, and a header-only CSV was written, exit 0."""
    csv = tmp_path / "parity.csv"
    csv.write_bytes(b"op,impl\nverify_accept,fused\n")
    r = harness_cli(["run", "--device", "cpu", "--op", "verify_accept", "--case", "nomatch-xyz", "--quiet", "--csv",
                     str(csv), *extra], env=subprocess_env(), timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--case nomatch-xyz" in lines[0], (r.returncode, r.stderr)
    assert csv.read_bytes() == b"op,impl\nverify_accept,fused\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parity.csv"]  # no temporary file left either


def _as_at_a_terminal() -> None:
    """The run's process as a terminal starts it, whatever started the tests: SIGINT at its default. A suite
    started as a background job of a shell without job control (``cmd &`` in a script) inherits SIGINT ignored,
    and so would the run, which a Ctrl-C then never reaches (both tests hung 120 s so, 2026-12-07)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted_run(tmp_path, how: signal.Signals, stall_after: int):
    """A run of the ``tests.plugins.stalls`` plugin over a previous good CSV, sent ``how`` once the plugin has
    stalled after ``stall_after`` calls: (exit status, stderr, the CSV's bytes before)."""
    csv, calls = tmp_path / "parity.csv", tmp_path / "calls"
    csv.write_bytes(b"op,impl,case\nverify_accept,fused,the last good run\n")
    calls.write_text("")
    before = csv.read_bytes()
    env = subprocess_env(VP_TEST_CALLS=str(calls), VP_TEST_STALL_AFTER=str(stall_after))
    p = subprocess.Popen([sys.executable, "-m", "harness", "run", "--device", "cpu", "--op", "verify_accept",
                          "--impl", "tests.plugins.stalls:STALLS", "--generated", "3", "--quiet", "--csv", str(csv)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=_as_at_a_terminal)
    deadline = time.monotonic() + 300
    while len(calls.read_text().splitlines()) <= stall_after:  # the plugin is in its stall: the run is mid-way
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    p.send_signal(how)
    _, err = p.communicate(timeout=120)
    return p.returncode, err, before


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_a_run_interrupted_before_any_case_completed_keeps_the_previous_csv(tmp_path, how):
    """Killed (SIGKILL) or Ctrl-C'd (SIGINT) in the middle of its first case: the previous CSV byte-identical,
    no temporary file left, and a Ctrl-C says so and exits 130. Planted: opening the CSV for writing when the
    run starts empties it under SIGKILL; before, a Ctrl-C here exited 2 blaming the selection
    ('matches no (implementation, case) pair')."""
    rc, err, before = _interrupted_run(tmp_path, how, stall_after=0)
    assert (tmp_path / "parity.csv").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls", "parity.csv"]
    if how == signal.SIGINT:
        assert rc == 130 and "interrupted before any run completed" in err and "matches no" not in err, (rc, err)
    else:
        assert rc == -signal.SIGKILL


def test_a_run_interrupted_midway_writes_only_whole_rows_and_never_exits_0(tmp_path):
    """Ctrl-C after some cases completed: the CSV is replaced, whole, by the rows of the runs that completed
    (docs/cli.md: Ctrl-C or SIGTERM keeps every completed case; the nightly reads them), never a cut one, and
    the exit status is 130 however those rows went. Planted: before, the run exited 0 (its 3 completed cases
    passed), as a complete one does."""
    rc, err, _ = _interrupted_run(tmp_path, signal.SIGINT, stall_after=10)
    assert rc == 130 and "interrupted:" in err, (rc, err)
    from reports import frames

    rows = frames.read([tmp_path / "parity.csv"])
    done = int(err.split("interrupted: ")[-1].split(" of ")[0])
    assert 0 < done and rows["case"].nunique() == done and set(rows["impl"]) == {"stalls"}, (done, rows)
    assert (rows["status"] == "pass").all()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls", "parity.csv"]


def test_a_write_that_fails_midway_keeps_the_previous_file(tmp_path, monkeypatch):
    """``reports.rows.write_frame`` writes beside the file and renames: a write that dies midway (a kill,
    a full disk) leaves the previous file whole and no temporary file. Planted: writing in place leaves
    the partial bytes."""
    from reports import rows

    path = tmp_path / "runs.csv"
    path.write_text("the last good results\n")

    def dies_midway(self, target, **kw):
        with open(target, "w") as fh:
            fh.write("op,im")
        raise OSError("No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", dies_midway)
    try:
        rows.write_frame(pd.DataFrame({"op": ["x"]}), path)
    except OSError:
        pass
    else:
        raise AssertionError("the failing write was not raised")
    assert path.read_text() == "the last good results\n"
    assert [p.name for p in tmp_path.iterdir()] == ["runs.csv"]


def test_repro_of_a_partial_case_id_prints_the_case_it_runs():
    """A generated id with axes left out runs their defaults: the first line spells out the whole id
    (which parses back to the same case). Planted: no such line (the run said nothing of the defaults)."""
    from cases import base
    from harness.ids import parse_case_id
    from harness.ops import default_registry

    r = harness_cli(["repro", "qk_norm_rope:T=4,H=8", "--device", "cpu"], env=subprocess_env())
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("case: qk_norm_rope:T=4,H=8,D=") and "defaults" in first, first
    reg = default_registry(with_mutants=False, with_plugins=False)
    full = first.split()[1]
    assert base.display_id("qk_norm_rope", parse_case_id(reg, full)[1]) == full


@pytest.mark.long
def test_generated_only_runs_no_catalog_case(tmp_path):
    """``--generated-only``: the generated cases of the seed, none of the named catalog (whose names the
    rows would show); the same generated ids as a run with the catalog."""
    from cases.verify_accept import catalog

    args = ("run", "--op", "verify_accept", "--impl", "reference", "--generated", "2", "--quiet")
    r = _run(*args, "--generated-only", "--csv", str(tmp_path / "gen.csv"))
    assert r.returncode == 0, r.stdout + r.stderr
    gen = set(pd.read_csv(tmp_path / "gen.csv")["case"])
    names = {f"verify_accept/{c.name}" for c in catalog.catalog()}
    assert len(gen) == 2 and not gen & names, gen
    from cases.profiles import current
    from harness.ops import default_registry
    from harness.parity.suite import plan_cases

    planned = plan_cases(default_registry(with_plugins=False).ops["verify_accept"], current(), generated=2)
    assert [p.display for p in planned[-2:]] == sorted(gen, key=[p.display for p in planned].index)  # the same draws
    r = _run(*args, "--generated-only", "--case", "nan-rows", "--csv", str(tmp_path / "none.csv"))
    assert r.returncode == 2 and "--case nan-rows" in r.stderr and "--generated-only" in r.stderr, r.stderr
