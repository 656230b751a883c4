"""The CLI end to end, as a user runs it: progress, CSV, summary table, repro lines, exit codes."""
from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
from tests.helpers import ROOT, subprocess_env


def _run(*args, timeout=900):
    env = subprocess_env()  # VP_DEVICE as chosen by conftest
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=timeout)


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


def test_mutants_kill_matrix_writes_the_op_mutants_parity_rows_to_csv(tmp_path):
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
            rc = cli.main(["mutants", "--device", "cpu", "--csv", str(csv), "--kill-matrix", str(km), "--quiet"])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert rc == 0
    rows = frames.read([csv])
    assert set(rows["impl"]) == {"mutant-eps-outside-sqrt"} and (rows["status"] == "fail").any()
    assert set(pd.read_csv(km)["subject"]) == {subject}
    assert html.kill_matrix(rows).set_index("impl").loc["mutant-eps-outside-sqrt", "killed"] == "KILLED"


# ----------------------------------------------------------------------------- a mistaken command wipes nothing

def test_a_selection_that_matches_nothing_is_a_usage_error_and_keeps_the_last_csv(tmp_path):
    """``--case`` matching no case: exit 2, one line naming ``--case``, the previous CSV byte-identical.
    Planted: writing the (empty) rows before checking them leaves a header-only CSV (what a mistyped
    case did to a 1,984-row run before)."""
    csv = tmp_path / "parity.csv"
    csv.write_bytes(b"op,impl\nverify_accept,fused\n")
    r = subprocess.run([sys.executable, "-m", "harness", "run", "--device", "cpu", "--op", "verify_accept",
                        "--case", "nomatch-xyz", "--quiet", "--csv", str(csv)], cwd=ROOT, capture_output=True,
                       text=True, env=subprocess_env(), timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--case nomatch-xyz" in lines[0], (r.returncode, r.stderr)
    assert csv.read_bytes() == b"op,impl\nverify_accept,fused\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parity.csv"]  # no temporary file left either


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

    r = subprocess.run([sys.executable, "-m", "harness", "repro", "qk_norm_rope:T=4,H=8", "--device", "cpu"],
                       cwd=ROOT, capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("case: qk_norm_rope:T=4,H=8,D=") and "defaults" in first, first
    reg = default_registry(with_mutants=False, with_plugins=False)
    full = first.split()[1]
    assert base.display_id("qk_norm_rope", parse_case_id(reg, full)[1]) == full
