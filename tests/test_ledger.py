"""Known-failure ledgers (harness/ledger.py): a known failure reads ``known``, anything else still fails,
and a known failure that stops happening fails as ``ledger:<id>``."""
from __future__ import annotations

import textwrap

import pandas as pd
import torch
import pytest

from harness import ledger
from harness.parity import runners
from harness.parity import suite
from reports import summary
from harness.ledger import KnownFailure
from harness.registry import Impl
from reference.qk_norm_rope import chain as r
from tests.helpers import harness_cli, subprocess_env

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


@pytest.mark.long
def test_cli_run_with_a_ledger_exits_0_on_known_failures_only(tmp_path):
    (tmp_path / "vp_ledger_plugin.py").write_text(PLUGIN)
    env = subprocess_env(tmp_path)
    args = ["run", "--op", OP, "--impl", "vp_ledger_plugin:VENDOR", "--generated", "0",
            "--case", "odd-tokens", "--csv", str(tmp_path / "rows.csv"), "--quiet"]
    plain = harness_cli(args, env=env, timeout=600)
    assert plain.returncode == 1 and "FAIL vendor" in plain.stdout, plain.stdout + plain.stderr
    led = harness_cli(args + ["--ledger", "vp_ledger_plugin:LEDGER"], env=env, timeout=600)
    assert led.returncode == 0, led.stdout + led.stderr
    assert "KNOWN vendor [odd-tokens]: 1 cases" in led.stdout and "FAIL" not in led.stdout
    assert set(pd.read_csv(tmp_path / "rows.csv")["status"]) <= {"pass", "known"}


# ----------------------------------------------------------------------------- entries that read the inputs

def _argmax_all_nan_row_to_last(**kw):
    """A planted data-dependent bug of a NaN-ignoring greedy accept: a row with no number (all NaN)
    gives its last index instead of 0 (as a block argmax whose NaN-to--inf mapping runs after a
    per-block reduction can). Declares nan_policy="ignore"; right on every other row."""
    from reference.verify_accept import chain as va

    x = kw["target_logits"]
    all_nan = torch.isnan(x).all(dim=-1)
    B, L, _ = va.validate(**kw)
    rows, real = va.request_rows(kw["qo_indptr"], L)
    predict = torch.where(all_nan, x.shape[1] - 1, va.row_argmax(x, "ignore"))
    target = va.gather_targets(predict, rows, real)
    drafts = kw["draft_tokens"].view(B, L)
    n = va.accept_lengths(va.match(target, drafts), real)
    return {"output_ids": va.output_ids(drafts, va.bonus_tokens(target, n), n, real), "accept_length": n}


def _walk_reaches_an_all_nan_row(case, inputs) -> bool:
    """Some real request's walk (under ``ignore``) reads a row whose every logit is NaN."""
    from reference.verify_accept import chain as va

    out = va.verify_accept(**inputs, nan_policy="ignore")
    qo, x = inputs["qo_indptr"].tolist(), inputs["target_logits"]
    return any(bool(torch.isnan(x[qo[b] + j]).all())
               for b in range(len(qo) - 1) if qo[b + 1] > qo[b]
               for j in range(int(out["accept_length"][b]) + 1))


def _some_all_nan_row(case, inputs) -> bool:
    """Too coarse: any all-NaN row of the request rows, read by the walk or not."""
    x = inputs["target_logits"][: int(inputs["qo_indptr"][-1])]
    return bool(torch.isnan(x).all(dim=-1).any())


NAN_ROW = dict(id="all-nan-row", op="verify_accept", impls=("vendor",), checks=("exact:*",), when=lambda c: c.nans > 0,
               pattern="a request's walk reads a row of all-NaN logits", cause="planted: all-NaN row -> last index",
               upstream="tests/test_ledger.py")
# V = 2 with NaNs planted in 30 % of rows: seed 0's walk reads an all-NaN row; seed 1 has one the walk never
# reads (it stops before); seed 4 has none (checked by test_the_planted_cases_are_what_they_say)
NAN_SEEDS = {"read": 0, "unread": 1, "none": 4}


def _nan_rows(device, seed, entries):
    from cases.verify_accept import catalog as vc
    from harness.ops import default_registry

    spec = default_registry(with_mutants=False, with_plugins=False).ops["verify_accept"]
    case = vc.VerifyAcceptCase(B=2, L=3, V=2, nans=0.3, seed=seed, name=f"v2-nan-{seed}")
    impl = Impl("verify_accept", "vendor", "external", _argmax_all_nan_row_to_last, nan_policy="ignore")
    res = runners.run_case(spec, impl, case, device, determinism=False)
    p = suite.Planned(spec, case)
    return pd.DataFrame([vars(x) for x in suite.rows_for(p, impl, device, res, suite.provenance(device, _prof(), 0),
                                                          entries)])


def test_the_planted_cases_are_what_they_say(device):
    from cases.verify_accept import catalog as vc

    got = {}
    for what, seed in NAN_SEEDS.items():
        case = vc.VerifyAcceptCase(B=2, L=3, V=2, nans=0.3, seed=seed)
        kw = {k: v.cpu() for k, v in vc.build_inputs(case, device).items()}
        got[what] = (_walk_reaches_an_all_nan_row(case, kw), _some_all_nan_row(case, kw))
    assert got == {"read": (True, True), "unread": (False, True), "none": (False, False)}


def test_an_inputs_entry_lists_a_data_dependent_failure_exactly(device):
    entry = ledger.KnownFailureOnInputs(**NAN_ROW, when_inputs=_walk_reaches_an_all_nan_row)
    read = _nan_rows(device, NAN_SEEDS["read"], (entry,))
    assert (read[read["check"].str.startswith("exact:")]["status"] != "fail").all()
    assert (read["status"] == "known").any() and not summary.failures(read).shape[0]
    for what in ("unread", "none"):  # the data does not hit it: not covered, nothing expected, all pass
        f = _nan_rows(device, NAN_SEEDS[what], (entry,))
        assert set(f["status"]) == {"pass"}, (what, f[f["status"] != "pass"][["check", "detail"]])
    assert set(_nan_rows(device, NAN_SEEDS["read"], ())["status"]) >= {"fail"}  # without the ledger it fails


def test_a_case_only_or_coarse_condition_cannot_list_it(device):
    """What the inputs entry is for: an entry over the case dataclass covers cases whose data never hits
    the bug and reports the known failure as gone there; so does a data condition that is too coarse."""
    by_case = KnownFailure(**NAN_ROW)
    f = _nan_rows(device, NAN_SEEDS["none"], (by_case,))
    assert (f[f["check"] == "ledger:all-nan-row"]["status"] == "fail").all() and (f["check"] == "ledger:all-nan-row").any()
    coarse = ledger.KnownFailureOnInputs(**NAN_ROW, when_inputs=_some_all_nan_row)
    f = _nan_rows(device, NAN_SEEDS["unread"], (coarse,))
    assert (f["check"] == "ledger:all-nan-row").any() and summary.failures(f).shape[0]


def test_an_inputs_entry_needs_the_inputs_and_a_callable():
    entry = ledger.KnownFailureOnInputs(**NAN_ROW, when_inputs=_some_all_nan_row)
    with pytest.raises(ValueError, match="reads the case's inputs"):
        entry.covers("verify_accept", "vendor", type("C", (), {"nans": 0.5})())
    with pytest.raises(ValueError, match="when_inputs must be callable"):
        ledger.KnownFailureOnInputs(**NAN_ROW, when_inputs=None)
