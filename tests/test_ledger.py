"""Known-failure ledgers (harness/ledger.py): a known failure reads ``known``, anything else still fails,
and a known failure that stops happening fails as ``ledger:<id>``."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from harness import ledger
from harness.parity import runners
from harness.parity import suite
from reports import summary
from harness.ledger import KnownFailure
from harness.registry import Impl
from reference.qk_norm_rope import chain as r
from tests.helpers import ROOT, subprocess_env

OP = "qk_norm_rope"


def _weightless_when_odd(**kw):
    """A planted bug on odd token counts only: the kv norm weight dropped."""
    if kw["q"].shape[0] % 2:
        kw = {**kw, "kv_norm_weight": kw["kv_norm_weight"] * 0 + 1}
    return r.qk_norm_rope_step(**kw)


ODD = KnownFailure(id="odd-tokens", op=OP, impls=("vendor",), checks=("numeric:kv_out*",), when=lambda c: c.T % 2 == 1,
                   pattern="an odd token count", cause="planted: kv weight dropped", upstream="tests/test_ledger.py")


def _rows(registry, device, case_name, fn, entries):
    spec = registry.ops[OP]
    case = {c.name: c for c in spec.catalog()}[case_name]
    impl = Impl(OP, "vendor", "external", fn)
    res = runners.run_case(spec, impl, case, device, determinism=False)
    p = suite.Planned(spec, case)
    return pd.DataFrame([vars(x) for x in suite.rows_for(p, impl, device, res, suite.provenance(device, _prof(), 0),
                                                          entries)])


def _prof():
    from cases import profiles

    return profiles.current("dev")


def test_a_known_failure_reads_known_and_names_its_entry(registry, device):
    f = _rows(registry, device, "odd-tokens-odd-heads", _weightless_when_odd, (ODD,))  # T = 7
    kv = f[f["check"].str.startswith("numeric:kv_out")]
    assert len(kv) and (kv["status"] == "known").all() and (kv["known"] == "odd-tokens").all()
    assert "fail" not in set(f["status"])
    assert not summary.failures(f).shape[0]
    s = summary.summary(f).iloc[0]
    assert (s["known"], s["failed"], s["passed"]) == (1, 0, 0)


def test_without_the_ledger_the_same_rows_fail(registry, device):
    f = _rows(registry, device, "odd-tokens-odd-heads", _weightless_when_odd, ())
    assert (f[f["check"].str.startswith("numeric:kv_out")]["status"] == "fail").all()


def test_a_failure_the_entry_does_not_name_still_fails(registry, device):
    narrow = KnownFailure(**{**vars(ODD), "checks": ("numeric:q_out*",)})  # names the wrong output
    f = _rows(registry, device, "odd-tokens-odd-heads", _weightless_when_odd, (narrow,))
    assert (f[f["check"].str.startswith("numeric:kv_out")]["status"] == "fail").all()
    assert (f["check"] == "ledger:odd-tokens").any()  # and its own checks passed: fixed?
    assert summary.summary(f).iloc[0]["failed"] == 1


def test_a_known_failure_that_did_not_happen_fails(registry, device):
    f = _rows(registry, device, "odd-tokens-odd-heads", r.qk_norm_rope_step, (ODD,))  # the bug is fixed
    gone = f[f["check"] == "ledger:odd-tokens"]
    assert len(gone) == 1 and gone["status"].iloc[0] == "fail" and "did not happen" in gone["detail"].iloc[0]
    # a case outside the entry's pattern (T = 8): nothing expected, nothing added
    f = _rows(registry, device, "with-q-weight", r.qk_norm_rope_step, (ODD,))
    assert set(f["status"]) == {"pass"} and not (f["check"] == "ledger:odd-tokens").any()


def test_entries_need_a_cause_and_an_upstream_reference():
    with pytest.raises(ValueError, match="upstream"):
        KnownFailure(**{**vars(ODD), "upstream": ""})
    with pytest.raises(ValueError, match="checks"):
        KnownFailure(**{**vars(ODD), "checks": ()})


def test_load_by_name_and_by_module_attr_and_refuses_junk():
    from cases.ledgers import sglang

    assert ledger.load("sglang") == sglang.LEDGER
    assert ledger.load("cases.ledgers.sglang:LEDGER") == sglang.LEDGER
    with pytest.raises(ValueError, match="--ledger nope"):
        ledger.load("nope")
    with pytest.raises(ValueError, match="expected KnownFailure"):
        ledger.load("tests.test_ledger:OP")


PLUGIN = textwrap.dedent('''
    from harness.ledger import KnownFailure
    from harness.registry import Impl
    from reference.qk_norm_rope import chain as r

    def fn(**kw):
        if kw["q"].shape[0] % 2:
            kw = {**kw, "kv_norm_weight": kw["kv_norm_weight"] * 0 + 1}
        return r.qk_norm_rope_step(**kw)

    VENDOR = Impl("qk_norm_rope", "vendor", "external", fn)
    LEDGER = [KnownFailure(id="odd-tokens", op="qk_norm_rope", impls=("vendor",), checks=("numeric:kv_out*",),
                           when=lambda c: c.T % 2 == 1, pattern="odd T", cause="planted", upstream="here")]
''')


def test_cli_run_with_a_ledger_exits_0_on_known_failures_only(tmp_path):
    (tmp_path / "vp_ledger_plugin.py").write_text(PLUGIN)
    env = subprocess_env(tmp_path)
    args = [sys.executable, "-m", "harness", "run", "--op", OP, "--impl", "vp_ledger_plugin:VENDOR", "--generated", "0",
            "--case", "odd-tokens", "--csv", str(tmp_path / "rows.csv"), "--quiet"]
    plain = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert plain.returncode == 1 and "FAIL vendor" in plain.stdout, plain.stdout + plain.stderr
    led = subprocess.run(args + ["--ledger", "vp_ledger_plugin:LEDGER"], cwd=ROOT, capture_output=True, text=True,
                         env=env, timeout=600)
    assert led.returncode == 0, led.stdout + led.stderr
    assert "KNOWN vendor [odd-tokens]: 1 cases" in led.stdout and "FAIL" not in led.stdout
    assert set(pd.read_csv(tmp_path / "rows.csv")["status"]) <= {"pass", "known"}
