"""The GSM8K-style generator and its shipped splits."""
from __future__ import annotations

import random
import re

import pytest

from cases import gsm8k_synth as g

ANNOT = re.compile(r"<<([0-9]+)([-+*/])([0-9]+)=([0-9]+)>>([0-9]+)")


def _check_problem(row):
    steps = ANNOT.findall(row["answer"])
    assert 2 <= len(steps) <= 4, row
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    for a, op, b, r, shown in steps:
        a, b, r = int(a), int(b), int(r)
        want = (a // b if a % b == 0 else None) if op == "/" else ops[op](a, b)
        assert want == r and shown == str(r), (row["answer"], a, op, b, r)
        assert all(0 <= v <= g.MAX_VALUE for v in (a, b, r))
    assert g.final_answer(row["answer"]) == steps[-1][3]
    assert all(len(n) <= 4 for n in re.findall(r"[0-9]+", row["question"]))


def test_every_template_reachable_and_well_formed():
    assert len(g.TEMPLATES) >= 20
    assert len({t.question.split()[0:3].__str__() for t in g.TEMPLATES}) >= 15  # varied wording
    rng = random.Random(0)
    for k in range(len(g.TEMPLATES)):
        for _ in range(20):
            row = g.make_problem(rng, k)
            assert row["template"] == k
            _check_problem(row)
    ops = {op for t in g.TEMPLATES for _, _, op, _, _ in t.steps}
    assert ops == {"+", "-", "*", "/"}


def test_shipped_splits_load_offline_and_regenerate(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    total = sum(g.path(s).stat().st_size for s in g.SPLITS)
    assert total < 2 * 1024 * 1024
    fresh = g.write_splits(tmp_path)
    for s in g.SPLITS:
        assert fresh[s].read_bytes() == g.path(s).read_bytes(), f"{s}: shipped split differs from the generator"
    train, test = g.load("train"), g.load("test", limit=50)
    assert len(train) == g.SPLITS["train"] and len(test) == 50
    assert not {r["question"] for r in train} & {r["question"] for r in g.load("test")}
    for row in test:
        _check_problem(row)
    assert {r["template"] for r in train} == set(range(len(g.TEMPLATES)))


def test_final_answer_gsm8k_format():
    assert g.final_answer("x\n#### 1,234") == "1234"
    assert g.final_answer("no answer") is None
    with pytest.raises(ValueError):
        g.load("test", source="hub")
