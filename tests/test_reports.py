"""reports/: shard merge, baseline diff (a mutant's rows and only those REGRESS), JUnit XML,
HTML content, and ``python -m harness report`` exit codes — on real parity runs."""
from __future__ import annotations

import dataclasses
import subprocess
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from reports import diff, frames, html, junit
from reports.rows import ParityRow, PerfRow
from tests.helpers import harness_cli, harness_imports, subprocess_env
from tests.report_runs import OP, TIMELINE, TIMELINE_MUTANT, run_frame, timeline_csvs

KEY = ["op", "impl", "case", "check"]


@pytest.fixture(scope="module")
def runs(device, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    clean, mutant = run_frame(device, mutant=False), run_frame(device, mutant=True)
    clean.to_csv(d / "clean.csv", index=False)
    mutant.to_csv(d / "mutant.csv", index=False)
    return d, clean, mutant


def _keys(frame) -> set:
    return set(map(tuple, frame[KEY].itertuples(index=False)))


def test_runs_line_up_and_mutant_bites_only_some_rows(runs):
    _, clean, mutant = runs
    assert _keys(clean) == _keys(mutant)
    assert (clean["status"] == "pass").all(), clean[clean["status"] != "pass"][KEY + ["detail"]]
    bad = mutant[mutant["status"] == "fail"]
    assert not bad.empty and (bad["impl"] == "fused").all()
    assert (mutant["status"] == "pass").sum() > 0  # decode cases: the mutant computes the fused result


def test_baseline_diff_marks_exactly_the_mutant_rows_regress(runs):
    d, clean, mutant = runs
    old, new = frames.read([d / "clean.csv"]), frames.read([d / "mutant.csv"])
    got = diff.diff(old, new)
    assert set(got["change"]) == {"REGRESS"}
    assert _keys(got) == _keys(mutant[mutant["status"] == "fail"])
    back = diff.diff(new, old)  # and the other way round: exactly those rows are FIXED
    assert set(back["change"]) == {"FIXED"} and _keys(back) == _keys(got)


def test_diff_new_removed_and_identity(runs):
    _, clean, _ = runs
    assert diff.diff(clean, clean).empty
    one_case = clean["case"].iloc[0]
    got = diff.parity_diff(clean[clean["case"] != one_case], clean)
    assert set(got["change"]) == {"NEW"} and set(got["case"]) == {one_case}
    got = diff.parity_diff(clean, clean[clean["case"] != one_case])
    assert set(got["change"]) == {"REMOVED"} and len(got) == (clean["case"] == one_case).sum()


def test_shards_merge_into_the_whole_run(runs, device, tmp_path):
    _, clean, _ = runs
    paths = []
    for i in (1, 2, 3):
        part = run_frame(device, mutant=False, shard_spec=f"{i}/3")
        paths.append(tmp_path / f"shard{i}.csv")
        part.to_csv(paths[-1], index=False)
    merged = frames.read(paths + paths[:1])  # a shard passed twice is not counted twice
    assert len(merged) == len(clean) and _keys(merged) == _keys(clean)
    assert diff.diff(clean, merged).empty
    with pytest.raises(ValueError, match="missing columns"):
        pd.DataFrame({"op": [OP]}).to_csv(tmp_path / "bad.csv", index=False)
        frames.read([tmp_path / "bad.csv"])


def test_rows_that_share_the_repeat_key_but_differ_elsewhere_are_all_kept(runs, tmp_path):
    """``frames.read`` compares whole rows only among those whose key columns repeat: two rows equal in
    case, impl, check and seconds but not in their verdict are two rows, and an exact repeat is one."""
    _, clean, _ = runs
    twin = clean.iloc[[0]].assign(status="fail" if clean["status"].iloc[0] != "fail" else "pass")
    clean.to_csv(tmp_path / "a.csv", index=False)
    pd.concat([twin, clean.iloc[[0]]]).to_csv(tmp_path / "b.csv", index=False)
    merged = frames.read([tmp_path / "a.csv", tmp_path / "b.csv"])
    assert len(merged) == len(clean) + 1
    assert len(merged.drop_duplicates()) == len(merged)


def test_a_csv_from_before_a_column_was_added_reads_with_its_old_meaning(runs, tmp_path):
    """A previous nightly's CSV is the next one's baseline: ``precision`` came later and meant exact-fp32."""
    _, clean, _ = runs
    clean.drop(columns=["precision"]).to_csv(tmp_path / "old.csv", index=False)
    old = frames.read([tmp_path / "old.csv"])
    assert (old["precision"] == "exact-fp32").all() and len(old) == len(clean)
    assert diff.diff(old, clean.assign(precision="exact-fp32")).empty


def test_perf_slower_needs_the_spreads_apart_not_only_the_medians():
    """Planted bug: a median-only rule (p50 new > p50 old · (1 + t)) flags the host-noise row ``noisy``
    (mla_fp8_prepare's reference at B 1, H 64 in two H200 nightlies: p50 517 -> 744 us, spreads
    overlapping); a rule without the threshold flags ``shift`` at 20 %."""
    prov = dict(git_sha="x", device="cuda:H200", arch="sm90", fp8_format="e4m3fn", torch="t", triton="t",
                shim="", profile="nightly", seed=0)
    base = dict(op=OP, impl="fused", mode="eager", reference_p50_us=20.0, compiled_p50_us=15.0, speedup_vs_reference=2.0,
                speedup_vs_compiled=1.5, gbps=1.0, frac_of_copy=0.5, launches=1, **prov)

    def rows(quantiles):
        return pd.DataFrame([dataclasses.asdict(PerfRow(case=case, p20_us=p20, p50_us=p50, p80_us=p80, **base))
                             for case, (p20, p50, p80) in quantiles.items()])

    old = rows({"shift": (391.6, 392.7, 394.0),  # shared-KV MLA B 64 prefix 4K on the H200: a tight spread
                "noisy": (499.2, 517.4, 529.3), "faster": (10.0, 11.0, 12.0)})
    new = rows({"shift": (391.6 * 1.15, 392.7 * 1.15, 394.0 * 1.15),  # the whole spread 15 % slower
                "noisy": (503.2, 744.4, 785.0), "faster": (5.0, 6.0, 7.0)})
    got = diff.perf_diff(old, new, threshold=0.10)
    assert list(got["case"]) == ["shift"] and set(got["change"]) == {"SLOWER"}
    assert got["old"].tolist() == [392.7] and got["new"].tolist() == [pytest.approx(392.7 * 1.15)]  # the p50s
    assert list(diff.perf_diff(old, new, threshold=0.20)["case"]) == []
    assert list(diff.perf_diff(old, new, threshold=0.0)["case"]) == ["shift"]


def test_junit_one_testcase_per_case_failure_names_worst_check_and_repro(runs):
    _, _, mutant = runs
    root = junit.to_xml(mutant).getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == len(mutant.drop_duplicates(["op", "impl", "case"]))
    failing = {(tc.get("classname"), tc.get("name")): tc.find("failure") for tc in cases if tc.find("failure") is not None}
    bad = mutant[mutant["status"] == "fail"]
    assert set(failing) == {(f"{OP}.{i}", c) for i, c in zip(bad["impl"], bad["case"])}
    for (cls, case), el in failing.items():
        rows = bad[bad["case"] == case]
        assert rows["repro"].iloc[0] in el.get("message")
        assert el.get("type") in set(rows["check"])
        assert all(ch in el.text for ch in rows["check"])  # the body lists every failing check
    suite = root.find("testsuite")
    assert int(suite.get("failures")) == len(failing) and int(suite.get("tests")) == len(cases)
    ET.fromstring(ET.tostring(root))  # well-formed


def test_html_sections_and_self_contained(runs):
    _, clean, mutant = runs
    text = html.render(mutant, mutants=mutant, diff=diff.diff(clean, mutant), baseline="clean.csv")
    for sid in ("summary", "per-op", "failures", "plots", "timelines", "kill-matrix", "perf", "gate", "diff"):
        assert f'id="{sid}"' in text, sid
    bad = mutant[mutant["status"] == "fail"]
    assert bad["repro"].iloc[0].replace("'", "&#39;") in text
    assert "REGRESS" in text and "<svg" in text
    for needle in ("<script", "<link", "src=", "url(", "@import"):
        assert needle not in text, needle
    assert text.count("http") == text.count('xmlns="http://www.w3.org/2000/svg"')


def test_kill_matrix_counts_cases_per_check(runs):
    _, _, mutant = runs
    km = html.kill_matrix(mutant).set_index("impl")
    bad = mutant[mutant["status"] == "fail"]
    assert km.loc["fused", "killed"] == "KILLED" and km.loc["reference", "killed"] == "SURVIVED"
    for check, g in bad.assign(check=bad["check"].str.split("@").str[0]).groupby("check"):
        assert km.loc["fused", check] == g["case"].nunique()


def _report(*args):
    env = subprocess_env()
    return harness_cli(["report", *args], env=env, timeout=300)


@pytest.mark.long
def test_cli_report_exit_code_follows_regressions(runs, tmp_path):
    d, _, mutant = runs
    r = _report("--csv", d / "mutant.csv", "--baseline", d / "clean.csv", "--mutants", d / "mutant.csv", "--out", tmp_path / "a")
    assert r.returncode == 1, r.stdout + r.stderr
    for name in ("report.html", "junit.xml", "merged.parquet", "diff.csv"):
        assert (tmp_path / "a" / name).stat().st_size > 0, name
    written = pd.read_csv(tmp_path / "a" / "diff.csv")
    assert (written["change"] == "REGRESS").sum() == (mutant["status"] == "fail").sum()
    r = _report("--csv", d / "clean.csv", "--baseline", d / "mutant.csv", "--out", tmp_path / "b")
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(pd.read_csv(tmp_path / "b" / "diff.csv")["change"]) == {"FIXED"}
    # the nightly's way: the previous report's merged.parquet is the baseline, the shards may be Parquet too
    r = _report("--csv", tmp_path / "a" / "merged.parquet", "--baseline", tmp_path / "b" / "merged.parquet",
                "--out", tmp_path / "c")
    assert r.returncode == 1, r.stdout + r.stderr
    assert pd.read_csv(tmp_path / "c" / "diff.csv").equals(written)


def test_report_reads_writes_and_refuses_without_importing_torch(runs, tmp_path):
    """The report reads results, diffs them and writes its files with pandas and pyarrow alone: importing torch
    (1.2-2.4 s of a nightly report's 16 s) bought it only an exception class. A file it cannot trust is still a
    one-line error, exit 2. Planted: ``CSVError`` a ``reference.checks.VerifyParityInputError`` again."""
    d = runs[0]
    r, imported = harness_imports("report", "--csv", d / "clean.csv", "--baseline", d / "clean.csv",
                                  "--out", tmp_path / "a")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "a" / "report.html").stat().st_size > 0
    assert "pandas" in imported and "torch" not in imported
    (tmp_path / "bad.csv").write_text("op,impl\nx,y\n")
    r, imported = harness_imports("report", "--csv", tmp_path / "bad.csv", "--out", tmp_path / "b")
    assert r.returncode == 2 and "torch" not in imported, r.stderr[-2000:]
    assert "bad.csv: not a ParityRow results file, missing columns" in r.stderr.strip().splitlines()[-1]


