"""The HTML report in headless Chromium: open the file, assert the key elements in the DOM
Chromium built, take a screenshot (kept under $VP_ARTIFACTS when set).

Chromium comes from Debian (``.ci/run`` installs it and sets VP_REQUIRE_BROWSER=1, which turns
a missing browser into a failure instead of a skip)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from reports import build
from reports.rows import GateRow, PerfRow
from tests.report_runs import OP, run_frame, timeline_csvs

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars")


def _browser() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        if os.environ.get("VP_REQUIRE_BROWSER") == "1":
            pytest.fail(f"VP_REQUIRE_BROWSER=1 but none of {BROWSERS} is on PATH (.ci/run installs Debian's chromium)")
        pytest.skip(f"no headless browser on PATH (looked for {', '.join(BROWSERS)}); "
                    "`apt-get install -y chromium` or run .ci/run")
    return found


def _chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [exe, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp)})
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-3000:]}"
    return r


def _extras(frame: pd.DataFrame, tmp: Path) -> tuple[Path, Path]:
    """A perf and a gate CSV in their row schemas (rendering only: these numbers are not measured)."""
    prov = {k: frame[k].iloc[0] for k in ("git_sha", "device", "arch", "fp8_format", "torch", "triton", "shim",
                                          "profile", "seed")}
    perf = [PerfRow(op=OP, impl="fused", case=f"T={t},H=16", mode="eager", p20_us=t * 0.9, p50_us=t * 1.0, p80_us=t * 1.1,
                    reference_p50_us=t * 2.0, compiled_p50_us=t * 1.5, speedup_vs_reference=2.0,
                    speedup_vs_compiled=1.5, gbps=100.0, frac_of_copy=0.02, launches=1, **prov) for t in (4, 64)]
    gate = [GateRow(layout="dsv4-mqa-ring", path="fused", expect="pass", model="rendering-fixture",
                    drafter="prompt-lookup", extraction="strict", problems=64, accuracy=0.95, accuracy_lo=0.87,
                    accuracy_hi=0.99, ref_accuracy=0.95, exact_agreement=1.0, tie_divergences=0, mean_accept_len=2.5,
                    worse=0, better=0, p_value=1.0, temperature=0.0, dist_tokens=0, dist_log10_p=0.0, verdict="pass",
                    detail="rendering fixture", seconds=1.0, **prov)]
    pd.DataFrame([dataclasses.asdict(r) for r in perf]).to_csv(tmp / "perf.csv", index=False)
    pd.DataFrame([dataclasses.asdict(r) for r in gate]).to_csv(tmp / "gate.csv", index=False)
    return tmp / "perf.csv", tmp / "gate.csv"


def test_report_renders_in_headless_chromium(device, tmp_path):
    exe = _browser()
    clean, mutant = run_frame(device, mutant=False), run_frame(device, mutant=True)
    clean.to_csv(tmp_path / "clean.csv", index=False)
    mutant.to_csv(tmp_path / "mutant.csv", index=False)
    perf, gate = _extras(clean, tmp_path)
    tl_clean, tl_mutant, tl_repro = timeline_csvs(tmp_path)
    b = build.build([tmp_path / "mutant.csv"], tmp_path / "out", mutants=[tmp_path / "mutant.csv"], perf=[perf],
                    gate=[gate], baseline=tmp_path / "clean.csv", timelines=[tl_clean, tl_mutant])
    assert b.regress == int((mutant["status"] == "fail").sum()) > 0
    assert (b.timeline_runs, b.failed_timeline_runs) == (2, 1)
    page = (tmp_path / "out" / "report.html").resolve().as_uri()

    dom = _chromium(exe, tmp_path, "--dump-dom", page).stdout
    for sid in ("summary", "failures", "timelines", "kill-matrix", "diff", "plots", "perf", "gate"):
        assert f'id="{sid}"' in dom, sid
    assert 'id="summary-table"' in dom and 'id="regress-table"' in dom  # the diff's changes are its regressions
    assert 'id="timelines-table"' in dom and 'id="timeline-failures"' in dom
    assert f'<code class="repro">{tl_repro}</code>' in dom  # the failing timeline run with its repro
    repro = mutant[mutant["status"] == "fail"]["repro"].iloc[0]
    assert f'<code class="repro">{repro}</code>' in dom  # a failure with its one-line repro
    assert dom.count('class="REGRESS"') == b.regress
    assert ">KILLED<" in dom and ">SURVIVED<" in dom  # fused (the mutant) killed, reference not
    assert dom.count("<svg") >= 1 and 'class="fail"' in dom

    shot = tmp_path / "report.png"
    _chromium(exe, tmp_path, f"--screenshot={shot}", "--window-size=1400,2200", page)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a blank page compresses far below this
    if os.environ.get("VP_ARTIFACTS"):
        dest = Path(os.environ["VP_ARTIFACTS"])
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, dest / "report-screenshot.png")
        shutil.copy(tmp_path / "out" / "report.html", dest / "report-browser-test.html")


# ----------------------------------------------------------------------------- a report a reviewer reads at a glance

PROBE = """<script>
window.addEventListener("load", () => {
  const rows = [...document.querySelectorAll("#regress-table tr")].slice(1);
  const first = rows.length ? rows[0].getBoundingClientRect() : null;
  const tables = [...document.querySelectorAll("table")].map(t => t.getBoundingClientRect().right);
  const out = {first_top: first && first.top, first_bottom: first && first.bottom, inner: [innerWidth, innerHeight],
               scroll_width: document.documentElement.scrollWidth, widest_table: Math.max(0, ...tables),
               regressions: rows.map(r => r.cells[3].title + " " + r.cells[4].textContent)};
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _rows(n: int, status: str, *, op: str, check: str, tag: str) -> list[dict]:
    """``n`` parity rows with long generated-looking case ids (the widest cells a report has)."""
    from reports.rows import ParityRow

    prov = dict(git_sha="abc1234", device="cuda:NVIDIA H200", arch="sm90", fp8_format="e4m3fn", torch="2.11",
                triton="3.6", shim="", profile="nightly", seed=0)
    out = []
    for i in range(n):
        case = (f"{op}:B={i % 64 + 1},L={i % 7 + 1},H={8 * (i % 16 + 1)},Hkv=1,D=576,Dv=512,prefix={1000 + 37 * i},"
                f"page=64,kv_dtype=fp8_e4m3fn,k_scale=0.0{i % 9 + 1},v_scale=0.5,topk=1,causal=True,tag={tag}{i}")
        out.append(dataclasses.asdict(ParityRow(
            op=op, impl="fused", kind="fused", case=case, check=check, status=status, err=2.0 if status == "fail" else 0.1,
            ref_err=0.1, allowed=1.0, max_abs=0.0, max_rel=0.0, mismatch_frac=0.0, nan_inf_mismatch=0,
            worst="(0, 1, 2): 0.1234567 / 0.1234 / 0.1235; " * 3, detail="err 2 > allowed 1 " * 4, seconds=0.01,
            fp8_policy="", precision="exact-fp32", nan_policy="", known="",
            repro=f"python -m harness repro '{case}' --impl fused --device cuda", **prov)))
    return out


def test_a_report_with_150_regressions_leads_with_every_one_within_1400_px(tmp_path):
    """A baseline diff with 160 REGRESS rows behind 1,300 NEW ones in file order (long generated case ids,
    as a nightly's): Chromium at 1,400 x 900 shows the first regression on its first screen, no horizontal
    scroll (the page and every table at most 1,400 px wide), and every regression is in the page. Planted:
    before, the diff table was cut at 1,000 rows in file order (NEW first: 0 of the 160 regressions shown),
    below every other section, and its tables ran to 2,551 px."""
    exe = _browser()
    n_regress, n_new = 160, 1300
    base = _rows(n_regress, "pass", op="verify_attention", check="numeric:out", tag="r")
    new = (_rows(n_new, "pass", op="verify_attention", check="numeric:out", tag="n")
           + _rows(n_regress, "fail", op="verify_attention", check="numeric:out", tag="r"))
    pd.DataFrame(base).to_csv(tmp_path / "baseline.csv", index=False)
    pd.DataFrame(new).to_csv(tmp_path / "run.csv", index=False)
    b = build.build([tmp_path / "run.csv"], tmp_path / "out", baseline=tmp_path / "baseline.csv")
    assert b.regress == n_regress
    html = (tmp_path / "out" / "report.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    dom = _chromium(exe, tmp_path, "--window-size=1400,900", "--virtual-time-budget=5000", "--dump-dom",
                    probe.resolve().as_uri()).stdout
    import html as html_lib
    import json

    m = json.loads(html_lib.unescape(dom.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]))
    assert m["inner"][0] <= 1400, m["inner"]
    assert m["first_top"] is not None and 0 <= m["first_top"] and m["first_bottom"] <= m["inner"][1], m  # the viewport
    assert m["scroll_width"] <= 1400 and m["widest_table"] <= 1400, m
    want = {f"{r['case']} {r['check']}" for r in base}
    assert len(m["regressions"]) == n_regress and set(m["regressions"]) == want
    assert "more changes, not shown" in dom and 'href="diff.csv"' in dom  # the cut NEW rows: a count and the file
