"""Bad command lines: every one is refused before any work starts, with exit status 2 and exactly
one line on stderr that names the argument (or the file and row), never a traceback. And
``report`` is not green on input it cannot trust: no rows, an unknown status, a truncated,
binary or unreadable file.

Each command line runs in-process through ``harness.cli.main.main`` with the entry points of the
real work (a parity run, the kill matrix, timelines, the gate, the server, the compile check,
the GPU checks, the benchmarks, the nightly's steps) replaced by a tripwire: a bad argument
that gets as far as the work fails the test, and none of these runs costs more than parsing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shlex
import signal
import xml.etree.ElementTree as ET
from unittest import mock

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main as cli
from reports.rows import GateRow, ParityRow, PerfRow, TimelineRow, columns

PROV = dict(git_sha="abc", device="cpu:cpu", arch="interpreter", fp8_format="e4m3fn", torch="t", triton="t",
            shim="vp-interp-shim", profile="dev", seed=0)


class Reached(Exception):
    """The command got past its arguments into the work itself."""


def _tripwire(*_a, **_k):
    raise Reached("the command started its work")


WORK = [("harness.parity.suite", "run"), ("harness.parity.suite", "spawn_map"), ("harness.mutants.killmatrix", "build"),
        ("harness.timelines.runner", "run_timeline"), ("harness.e2e.gate", "run"), ("harness.e2e.client", "ab"),
        ("harness.e2e.server", "main"), ("harness.gpu.compile", "run"), ("harness.gpu.checks", "run"),
        ("harness.bench.perf", "run_ops"), ("harness.nightly.steps", "run_steps")]


@contextlib.contextmanager
def _guarded(env: dict | None = None):
    """The work entry points tripwired, the environment and SIGTERM's handler restored afterwards."""
    import importlib

    sigterm = signal.getsignal(signal.SIGTERM)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, env or {}))
        for mod, attr in WORK:
            stack.enter_context(mock.patch.object(importlib.import_module(mod), attr, _tripwire))
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, sigterm)


