"""The strategies themselves: edge cases reachable, shrinking to minimal, ids round-trip,
drawing deterministic."""
from __future__ import annotations

import dataclasses

from hypothesis import find, given, settings

from cases import base
from cases.qk_norm_rope import catalog as qc


def _find(pred):
    return find(qc.cases(), pred, settings=settings(max_examples=5000, database=None))


def test_edge_cases_reachable():
    assert _find(lambda c: c.T == 1 and c.H == 1).T == 1
    assert _find(lambda c: c.pos == "near_end" and c.max_pos <= c.T).pos == "near_end"
    assert _find(lambda c: c.scale == 1e-3 and c.mode == "target_verify").scale == 1e-3
    assert _find(lambda c: c.mode == "decode" and c.padding > 0).padding > 0
    assert _find(lambda c: c.D == 512 and c.R == 64 and c.rope_style == "neox").D == 512
    assert _find(lambda c: c.kv_layout == "strided" and c.q_out == "provided").q_out == "provided"


def test_shrinks_to_minimal():
    c = _find(lambda c: c.T >= 5)
    assert c.T == 5 and c.H == 1 and c.D == 64 and c.R == 16 and c.seed == 0
    c = _find(lambda c: c.H * c.T >= 12)
    assert c.H * c.T == 12


def test_keyword_only_bounds_are_respected():
    @settings(max_examples=50, database=None)
    @given(qc.cases(max_tokens=3, max_heads=2, head_dims=(128,), rope_dims=(32,)))
    def check(c):
        assert c.T <= 3 and c.H <= 2 and c.D == 128 and c.R == 32

    check()


@given(qc.cases())
def test_case_id_round_trips(c):
    cid = base.case_id("qk_norm_rope", c)
    assert base.parse_case(qc.QkNormRopeCase, cid.split(":", 1)[1]) == dataclasses.replace(c, name="")


def test_draw_is_deterministic_and_distinct():
    a = base.draw(qc.cases(), 40, rng_seed=3)
    b = base.draw(qc.cases(), 40, rng_seed=3)
    assert a == b and len(set(a)) == 40
    assert base.draw(qc.cases(), 40, rng_seed=4) != a


def test_catalog_names_unique_and_real_shapes_present():
    cat = qc.catalog(big=True)
    assert len({c.name for c in cat}) == len(cat)
    heads = {c.H for c in cat if c.name.startswith("dsv4-verify")}
    assert {8, 16, 32, 64, 128} <= heads
    assert all(c.D % c.R == 0 for c in cat)
