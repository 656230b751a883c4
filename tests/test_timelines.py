"""Store-timing timelines: clean paths agree with the logical truth at every step, every
timeline mutant is caught, and seed 000's bug — a correct kernel used at the wrong time —
passes per-kernel parity yet fails the timelines."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings

from cases import base
from cases import timelines as tl
from cases.mutants import timelines as mt
from harness.mutants import killmatrix
from harness.parity import runners
from harness.timelines import runner as timeline
from harness.timelines import path as path_mod
from tests.report_runs import timeline_cli as _cli

CATALOG = {t.name: t for t in tl.catalog()}


def _run(path, t, device, **kw):
    return timeline.run_timeline(path, t, device.torch_device, device.fp8_dtype, **kw)


def _explain(bad) -> str:
    return "\n".join(f"step {s.step} ({s.mode}) layer {s.layer} [{s.record.check}] {s.record.detail} {s.record.worst}"
                     for s in bad[:5])


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_clean_fused_path_passes_named_timeline(registry, device, name):
    t = CATALOG[name]
    recs = _run(path_mod.clean_path(registry, t.family), t, device)
    assert not path_mod.failures(recs), _explain(path_mod.failures(recs))
    checks = {s.record.check.split(":r")[0] for s in recs}
    assert {"attn:o", "visible_kv", "state"} <= checks, f"checks that ran: {sorted(checks)}"
    assert any(s.mode == "target_verify" for s in recs)


def test_non_unified_layers_need_a_prepare_with_a_store_of_its_own(registry, monkeypatch):
    """Family.non_unified_layers on a prepare whose adapter has no cache of its own (the fp8 MLA
    prepare) is refused when the run starts, not run as if every layer were unified."""
    t = CATALOG["k3-mla-fp8/width-1"]
    monkeypatch.setitem(tl.FAMILIES, t.family, dataclasses.replace(tl.FAMILIES[t.family], non_unified_layers=(1,)))
    with pytest.raises(ValueError, match="non_unified_layers"):
        timeline.TimelineRun(path_mod.clean_path(registry, t.family), t)


@pytest.mark.parametrize("family", sorted(tl.FAMILIES))
def test_reference_path_passes(registry, device, family):
    """The unfused path (reference prepare + reference attention) is held to the same truth."""
    t = CATALOG.get(f"{family}/mixed-padded") or CATALOG[f"{family}/accept-0-to-L"]  # a q-weighted twin: its one
    recs = _run(path_mod.clean_path(registry, family, prepare="reference", attn="reference"), t, device)
    assert not path_mod.failures(recs), _explain(path_mod.failures(recs))


@settings(max_examples=4, deadline=None)
@given(t=tl.timelines(max_requests=2, max_batches=3, max_width=3))
def test_clean_fused_path_passes_generated_timelines(registry, device, t):
    recs = _run(path_mod.clean_path(registry, t.family), t, device)
    assert not path_mod.failures(recs), base.case_id("timeline", t) + "\n" + _explain(path_mod.failures(recs))


def test_strategy_reaches_rejection_wraparound_padding_and_mixed_batches():
    from hypothesis import find

    def wraps(t):
        fam = tl.FAMILIES[t.family]
        return fam.layout == "ring" and tl.max_len(t) > t.window + t.L
    find(tl.timelines(), wraps)
    find(tl.timelines(), lambda t: any(m == "target_verify" and any(a == 0 for _, a in it)
                                       for m, it in tl.parse_steps(t.steps)))
    find(tl.timelines(), lambda t: t.pad > 0 and any(len(it) > 1 for _, it in tl.parse_steps(t.steps)))
    t = find(tl.timelines(), lambda t: t.family == "k3-mla-fp8" and not t.resolve_loc)
    assert base.parse_case(tl.Timeline, base.case_id("timeline", t).split(":", 1)[1]) == t


def test_catalog_covers_the_issue():
    cat = list(CATALOG.values())
    assert {t.family for t in cat} == set(tl.FAMILIES)
    L = {t.L for t in cat}
    assert 1 in L and max(L) >= 4
    accepts = {(t.L, a) for t in cat for m, it in tl.parse_steps(t.steps) if m == "target_verify" for _, a in it}
    assert {(3, a) for a in range(4)} <= accepts, "every n from 0 to L"
    assert any(t.pad for t in cat) and any(not t.resolve_loc for t in cat)
    assert any(tl.max_len(t) > 2 * (t.window + t.L) for t in cat), "the ring wraps at least twice"


def test_kv_model_rollback_frees_and_reuses_paged_slots():
    from reference import kv_model

    m = kv_model.KVModel(kv_model.KVLayout("paged", 1, 4, 3, (2,), torch.bfloat16), 1, 8)
    m.alloc(0, [0, 1])
    rejected = m.alloc(0, [2, 3, 4]).tolist()
    m.rollback(0, 3)
    assert m.table[0][2] == rejected[0] and len(m.table[0]) == 3
    assert m.alloc(0, [3]).tolist() == [rejected[1]], "freed slots come back at once (lowest first)"
    m.rollback(0, 4, keep_rejected=False)
    assert m.visible_len[0] == 4 and m.history_slots(0).numel() == 4


# ----------------------------------------------------------------------------- seed 000

def test_store_before_attention_passes_kernel_parity_and_fails_timelines(registry, device):
    """The harness's reason for existing: every kernel the seed-000 path runs is correct on its
    own (per-kernel parity on the targeted catalogs passes), yet the path is wrong — and only
    the timeline's attention / visible-KV checks (not just the gate) catch it."""
    m = {x.name: x for x in mt.PATH_MUTANTS}["path-store-before-attention"]
    for key in m.kernels(registry):
        impl = registry.impls[key]
        spec = registry.ops[impl.op]
        for name in spec.kill.cases[:2]:
            case = {c.name: c for c in spec.catalog(big=True)}[name]
            res = runners.run_case(spec, impl, case, device, determinism=False, poisoned=False)
            assert not res.refused and all(r.passed for r in res.records), f"{key} fails parity on {name}"
    t = CATALOG["dsv4-mqa-ring/accept-0-to-L"]
    bad = path_mod.failures(_run(m.path(registry, t.family), t, device))
    fams = {s.record.check.split(":r")[0] for s in bad if s.family == "timeline"}
    assert {"attn:o", "visible_kv"} <= fams, _explain(bad)
    assert all(s.mode == "target_verify" for s in bad), "decode and prefill are right: only verify is wrong"
    # width 1: a single draft has no other draft to see, so the same path is right there
    t1 = CATALOG["dsv4-mqa-ring/width-1"]
    bad1 = [s for s in path_mod.failures(_run(m.path(registry, t1.family), t1, device)) if s.family == "timeline"]
    assert not bad1, _explain(bad1)