def call(argv: list[str], env: dict | None = None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``harness.cli.main.main(argv)`` with the work tripwired."""
    out, err = io.StringIO(), io.StringIO()
    with _guarded(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def assert_refused(argv, env=None, needles=()):
    rc, out, err = call(argv, env)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, out[-2000:], err[-2000:])
    assert "error:" in lines[0], lines
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- files

def _parity_rows(status=("pass", "pass")) -> pd.DataFrame:
    rows = [ParityRow(op="qk_norm_rope", impl="fused", kind="fused", case=f"case-{i}", check="numeric:q_out", status=s,
                      err=0.1, ref_err=0.1, allowed=1.0, max_abs=0.0, max_rel=0.0, mismatch_frac=0.0, nan_inf_mismatch=0,
                      worst="", detail="", seconds=0.01, fp8_policy="", precision="exact-fp32", nan_policy="", known="",
                      repro=f"python -m harness repro 'qk_norm_rope/case-{i}' --impl fused", **PROV)
            for i, s in enumerate(status)]
    return pd.DataFrame([dataclasses.asdict(r) for r in rows], columns=columns(ParityRow))


def _timeline_rows(status="pass") -> pd.DataFrame:
    r = TimelineRow(path="qwen35-gqa:fused+fused", timeline="qwen35-gqa/width-1", model_family="qwen35-gqa", step=0,
                    mode="target_verify", layer=0, family="timeline", check="attn", status=status, err=0.0, allowed=1.0,
                    detail="", repro="python -m harness timelines --timeline qwen35-gqa/width-1", **PROV)
    return pd.DataFrame([dataclasses.asdict(r)], columns=columns(TimelineRow))


def _gate_rows(verdict="pass") -> pd.DataFrame:
    r = GateRow(layout="qwen35-gqa", path="fused+fused", expect="pass", model="random-init", drafter="ngram",
                extraction="strict", problems=10, accuracy=0.5, accuracy_lo=0.2, accuracy_hi=0.8, ref_accuracy=0.5,
                exact_agreement=1.0, tie_divergences=0, mean_accept_len=2.0, worse=0, better=0, p_value=1.0,
                temperature=0.0, dist_tokens=0, dist_log10_p=0.0, verdict=verdict, detail="", seconds=1.0, **PROV)
    return pd.DataFrame([dataclasses.asdict(r)], columns=columns(GateRow))


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    p = {"dir": d / "adir", "file": d / "afile.txt", "missing": d / "missing.csv", "out": d / "out"}
    p["dir"].mkdir()
    p["file"].write_text("x\n")
    good = _parity_rows()
    good.to_csv(d / "good.csv", index=False)
    p["good"] = d / "good.csv"
    (d / "empty.csv").write_bytes(b"")
    p["empty"] = d / "empty.csv"
    good.iloc[:0].to_csv(d / "header.csv", index=False)  # what an empty shard writes
    p["header"] = d / "header.csv"
    text = (d / "good.csv").read_text()
    last = text.rindex("\n", 0, len(text) - 1) + 1
    (d / "truncated.csv").write_text(text[: (last + len(text)) // 2])  # cut in the middle of the last row
    p["truncated"] = d / "truncated.csv"
    (d / "binary.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4)
    p["binary"] = d / "binary.csv"
    for name, status in (("upper", "FAIL"), ("maybe", "maybe"), ("blank", "")):
        _parity_rows(("pass", status)).to_csv(d / f"{name}.csv", index=False)
        p[name] = d / f"{name}.csv"
    pd.DataFrame([{c: 1 for c in columns(PerfRow)}]).to_csv(d / "perf.csv", index=False)
    p["perf"] = d / "perf.csv"
    _timeline_rows().iloc[:0].to_csv(d / "tl-header.csv", index=False)
    p["tl_header"] = d / "tl-header.csv"
    _timeline_rows("flaky").to_csv(d / "tl-bad.csv", index=False)
    p["tl_bad"] = d / "tl-bad.csv"
    _gate_rows("ok").to_csv(d / "gate-bad.csv", index=False)
    p["gate_bad"] = d / "gate-bad.csv"
    return p


# ----------------------------------------------------------------------------- the table
# (id, command line with {placeholders} from ``paths``, environment, what the one line must name)

R = "report --csv {good} --out {out}"  # a report that would succeed, to add one bad input to
BAD = [
    ("no-subcommand", "", {}, ("required",)),
    ("unknown-subcommand", "frobnicate", {}, ("frobnicate",)),
    ("run-unknown-flag", "run --frobnicate", {}, ("--frobnicate",)),
    ("run-shard-text", "run --shard abc", {}, ("--shard", "abc")),
    ("run-shard-three-parts", "run --shard 1/2/3", {}, ("--shard", "1/2/3")),
    ("run-shard-zero", "run --shard 0/2", {}, ("--shard", "0/2")),
    ("run-shard-past-n", "run --shard 3/2", {}, ("--shard", "3/2")),
    ("run-shard-zero-slices", "run --shard 1/0", {}, ("--shard",)),
    ("run-shard-negative", "run --shard=-1/2", {}, ("--shard",)),
    ("run-jobs-zero", "run --jobs 0", {}, ("--jobs",)),
    ("run-jobs-negative", "run --jobs=-3", {}, ("--jobs",)),
    ("run-jobs-text", "run --jobs many", {}, ("--jobs",)),
    ("run-vp-jobs", "run", {"VP_JOBS": "abc"}, ("VP_JOBS",)),
    ("run-vp-jobs-zero", "run", {"VP_JOBS": "0"}, ("VP_JOBS",)),
    ("run-generated-negative", "run --generated=-5", {}, ("--generated",)),
    ("run-generated-text", "run --generated ten", {}, ("--generated",)),
    ("run-seed-text", "run --seed x", {}, ("--seed",)),
    ("run-profile", "run --profile bogus", {}, ("--profile", "bogus")),
    ("run-vp-profile", "run", {"VP_PROFILE": "bogus"}, ("VP_PROFILE", "bogus")),
    ("run-op", "run --op bogus", {}, ("--op", "bogus")),
    ("run-kind", "run --kind bogus", {}, ("--kind",)),
    ("run-device", "run --device tpu", {}, ("--device",)),
    ("run-fp8-format", "run --fp8-format e5m2", {}, ("--fp8-format",)),
    ("list-impl-unknown", "list --impl my_accept", {}, ("--impl", "my_accept")),  # listed everything, exit 0, before
    ("warmup-impl-unknown", "warmup --impl nope", {}, ("--impl", "nope")),  # "nothing to do", exit 0 on the CPU, before
    ("warmup-jobs-zero", "warmup --jobs 0", {}, ("--jobs", "'0'")),  # these five: "nothing to do", exit 0 on the CPU
    ("warmup-generated-negative", "warmup --generated=-1", {}, ("--generated",)),
    ("warmup-shard-past-n", "warmup --shard 5/2", {}, ("--shard", "5/2")),
    ("warmup-profile", "warmup --profile bogus", {}, ("--profile", "bogus")),
    ("warmup-op", "warmup --op bogus", {}, ("--op", "bogus")),
    ("run-impl-name", "run --impl nope", {}, ("--impl", "nope")),
    ("run-impl-module", "run --impl no_such_module_xyz:IMPLS", {}, ("--impl", "no_such_module_xyz")),
    ("run-impl-attr", "run --impl harness.registry:NO_SUCH_ATTR", {}, ("--impl", "NO_SUCH_ATTR")),
    ("run-impl-selection", "run --impl cases.qk_norm_rope.mutants:MUTANTS[nope]", {}, ("--impl", "nope")),
    ("run-impl-wrong-op", "run --op qk_norm_rope --impl sdpa", {}, ("--impl", "sdpa")),
    ("run-csv-directory", "run --csv {dir}", {}, ("--csv", "adir")),
    ("run-csv-under-a-file", "run --csv {file}/rows.csv", {}, ("--csv", "afile.txt")),
    ("run-junit-directory", "run --junit {dir}", {}, ("--junit",)),
    ("run-ledger", "run --ledger no_such_ledger", {}, ("--ledger", "no_such_ledger")),
    ("run-case-no-value", "run --case", {}, ("--case",)),
    ("mutants-kill-matrix-directory", "mutants --kill-matrix {dir}", {}, ("--kill-matrix",)),
    ("mutants-csv-directory", "mutants --csv {dir}", {}, ("--csv",)),
    ("mutants-e2e-problems-zero", "mutants --e2e-problems 0", {}, ("--e2e-problems",)),
    ("mutants-shard", "mutants --shard x/y", {}, ("--shard",)),
    ("timelines-timeline-name", "timelines --timeline bogus", {}, ("--timeline", "bogus")),
    ("timelines-timeline-id", "timelines --timeline timeline:nonsense", {}, ("--timeline", "nonsense")),
    ("timelines-timeline-field", "timelines --timeline timeline:family=qwen35-gqa,bogus=1", {}, ("--timeline",)),
    # a KeyError traceback before
    ("timelines-timeline-family", "timelines --timeline timeline:family=bogus,steps=P:0.4", {}, ("family", "'bogus'")),
    ("timelines-timeline-step-kind", "timelines --timeline timeline:family=qwen35-gqa,steps=Q:0.4", {}, ("'Q:0.4'",)),
    ("timelines-timeline-step-request", "timelines --timeline timeline:family=qwen35-gqa,steps=P:x", {}, ("'x'",)),
    ("timelines-timeline-no-steps", "timelines --timeline timeline:family=qwen35-gqa,steps=", {}, ("steps", "no batch")),
    ("timelines-family", "timelines --family bogus", {}, ("--family", "bogus")),
    ("timelines-path-one-part", "timelines --path fused", {}, ("--path", "fused")),
    ("timelines-path-three-parts", "timelines --path a+b+c", {}, ("--path",)),
    ("timelines-path-prepare", "timelines --path bogus+fused", {}, ("--path", "bogus")),
    ("timelines-path-attn", "timelines --path fused+bogus", {}, ("--path", "bogus")),
    ("timelines-impl-name", "timelines --impl fused", {}, ("--impl", "--path")),
    ("timelines-path-mutant", "timelines --path-mutant bogus", {}, ("--path-mutant",)),
    ("timelines-generated", "timelines --generated=-1", {}, ("--generated",)),
    ("timelines-jobs", "timelines --jobs 0", {}, ("--jobs",)),
    ("timelines-shard", "timelines --shard 2/1", {}, ("--shard",)),
    ("timelines-profile", "timelines --profile bogus", {}, ("--profile",)),
    ("timelines-csv-directory", "timelines --csv {dir}", {}, ("--csv",)),
    ("compile-op", "compile --op bogus", {}, ("--op", "bogus")),
    ("compile-target", "compile --target sm80", {}, ("--target",)),
    ("compile-impl-name", "compile --impl fused", {}, ("--impl", "module:attr")),
    ("compile-impl-missing-module", "compile --impl no_such_module:X", {"TRITON_INTERPRET": "0"},
     ("--impl", "no_such_module")),
    ("compile-under-the-interpreter", "compile", {"TRITON_INTERPRET": "1"}, ("TRITON_INTERPRET",)),
    ("repro-op", "repro bogus/x", {}, ("bogus",)),
    ("repro-catalog-name", "repro qk_norm_rope/no-such-case", {}, ("no-such-case",)),
    ("repro-id-field", "repro qk_norm_rope:nonsense=1", {}, ("nonsense",)),
    ("repro-id-value", "repro qk_norm_rope:scale=abc", {}, ("scale",)),
    ("repro-impl", "repro qk_norm_rope/one-token-one-head --impl nope", {}, ("--impl", "nope")),
    # a value outside a case field's choices, or a bool not spelled True/False, ran the case with another value
    ("repro-id-choice", "repro verify_attention:layout=nope", {}, ("layout", "'nope'", "gqa, mla")),
    ("repro-id-bool", "repro verify_attention:is_causal=yes", {}, ("is_causal", "'yes'", "True or False")),
    ("report-missing-csv", "report --csv {missing} --out {out}", {}, ("missing.csv",)),
    ("report-csv-directory", "report --csv {dir} --out {out}", {}, ("adir",)),
    ("report-empty-file", "report --csv {empty} --out {out}", {}, ("empty.csv",)),
    ("report-header-only", "report --csv {header} --out {out}", {}, ("header.csv", "no rows")),
    ("report-header-only-shard", R + " --csv {header}", {}, ("header.csv", "no rows")),
    ("report-truncated", "report --csv {truncated} --out {out}", {}, ("truncated.csv",)),
    ("report-binary", "report --csv {binary} --out {out}", {}, ("binary.csv",)),
    ("report-status-upper-case", "report --csv {upper} --out {out}", {}, ("upper.csv", "row 2", "'FAIL'")),
    ("report-status-unknown", "report --csv {maybe} --out {out}", {}, ("maybe.csv", "row 2", "'maybe'")),
    ("report-status-blank", "report --csv {blank} --out {out}", {}, ("blank.csv", "row 2")),
    ("report-wrong-row-type", "report --csv {perf} --out {out}", {}, ("perf.csv", "ParityRow")),
    ("report-out-is-a-file", "report --csv {good} --out {file}", {}, ("--out",)),
    ("report-slower-negative", R + " --slower=-1", {}, ("--slower",)),
    ("report-slower-nan", R + " --slower nan", {}, ("--slower",)),
    ("report-baseline-missing", R + " --baseline {missing}", {}, ("missing.csv",)),
    ("report-mutants-status", R + " --mutants {maybe}", {}, ("maybe.csv", "'maybe'")),
    ("report-timelines-header-only", R + " --timelines {tl_header}", {}, ("tl-header.csv", "no rows")),
    ("report-timelines-status", R + " --timelines {tl_bad}", {}, ("tl-bad.csv", "'flaky'")),
    ("report-gate-verdict", R + " --gate {gate_bad}", {}, ("gate-bad.csv", "'ok'")),
    ("report-kill-matrix-empty", R + " --kill-matrix {empty}", {}, ("empty.csv",)),
    ("report-perf-binary", R + " --perf {binary}", {}, ("binary.csv",)),
    ("gate-layout", "gate --layout bogus", {}, ("--layout", "bogus")),
    ("gate-models-missing", "gate --models {missing}", {}, ("--models", "missing.csv")),
    ("gate-models-a-file", "gate --models {file}", {}, ("--models",)),
    ("gate-profile", "gate --profile bogus", {}, ("--profile", "bogus")),
    ("gate-problems-zero", "gate --problems 0", {}, ("--problems",)),
    ("gate-jobs-zero", "gate --jobs 0", {}, ("--jobs",)),
    ("gate-csv-directory", "gate --csv {dir}", {}, ("--csv",)),
    ("gate-concurrency-zero", "gate --concurrency 0", {}, ("--concurrency",)),
    ("gate-fewshot-negative", "gate --fewshot=-1", {}, ("--fewshot",)),
    ("serve-layout", "serve --layout bogus", {}, ("--layout",)),
    ("serve-path-one-part", "serve --path fused", {}, ("--path",)),
    ("serve-path-impl", "serve --path bogus+reference", {}, ("--path", "bogus")),
    ("serve-path-mutant", "serve --path-mutant bogus", {}, ("--path-mutant",)),
    ("serve-port", "serve --port 70000", {}, ("--port",)),
    ("serve-models-missing", "serve --models {missing}", {}, ("--models",)),
    ("gpu-op", "gpu --op bogus", {}, ("--op",)),
    ("gpu-check", "gpu --check bogus", {}, ("--check",)),
    ("gpu-impl-name", "gpu --impl nope", {}, ("--impl", "nope")),
    ("gpu-impl-module", "gpu --impl no_such_module_xyz:X", {}, ("--impl", "no_such_module_xyz")),
    ("gpu-out-a-file", "gpu --out {file}", {}, ("--out",)),
    ("bench-no-out", "bench", {}, ("--out",)),
    ("bench-op", "bench --out {out} --op bogus", {}, ("--op",)),
    ("bench-out-a-file", "bench --out {file}", {}, ("--out",)),
    ("nightly-profile", "nightly --out {out} --profile bogus", {}, ("--profile", "bogus")),
    ("nightly-budget-negative", "nightly --out {out} --budget-s=-5", {}, ("--budget-s",)),
    ("nightly-budget-nan", "nightly --out {out} --budget-s nan", {}, ("--budget-s",)),
    ("nightly-jobs-zero", "nightly --out {out} --jobs 0", {}, ("--jobs",)),
    ("nightly-gate-jobs-zero", "nightly --out {out} --gate-jobs 0", {}, ("--gate-jobs",)),
    ("nightly-generated-negative", "nightly --out {out} --generated=-1", {}, ("--generated",)),
    ("nightly-timelines-negative", "nightly --out {out} --timelines=-1", {}, ("--timelines",)),
    ("nightly-layout", "nightly --out {out} --layout bogus", {}, ("--layout", "bogus")),
    ("nightly-family", "nightly --out {out} --family bogus", {}, ("--family", "bogus")),
    ("nightly-case-timeout-negative", "nightly --out {out} --case-timeout-s=-3", {}, ("--case-timeout-s",)),
    ("nightly-compiled-shards-zero", "nightly --out {out} --compiled-shards 0", {}, ("--compiled-shards",)),
    ("nightly-out-a-file", "nightly --out {file}", {}, ("--out",)),
    ("nightly-baseline-missing", "nightly --out {out} --baseline {missing}", {}, ("--baseline",)),
]


def test_the_table_covers_forty_classes_and_every_subcommand():
    assert len({b[0] for b in BAD}) == len(BAD) >= 40
    subs = {b[1].split()[0] for b in BAD if b[1]}
    assert subs >= {"run", "mutants", "timelines", "compile", "repro", "report", "gate", "serve", "gpu", "bench",
                    "nightly"}


@pytest.mark.parametrize("line,env,needles", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_argument_is_one_line_and_exit_2(paths, line, env, needles):
    argv = [a.format(**paths) for a in shlex.split(line)]
    assert_refused(argv, env, needles)


# ----------------------------------------------------------------------------- garbage for the typed flags

def _int_or_none(text: str):
    try:
        return int(text)
    except ValueError:
        return None


def _shard_ok(text: str) -> bool:
    parts = text.split("/")
    if len(parts) != 2 or None in map(_int_or_none, parts):
        return False
    i, n = map(int, parts)
    return 1 <= i <= n


GARBAGE = st.one_of(st.text(max_size=12), st.from_regex(r"-?\d{1,3}/-?\d{1,3}(/\d)?", fullmatch=True),
                    st.integers(-5, 5).map(str))
FLAGS = {"--shard": _shard_ok, "--jobs": lambda s: (_int_or_none(s) or 0) >= 1,
         "--generated": lambda s: _int_or_none(s) is not None and int(s) >= 0}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(flag=st.sampled_from(sorted(FLAGS)), value=GARBAGE)
def test_typed_flags_take_what_they_mean_and_refuse_the_rest(flag, value):
    """A value is accepted (the run starts) exactly when it means what the flag says: ``--shard i/n``
    with 1 <= i <= n, ``--jobs`` >= 1, ``--generated`` >= 0; anything else is one line, exit 2."""
    argv = ["run", "--op", "qk_norm_rope", "--impl", "fused", "--csv", os.devnull, f"{flag}={value}"]
    if "\x00" in value:  # no process can get a NUL in argv
        return
    if FLAGS[flag](value):
        with pytest.raises(Reached):
            call(argv)
    else:
        assert_refused(argv, needles=(flag,))


def test_shard_is_passed_on_as_the_suite_reads_it():
    """``--shard 2/3`` reaches the suite as "2/3", which ``harness.parity.suite.shard`` slices 1-based."""
    seen = {}

    def run(*_a, **kw):
        seen.update(kw)
        raise Reached

    with mock.patch("harness.parity.suite.run", run), pytest.raises(Reached):
        cli.main(["run", "--op", "qk_norm_rope", "--impl", "fused", "--csv", os.devnull, "--shard", " 2/3",
                  "--quiet"])
    from harness.parity.suite import shard

    assert seen["shard_spec"] == "2/3" and shard(list(range(6)), seen["shard_spec"]) == [1, 4]


# ----------------------------------------------------------------------------- report: not green on bad input

def _report(paths, *extra):
    rc, out, err = call(["report", *map(str, extra), "--out", str(paths["out"])])
    return rc, out, err


def test_report_says_which_files_it_read(paths, tmp_path):
    _timeline_rows().to_csv(tmp_path / "tl-ok.csv", index=False)
    rc, out, err = _report(paths, "--csv", paths["good"], "--timelines", tmp_path / "tl-ok.csv")
    assert rc == 0, out + err
    assert f"read --csv {paths['good']}: 2 rows" in out, out
    assert f"read --timelines {tmp_path / 'tl-ok.csv'}: 1 rows" in out, out


def test_report_fail_rows_fail_in_junit_and_unknown_statuses_never_pass(paths, tmp_path):
    """A ``fail`` row is a failing testcase; a status the harness never writes is refused, not read as passing."""
    _parity_rows(("pass", "fail")).to_csv(tmp_path / "one-fail.csv", index=False)
    rc, out, err = call(["report", "--csv", str(tmp_path / "one-fail.csv"), "--out", str(tmp_path / "r")])
    assert rc == 0 and "2 rows (1 failing)" in out, out + err  # no baseline: exit 1 is for REGRESS only
    suite = ET.parse(tmp_path / "r" / "junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "1" and suite.get("tests") == "2"
    for status in ("FAIL", "maybe", "", "passed", "Pass"):
        _parity_rows(("pass", status)).to_csv(tmp_path / "odd.csv", index=False)
        assert_refused(["report", "--csv", str(tmp_path / "odd.csv"), "--out", str(tmp_path / "odd")],
                       needles=("odd.csv", "row 2"))


def test_report_refuses_a_gzipped_csv_cut_short(paths, tmp_path):
    import gzip

    data = gzip.compress(paths["good"].read_bytes())
    (tmp_path / "cut.csv.gz").write_bytes(data[: len(data) // 2])
    assert_refused(["report", "--csv", str(tmp_path / "cut.csv.gz"), "--out", str(tmp_path / "r")],
                   needles=("cut.csv.gz",))


def test_help_shows_every_command_with_an_example():
    """``python -m harness --help`` ends with one example per command, every command of the parser
    among them. Planted: the former description, which named 8 of the 13 commands."""
    rc, out, _ = call(["--help"])
    assert rc == 0
    commands = out.split("{", 1)[1].split("}", 1)[0].split(",")
    examples = out.split("examples (one per command):", 1)[1]
    assert len(commands) == 13 and all(f"harness {c} " in examples for c in commands), (commands, examples)


@pytest.mark.parametrize("module,argv", [("cases.verify_accept.bench", ["--b", "0"]),
                                         ("cases.verify_tree_accept.bench", ["--v=-1"]),
                                         ("cases.qk_norm_rope.bench", ["--vs-sglang", "--T", "0"])])
def test_an_op_benchmark_refuses_a_shape_count_below_one(module, argv, tmp_path, capsys):
    """``python -m cases.<op>.bench``'s shape flags are counts >= 1 (a 0 or a negative size crashed in the
    benchmark's allocation before): one line, exit 2, the flag named."""
    import importlib

    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main(["--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "expected an integer >= 1" in err and argv[-1].split("=")[0] in err, err


@pytest.mark.parametrize("argv", [["timelines", "--case", "5"], ["run", "--gen", "3"], ["list", "--dev", "cpu"]])
def test_an_abbreviated_option_is_refused(argv, capsys):
    """argparse reads a prefix of a long option as the option (``timelines --case 5`` set --case-timeout-s to 5
    before): every parser of the CLI refuses it as an unknown argument, one line, exit 2 (an ambiguous prefix,
    ``run --gen``, exits 2 either way: the message tells them apart)."""
    from harness.cli import main as cli

    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert f"error: unrecognized arguments: {' '.join(argv[1:])}" in err and "\n" not in err, err
