"""The generated cases reach every region of each op's case space often enough (cases/reach.py),
a planted bug shrinks to a small case that names it, and a seed draws one case list whatever was
imported first. The strategies tested the way Hypothesis tests its own."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, Phase, find, settings

from cases import base, reach
from cases.mla_fp8_prepare import catalog as mc
from cases.qk_norm_rope import catalog as qc
from cases.verify_attention import catalog as vc
from cases.profiles import PROFILES
from tests.helpers import ROOT, subprocess_env

CI = PROFILES["ci"].generated


@pytest.mark.long
@pytest.mark.parametrize("op,region", [(op, r) for op, (_, _, regions) in reach.OPS.items() for r in regions])
def test_region_holds_a_fifth_of_the_ci_cases(op, region):
    got = reach.hits(op, CI)[region]
    assert got / CI >= reach.MIN_FRACTION, f"{op}: {region!r} in {got} of the ci profile's {CI} generated cases"


@pytest.mark.parametrize("op", [op for op in reach.OPS if len(reach.counts(op, "ci")) > 1])
def test_interpreter_cases_reach_every_region(op):
    """Under the interpreter an op may draw fewer cases (OpSpec.interpreter_generated): every region
    still has one of them."""
    n = reach.counts(op, "ci")[1]
    missed = [r for r, k in reach.hits(op, n).items() if k == 0]
    assert not missed, f"{op}: none of the interpreter's {n} cases in {missed}"


def test_tile_sizes_are_the_kernels():
    """The strategies aim at the compiled kernels' tile edges: the sizes they assume are the kernels'."""
    from fused.mla_fp8_prepare import wrapper as fm
    from fused.qk_norm_rope import wrapper as fq
    from fused.verify_attention import config as fv_config

    for d in (16, 64, 100, 128, 256, 512, 1024):
        assert qc.compiled_block_t(d) == fq.block_config(d, interpreted=False)[0], d
    assert vc.COMPILED_BLOCK_N == {d: cfg[1] for d, cfg in fv_config.BLOCK_CONFIG["sm90"].items()}
    assert mc.mla_tile_edge(4) and mc.mla_tile_edge(5) and not mc.mla_tile_edge(6)
    assert fm.block_config(False)[0] == 4  # the tile mc.mla_tile_edge assumes


def test_positions_spread_when_rope_should_rotate():
    """The measured failure: RoPE was the identity (every position 0, or a one-row table) in 27 of
    the 30 cases the dev profile drew."""
    dev = PROFILES["dev"].generated
    rotating = reach.hits("qk_norm_rope", dev)["rope rotates (some position > 0)"]
    assert rotating >= dev * 3 // 4, f"RoPE rotates in {rotating} of the dev profile's {dev} cases"


# ----------------------------------------------------------------------------- shrinking

def _shrunk(strategy, pred):
    return find(strategy, pred, settings=settings(max_examples=300, database=None, deadline=None,
                                                  phases=[Phase.generate, Phase.shrink],
                                                  suppress_health_check=list(HealthCheck)))


def _fails(registry, device, op, impl, check):
    spec, mutant = registry.ops[op], registry.impls[f"{op}/{impl}"]

    def pred(case):
        from harness.parity import runners

        res = runners.run_case(spec, mutant, case, device, determinism=False, poisoned=False, poisoned_alloc=False)
        return any(r.check == check and not r.passed for r in res.records)

    return pred


def _named(op, case):
    """The shrunk case is one whose id rebuilds it (``python -m harness repro <id>``)."""
    cid = base.case_id(op, case)
    assert base.parse_case(type(case), cid.split(":", 1)[1]) == case, cid
    return cid


def test_rope_style_bug_shrinks_to_one_token_one_head(registry, device):
    """Planted: q rotated with the other rope style. Shrinks to one token, one head, the smallest
    head and rope dims, a two-row table: the smallest case where RoPE rotates at all."""
    c = _shrunk(qc.cases(max_tokens=8, max_heads=4),
                _fails(registry, device, "qk_norm_rope", "mutant-rope-style-swapped-q", "numeric:q_out"))
    cid = _named("qk_norm_rope", c)
    assert (c.T, c.H, c.D, c.R, c.max_pos, c.q_weight, c.scale) == (1, 1, 64, 16, 2, False, 1.0), cid
    assert c.pos != "zero", cid


def test_eps_bug_shrinks_to_the_tiny_rows_it_needs(registry, device):
    """Planted: eps added outside the square root; visible only when mean(x²) ~ eps, so the shrunk
    case keeps scale 1e-3 and drops everything else."""
    c = _shrunk(qc.cases(max_tokens=8, max_heads=4),
                _fails(registry, device, "qk_norm_rope", "mutant-eps-outside-sqrt", "numeric:q_out"))
    cid = _named("qk_norm_rope", c)
    assert (c.T, c.H, c.D, c.scale) == (1, 1, 64, 1e-3), cid


def test_descale_bug_shrinks_to_one_token_with_a_non_unit_descale(registry, device):
    """Planted: k multiplied by kv_descale instead of by its inverse. Shrinks to one token, one
    head, a kernel-path case with a descale that is not 1."""
    c = _shrunk(mc.cases(max_tokens=4, max_heads=2, head_dims=((17, 5), (64, 16))),
                _fails(registry, device, "mla_fp8_prepare", "mutant-descale-multiplied", "effect:kv_buffer"))
    cid = _named("mla_fp8_prepare", c)
    assert (c.T, c.H, c.padding) == (1, 1, 0) and c.kv_descale not in (0.0, 1.0), cid
    assert mc.expected_path(c) == "kernel", cid


# ----------------------------------------------------------------------------- import order

_DRAW = """
import hashlib, json, sys
for m in sys.argv[1:]:
    __import__(m)
from cases import profiles
from harness.parity import suite
from harness.ops import default_registry
reg, prof = default_registry(with_plugins=False), profiles.current("ci")
print(json.dumps({op: hashlib.sha256("\\n".join(p.full_id for p in suite.plan_cases(reg.ops[op], prof)).encode())
                  .hexdigest() for op in sorted(reg.ops)}))
"""


def _ids_after(*imports: tuple[str, ...]) -> list[dict]:
    """Per process (run side by side): op -> sha256 of its planned case ids, after importing ``imports[i]``."""
    procs = [subprocess.Popen([sys.executable, "-c", _DRAW, *mods], cwd=ROOT, env=subprocess_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for mods in imports]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


@pytest.mark.long
def test_a_seed_draws_one_case_list_whatever_was_imported_first():
    """Two fresh processes draw the ci profile's cases, one after importing the CLI, the kernels and
    every case module, one after nothing else: the ids are the same (hypothesis's engine took
    constants from the source of the local modules loaded, so they were not)."""
    bare, loaded = _ids_after((), ("harness.cli.main", "fused.verify_attention.wrapper", "cases.timelines", "cases.gsm8k_synth",
                                   "harness.fuzz.strategies", "cases.reach"))
    assert bare == loaded
    from harness.ops import BUILTIN

    assert set(bare) == set(BUILTIN)  # every op's plan was drawn


def test_draw_is_seeded_and_distinct():
    a = base.draw(vc.cases(), 60, rng_seed=5)
    assert a == base.draw(vc.cases(), 60, rng_seed=5) and len(set(a)) == 60
    assert a != base.draw(vc.cases(), 60, rng_seed=6)