@pytest.mark.parametrize("mutant", [m.name for m in mt.PATH_MUTANTS])
def test_path_mutant_is_caught_by_a_timeline_check(registry, device, mutant):
    m = {x.name: x for x in mt.PATH_MUTANTS}[mutant]
    t = CATALOG[f"{m.families[0]}/{mt.PATH_TIMELINE}"]
    bad = path_mod.failures(_run(m.path(registry, t.family), t, device, stop_on_failure=True))
    flagged = {s.record.check for s in bad if s.family == "timeline"}
    assert any(c.startswith(tuple(m.catches)) for c in flagged), f"{mutant}: flagged {sorted(flagged)}"


def test_stale_kv_is_invisible_when_everything_is_accepted(registry, device):
    """The stale-KV mutant differs only after a rejection: with every draft accepted it is right."""
    m = {x.name: x for x in mt.PATH_MUTANTS}["path-stale-rejected-kv"]
    t = tl.Timeline(family="qwen35-gqa", steps="P:0.3;V:0.2;V:0.2;D:0", L=2, window=4)
    assert not path_mod.failures(_run(m.path(registry, t.family), t, device))
    t2 = dataclasses.replace(t, steps="P:0.3;V:0.1;V:0.2;D:0")
    assert path_mod.failures(_run(m.path(registry, t.family), t2, device))


@pytest.mark.parametrize("key,name", [
    ("qk_norm_rope/mutant-store-left-on-in-verify", "dsv4-mqa-ring/width-4-reject"),
    ("qk_norm_rope/mutant-rope-style-swapped-kv", "dsv4-mqa-ring/width-1"),
    ("qk_norm_rope/mutant-nonunified-skips-paged-store", "dsv4-mqa-mixed/mixed-padded"),
    ("mla_fp8_prepare/mutant-untranslated-out-cache-loc", "k3-mla-fp8/width-1"),
    ("mla_fp8_prepare/mutant-fallback-write-skipped", "k3-mla-fp8/fallback-write"),
    ("verify_attention/mutant-drafts-not-causal", "qwen35-gqa/width-4-reject"),
    ("verify_attention/mutant-is-causal-ignored", "dspark-noncausal/width-4-reject"),
])
def test_op_mutant_in_a_clean_path_is_caught_by_the_timeline(registry, device, key, name):
    impl, t = registry.impls[key], CATALOG[name]
    path = next(p for p, tt in killmatrix._op_paths(registry, impl) if tt.family == t.family)
    bad = [s for s in path_mod.failures(_run(path, t, device, stop_on_failure=True)) if s.family == "timeline"]
    assert bad, f"{key} survived {name}"


# ----------------------------------------------------------------------------- kill matrix

