"""The gate on the micro-engine (smoke profile: random weights, a few problems) and the answer
extraction it shares with the server client."""
from __future__ import annotations

import pytest

from cases import e2e_gate as cfg
from harness.e2e import answers, gate, stats
from reports.rows import GateRow, columns


def test_answer_extraction_lm_eval_compatible():
    text = "He has 3*4 = <<3*4=12>>12 apples.\n12+1 = <<12+1=13>>13\n#### 13"
    assert answers.strict(text) == "13" and answers.flexible(text) == "13"
    assert answers.strict("The answer is 1,234.") == answers.INVALID
    assert answers.flexible("The answer is $1,234.") == "$1,234."
    assert answers.correct(answers.flexible("The answer is $1,234."), "blah\n#### 1234")
    assert not answers.correct(answers.INVALID, "#### 0")
    assert not answers.correct("12", "#### 13")


def test_verdict_thresholds():
    th = cfg.Thresholds()
    good = dict(acc=stats.accuracy([True] * 96 + [False] * 4), agreement=1.0, accept=2.5,
                mc=stats.McNemar(1, 1, 1.0))
    assert gate.verdict(th, trained=True, **good)[0] == "pass"
    assert gate.verdict(th, trained=True, **{**good, "agreement": 0.98})[0] == "fail"
    assert gate.verdict(th, trained=True, **{**good, "accept": 1.5})[0] == "fail"
    assert gate.verdict(th, trained=False, **{**good, "accept": 1.5})[0] == "pass"
    assert gate.verdict(th, trained=True, **{**good, "mc": stats.McNemar(40, 0, 1e-12)})[0] == "fail"
    assert gate.verdict(th, trained=True, **{**good, "mc": stats.McNemar(0, 40, 1e-12)})[0] == "pass"  # better


def test_gate_smoke_reference_passes_mutant_fails(registry, device, tmp_path):
    prof = cfg.PROFILES["smoke"]
    rows = gate.run(registry, device, prof, layouts=("qwen35-gqa",), models_dir=tmp_path)
    by = {r.path: r for r in rows}
    assert set(by) == {"reference+reference", "path-store-before-attention"}
    ref, mut = by["reference+reference"], by["path-store-before-attention"]
    assert ref.verdict == "pass" and ref.exact_agreement == 1.0 and ref.p_value == 1.0
    assert ref.model == "random-init" and ref.problems == prof.problems
    assert mut.verdict == "fail" and mut.exact_agreement < cfg.Thresholds().min_agreement
    assert all(isinstance(r, GateRow) and r.git_sha and r.profile == "smoke" for r in rows)
    assert columns(GateRow)[:2] == ["layout", "path"]
