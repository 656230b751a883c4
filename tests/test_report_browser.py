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
                    worse=0, better=0, p_value=1.0, verdict="pass", detail="rendering fixture", seconds=1.0, **prov)]
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
    assert 'id="summary-table"' in dom and 'id="diff-table"' in dom
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