def test_results_round_trip_through_parquet_dictionary_encoded_and_csv_gz(runs, tmp_path):
    """``write_frame`` by suffix: Parquet with the provenance and ids dictionary-encoded reads back as the CSV
    does (``frames.read``), and so does a ``.csv.gz`` (really gzip: written through a temporary ``.tmp`` name, it
    was once plain text that the reader, going by the suffix, refused)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reports.rows import write_frame

    d = runs[0]
    want = frames.read([d / "mutant.csv"])
    for name in ("m.parquet", "m.csv.gz"):
        write_frame(want, tmp_path / name)
        got = frames.read([tmp_path / name])
        pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert (tmp_path / "m.csv.gz").read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic
    schema = pq.read_schema(tmp_path / "m.parquet")
    encoded = {f.name for f in schema if pa.types.is_dictionary(f.type)}
    assert {"git_sha", "device", "torch", "profile", "op", "impl", "case", "check", "status", "repro"} <= encoded
    assert not {"worst", "detail", "err", "seed"} & encoded  # free text and numbers stay plain
    # a Parquet file cut short (a download that stopped) is refused, naming the file
    cut = tmp_path / "cut.parquet"
    cut.write_bytes((tmp_path / "m.parquet").read_bytes()[:-100])
    with pytest.raises(frames.CSVError, match="cut.parquet.*Parquet file"):
        frames.read([cut])


def test_parquet_shards_with_their_own_categories_and_empty_cells_read_as_text(runs, tmp_path):
    """Shards written apart hold different dictionaries (categoricals with other categories) and null text cells
    (a compiled run's shim): ``frames.read`` gives every text cell as a string, "" where it was empty, and the
    rows the CSV holds. Planted, each fails: the categorical branch of ``frames._text`` without its "" for empty
    cells (NaN), or ``astype(str)`` there ("nan"); the string branch without its ``fillna``."""
    from reports.rows import write_frame

    want = frames.read([runs[0] / "mutant.csv"])
    half = len(want) // 2
    first = want.iloc[:half].copy()
    empty = first.index[::2]
    assert (first.loc[first.index[1::2], "shim"] != "").any()  # the column's dictionary holds strings too
    first.loc[empty, ["shim", "detail"]] = None  # null in the file (a compiled run writes no shim id)
    write_frame(first, tmp_path / "a.parquet")
    write_frame(want.iloc[half:], tmp_path / "b.parquet")
    got = frames.read([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    expect = want.copy()
    expect.loc[empty, ["shim", "detail"]] = ""
    pd.testing.assert_frame_equal(got, expect, check_dtype=False)
    for c in (f.name for f in dataclasses.fields(ParityRow) if f.type in ("str", str)):
        assert got[c].map(type).eq(str).all(), c


def test_per_op_table_counts_failing_rows_per_check(runs):
    _, _, mutant = runs
    table = html.per_op_checks(mutant, OP).set_index("impl")
    base = mutant.assign(check=mutant["check"].str.split("@").str[0])
    for (impl, check), g in base.groupby(["impl", "check"]):
        n_fail = int((g["status"] == "fail").sum())
        assert table.loc[impl, check] == (f"{n_fail}/{len(g)}" if n_fail else f"ok {len(g)}")


def test_cli_run_writes_junit_beside_the_csv(tmp_path):
    env = subprocess_env()
    r = harness_cli(["run", "--op", OP, "--impl", "fused", "--generated", "0", "--case", "one-token", "--quiet",
                     "--csv", tmp_path / "r.csv", "--junit", tmp_path / "r.xml"], env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = pd.read_csv(tmp_path / "r.csv")
    cases = ET.parse(tmp_path / "r.xml").getroot().findall(".//testcase")
    assert sorted(tc.get("name") for tc in cases) == sorted(rows["case"].unique())


def test_summary_and_html_show_each_implementations_fp8_policy(runs):
    """The report states the fp8 overflow policy per implementation, as its rows say."""
    from reports.summary import summary

    _, clean, _ = runs
    f = clean.assign(fp8_policy=clean["impl"].map({"reference": "case (saturate|nan)", "fused": "saturate"}))
    s = summary(f).set_index("impl")
    assert s.loc["fused", "fp8_policy"] == "saturate" and s.loc["reference", "fp8_policy"] == "case (saturate|nan)"
    text = html.render(f)
    table = text[text.index('id="summary-table"'):text.index("</table>", text.index('id="summary-table"'))]
    assert "<th>fp8_policy</th>" in table and "<td class=\"\">saturate</td>" in table.replace("<td>", '<td class="">')


def test_summary_and_html_show_each_implementations_precision(runs):
    """The declared precision class per implementation, beside its fp8_policy, as its rows say
    (harness.tolerance): the summary column and the HTML summary table. Planted: a summary
    without the column fails."""
    from reports.summary import summary

    _, clean, _ = runs
    f = clean.assign(fp8_policy="", precision=clean["impl"].map({"reference": "exact-fp32", "fused": "bf16-p"}))
    s = summary(f)
    assert list(s.columns).index("precision") == list(s.columns).index("fp8_policy") + 1
    s = s.set_index("impl")
    assert s.loc["fused", "precision"] == "bf16-p" and s.loc["reference", "precision"] == "exact-fp32"
    text = html.render(f)
    table = text[text.index('id="summary-table"'):text.index("</table>", text.index('id="summary-table"'))]
    assert "<th>precision</th>" in table and ">bf16-p</td>" in table


def test_html_shows_the_targeted_kill_matrix_with_survivors_marked(runs):
    from harness.mutants import killmatrix

    _, clean, _ = runs
    rows = [killmatrix.KillRow("qk_norm_rope/fused", "clean", "passed", "passed", "passed", "", "", "", "", 1.0, ""),
            killmatrix.KillRow("qk_norm_rope/mutant-a", "mutant", "killed", "passed", "passed", "numeric:q_out", "",
                               "", "parity ... [numeric:q_out]", 1.0, "", e2e="invisible"),
            killmatrix.KillRow("qk_norm_rope/mutant-b", "mutant", "passed", "passed", "passed", "", "", "", "", 1.0,
                               "")]
    text = html.render(clean, killmatrix=killmatrix.frame(rows))
    table = text[text.index('id="kill-matrix-targeted"'):]
    table = table[:table.index("</table>")]
    assert "<th>e2e</th>" in table and "invisible" in table and "not run" in table
    assert 'class="SURVIVED">qk_norm_rope/mutant-b<' in table  # nothing flagged it
    assert 'class="SURVIVED">qk_norm_rope/mutant-a<' not in table and 'class="">qk_norm_rope/mutant-a<' in table


@pytest.mark.long
def test_cli_report_timelines_fail_once_with_the_runs_repro(runs, tmp_path):
    """A timelines CSV with one failing run (and a passing one, in a second file): the HTML names
    the run with the repro the timelines command printed, junit.xml has exactly one failing
    timeline testcase for it, and the summary counts it."""
    d, clean, _ = runs
    tl_clean, tl_mutant, repro = timeline_csvs(tmp_path)
    r = _report("--csv", d / "clean.csv", "--timelines", tl_mutant, "--timelines", tl_clean, "--timelines", tl_clean,
                "--out", tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr  # timeline failures fail the nightly, not the report
    assert "timelines: 2 runs (1 failing)" in r.stdout, r.stdout

    text = (tmp_path / "out" / "report.html").read_text()
    summary = text[text.index('id="summary"'):text.index('id="summary-table"')]
    assert "2 timeline runs" in summary and "timeline fail 1<" in summary and "timeline pass 1<" in summary
    table = text[text.index('id="timelines-table"'):]
    table = table[:table.index("</table>")]
    mutant_path, clean_path = f"qwen35-gqa:{TIMELINE_MUTANT}", "qwen35-gqa:reference+reference"
    assert table.count("<tr>") == 3 and mutant_path in table and clean_path in table
    fails = text[text.index('id="timeline-failures"'):]
    fails = fails[:fails.index("</table>")]
    assert fails.count("<tr>") == 2  # header + the one failing run
    assert mutant_path in fails and TIMELINE in fails and "target_verify" in fails
    assert f'<code class="repro">{repro.replace(chr(39), "&#39;")}</code>' in fails

    root = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    suite = root.find("testsuite[@name='timelines.qwen35-gqa']")
    cases = suite.findall("testcase")
    assert {tc.get("name") for tc in cases} == {f"{TIMELINE} [{mutant_path}]", f"{TIMELINE} [{clean_path}]"}
    assert {tc.get("classname") for tc in cases} == {"timelines.qwen35-gqa"}
    failing = [tc for tc in cases if tc.find("failure") is not None]
    assert [tc.get("name") for tc in failing] == [f"{TIMELINE} [{mutant_path}]"] and suite.get("failures") == "1"
    assert failing[0].find("failure").get("message").endswith(f"repro: {repro}")
    assert len(root.findall("testsuite")) == 1 + clean["op"].nunique()  # the parity suites are still there


def test_git_sha_names_uncommitted_code(tmp_path):
    """A dirty tree's sha carries a hash of its diff: the same changes give the same sha, other
    changes another one, a clean tree none."""

    from reports.rows import git_sha

    run = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (tmp_path / "k.py").write_text("x = 1\n")
    run("add", "k.py")
    run("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")
    clean = git_sha(tmp_path)
    assert len(clean) == 12 and "+" not in clean
    (tmp_path / "k.py").write_text("x = 2\n")
    a = git_sha(tmp_path)
    (tmp_path / "k.py").write_text("x = 3\n")
    b = git_sha(tmp_path)
    (tmp_path / "k.py").write_text("x = 2\n")
    assert a.startswith(clean + "+dirty.") and b.startswith(clean + "+dirty.") and a != b and git_sha(tmp_path) == a


def test_html_provenance_says_the_shim_is_off_for_compiled_rows(runs):
    """Planted: no mapping (an empty cell, as the H200 nightly's HTML showed) fails."""
    _, clean, _ = runs
    text = html.render(clean.assign(shim=""))
    prov = text[text.index('id="provenance"'):text.index("</table>", text.index('id="provenance"'))]
    assert "<th>shim</th><td>off (compiled Triton)</td>" in prov
    mixed = html.render(pd.concat([clean, clean.assign(shim="")]))
    prov = mixed[mixed.index('id="provenance"'):mixed.index("</table>", mixed.index('id="provenance"'))]
    shim_cell = prov[prov.index("<th>shim</th>"):].split("</tr>")[0]
    assert "off (compiled Triton)" in shim_cell and (clean["shim"].iloc[0] or "off") in shim_cell


def test_to_frame_reads_every_field_as_asdict_does():
    """``reports.rows.to_frame`` reads each row's fields as they are (``dataclasses.asdict`` deep-copied
    every value: 8.5 s for a nightly step's 230K rows, 1.35 s now): the same frame, cell for cell and
    dtype for dtype, failing rows (NaNs, details, worst elements) included."""
    from reports.rows import to_frame

    rows = [ParityRow(op="qk_norm_rope", impl=impl, kind="fused", case=f"c{i}", check="numeric:q_out",
                      status="fail" if i % 2 else "pass", err=float("nan") if i == 1 else 0.5 * i, ref_err=0.1,
                      allowed=1.0, max_abs=2.0 ** -i, max_rel=float("inf"), mismatch_frac=0.0, nan_inf_mismatch=i,
                      worst="(0, 1): 1/2" if i else "", detail="d", seconds=1e-3, fp8_policy="", precision="exact-fp32",
                      nan_policy="", known="", repro=f"python -m harness repro 'x:{i}'", git_sha="abc", device="cpu",
                      arch="host", fp8_format="e4m3fn", torch="2.13", triton="3.9", shim="s", profile="dev", seed=i)
            for i, impl in enumerate(("fused", "reference", "fused", "mutant-x"))]
    want = pd.DataFrame([dataclasses.asdict(r) for r in rows], columns=[f.name for f in dataclasses.fields(ParityRow)])
    pd.testing.assert_frame_equal(to_frame(rows), want)
    assert list(to_frame([]).columns) == list(want.columns)