@pytest.mark.slow  # 307 s CPU on the 2-core machine (2026-12-07): the nightly runs it (VP_TESTS=all) beside `nox -s
# mutants`, which builds the same matrix; pull requests keep each mutant's own test (test_<op>.py::test_mutant_is_flagged,
# test_path_mutant_is_caught_by_a_timeline_check, test_op_mutant_in_a_clean_path_is_caught_by_the_timeline)
@pytest.mark.long
def test_kill_matrix_has_no_survivors_and_clean_paths_pass(registry, device, tmp_path):
    rows = killmatrix.build(registry, device, progress=None)
    survivors, broken = killmatrix.verdict(rows)
    assert not survivors, [r.subject for r in survivors]
    assert not broken, [(r.subject, r.first_failure) for r in broken]
    by = {r.subject: r for r in rows}
    sba = by["path-store-before-attention"]
    assert sba.parity == "passed" and sba.timeline == "killed", sba
    assert by["qk_norm_rope/mutant-store-left-on-in-verify"].parity == "killed"
    assert by["qk_norm_rope/mutant-store-left-on-in-verify"].timeline == "killed"
    scratch = by["verify_attention/mutant-unwritten-split-scratch"]  # only the poisoned allocator sees it for sure
    assert scratch.parity == "killed" and "finite:o@poisoned-alloc" in scratch.parity_checks.split(","), scratch
    n_mut = sum(r.kind != "clean" for r in rows)
    assert n_mut >= 15
    killmatrix.frame(rows).to_csv(tmp_path / "kill_matrix.csv", index=False)


def test_timelines_cli_quiet_still_prints_failures_summary_and_repro(tmp_path):
    """--quiet drops the progress bar, never the FAIL line, its repro, or the summary table."""
    csv = tmp_path / "tl.csv"
    res = _cli("--timeline", "qwen35-gqa/width-1", "--path-mutant", "path-store-before-attention", "--quiet",
               "--csv", str(csv))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL " in res.stdout and "repro: python -m harness timelines --device cpu --timeline 'timeline:" in res.stdout
    assert "[run]" not in res.stdout, res.stdout  # a check failed, not the run (triton 3.6's interpreter crashed)
    assert "model_family" in res.stdout and "qwen35-gqa" in res.stdout  # the summary table
    import pandas as pd

    frame = pd.read_csv(csv)
    assert set(frame["model_family"]) == {"qwen35-gqa"} and (frame["status"] == "fail").any()


def test_timelines_cli_shards_partition_the_plan_and_jobs_keep_rows(tmp_path):
    """--shard i/n slices split the named timelines of a family without overlap; --jobs 2 gives the same rows."""
    got = {}
    for spec in ("1/2", "2/2"):
        csv = tmp_path / f"s{spec[0]}.csv"
        res = _cli("--family", "dspark-noncausal", "--generated", "0", "--shard", spec, "--jobs", "2", "--quiet",
                   "--csv", str(csv))
        assert res.returncode == 0, res.stdout + res.stderr
        import pandas as pd

        got[spec] = set(pd.read_csv(csv)["timeline"])
    named = {t.name for t in tl.catalog() if t.family == "dspark-noncausal"}
    assert got["1/2"] | got["2/2"] == named and not got["1/2"] & got["2/2"]


def test_kill_matrix_e2e_column_killed_invisible_and_not_applicable(registry, device):
    """The gate column: seed 000's store-before-attention (on the reference kernels) is killed on
    the shipped qwen35-gqa model; k_scale applied to drafts is invisible there (the layout's KV is
    bf16, k_scale = 1); an mla_fp8_prepare mutant is n/a (no qwen35 path runs that op)."""
    from cases import e2e_gate

    rows = [killmatrix.KillRow(s, k, "-", "-", "-", "", "", "", "", 0.0, "") for s, k in (
        ("path-store-before-attention", "path-mutant"), ("verify_attention/mutant-k-scale-on-drafts", "mutant"),
        ("mla_fp8_prepare/mutant-descale-multiplied", "mutant"), ("verify_attention/reference", "clean"))]
    prof = dataclasses.replace(e2e_gate.PROFILES["killmatrix"], max_new=48, batch=6,
                               mutant_kernels="reference+reference")
    got = {r.subject: r for r in killmatrix.e2e_column(rows, registry, device, problems=6, progress=None,
                                                        profile=prof, layouts=("qwen35-gqa",))}
    assert got["path-store-before-attention"].e2e == "killed", got["path-store-before-attention"].e2e_detail
    assert got["verify_attention/mutant-k-scale-on-drafts"].e2e == "invisible"
    assert got["mla_fp8_prepare/mutant-descale-multiplied"].e2e == "n/a"
    assert got["verify_attention/reference"].e2e == "not run"  # clean rows are not judged here


def test_a_nan_in_attention_is_a_finite_failure_not_a_numeric_one(registry, device):
    """Planted: the clean attention with one NaN at the first output element of each call."""
    t = CATALOG["qwen35-gqa/width-1"]
    path = path_mod.clean_path(registry, t.family, attn="reference")

    def one_nan(**kw):
        o = path.attn.fn(**kw)["o"].clone()
        o.view(-1)[0] = float("nan")
        return {"o": o}

    planted = dataclasses.replace(path, attn=dataclasses.replace(path.attn, name="plant-one-nan", fn=one_nan))
    recs = _run(planted, t, device)
    bad = {s.record.check for s in path_mod.failures(recs)}
    assert "finite:attn:o" in bad and "attn:o" not in bad, _explain(path_mod.failures(recs))
    first = next(s.record for s in recs if s.record.check == "finite:attn:o" and s.mode != "extend")
    assert not first.passed and first.worst.startswith("(0, 0, 0): nan/"), first
