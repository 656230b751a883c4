"""Micro-models and the speculative engine: with random weights, speculative
output equals plain greedy output token for token on the reference path and on the fused path,
drafters control acceptance, and path mutants change the output."""
from __future__ import annotations

import functools
import json
import os

import pytest
import torch

from cases import gsm8k_synth as g
from cases.e2e_gate import LAYOUTS
from harness import devices
from harness.timelines import path as path_mod
from harness.e2e import drafters as D
from harness.e2e import engine as E
from harness.e2e import model as M
from harness.e2e import tokenizer as tok
from harness.ops import default_registry

L = 4


DEVICE = devices.select(os.environ.get("VP_DEVICE", "auto"))  # the session's, as conftest chose it


def _mutant(name):
    from cases.mutants import timelines as mt

    return next(m for m in mt.PATH_MUTANTS if m.name == name)


@functools.cache
def _reg():
    return default_registry(with_plugins=False)


@functools.cache
def _prompts(n: int):
    return tuple(tuple(tok.encode(tok.prompt(r["question"]))) for r in g.load("test", limit=n))


@functools.cache
def _model(layout):
    return M.Micro(M.MicroConfig(layout=layout, seed=0)).to(DEVICE.torch_device)


def _engine(layout, prepare="reference", attn="reference", **change):
    """On the session's device: the fused paths launch Triton kernels there (compiled on a GPU
    runner, which a CPU engine would hand CPU tensors)."""
    return E.Engine(_model(layout), path_mod.clean_path(_reg(), layout, prepare=prepare, attn=attn, **change), L=L,
                    device=DEVICE.torch_device)


@functools.cache
def _greedy(layout, n=3, max_new=24):
    return _engine(layout).generate([list(p) for p in _prompts(n)], max_new)


def test_tokenizer_round_trip():
    text = tok.prompt(g.load("train", limit=1)[0]["question"])
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode("a\u00e9b")) == "a?b"  # outside the alphabet: UNK
    assert max(tok.encode(text)) < tok.VOCAB


@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_forward_matches_inference_path(layout):
    """The fp32 dense training forward and the engine's prefill (ops through the registry, bf16
    between launches, fp8 KV for K3) compute the same function up to bf16/fp8 rounding."""
    ids = list(_prompts(1)[0])
    got = _engine(layout).prefill([ids]).float()
    want = _model(layout)(torch.tensor([ids], device=DEVICE.torch_device))[0].detach()
    assert (got - want).abs().max().item() < 0.2 * want.std().item()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.95


@pytest.mark.parametrize("layout", LAYOUTS)
def test_speculative_equals_greedy_on_reference_path(layout):
    base = _greedy(layout)
    prompts = [list(p) for p in _prompts(3)]
    for drafter in (D.PromptLookup(), D.NoisyOracle(base.tokens, 0.5, seed=1), D.NoisyOracle(base.tokens, 0.0)):
        spec = _engine(layout).generate(prompts, 24, drafter=drafter)
        assert spec.tokens == base.tokens, type(drafter).__name__
        assert all(1 <= a <= L + 1 for r in spec.accept_lens for a in r)
        produced = sum(len(t) for t in spec.tokens) - len(prompts)  # the first token comes from prefill
        assert sum(map(sum, spec.accept_lens)) >= produced


def test_noisy_drafter_controls_acceptance():
    base = _greedy("qwen35-gqa")
    prompts = [list(p) for p in _prompts(3)]
    perfect = _engine("qwen35-gqa").generate(prompts, 24, drafter=D.NoisyOracle(base.tokens, 0.0))
    wrong = _engine("qwen35-gqa").generate(prompts, 24, drafter=D.NoisyOracle(base.tokens, 1.0))
    assert all(a == 1 for r in wrong.accept_lens for a in r)
    assert all(a == L + 1 for r in perfect.accept_lens for a in r[:-1])  # the last step may run past EOS
    assert perfect.steps < wrong.steps and wrong.tokens == perfect.tokens == base.tokens


@pytest.mark.parametrize("layout", LAYOUTS)
def test_store_before_attention_changes_output(layout):
    """Seed 000's path mutant (chunk stored, then attended 1-source as history) with clean kernels."""
    base = _greedy(layout)
    spec = _engine(layout, backend=_mutant("path-store-before-attention")).generate([list(p) for p in _prompts(3)], 24,
                                                               drafter=D.NoisyOracle(base.tokens, 0.0))
    assert spec.tokens != base.tokens


def test_stale_rejected_kv_changes_output():
    base = _greedy("dsv4-mqa-ring")
    eng = _engine("dsv4-mqa-ring", backend=_mutant("path-stale-rejected-kv"))
    spec = eng.generate([list(p) for p in _prompts(3)], 24, drafter=D.NoisyOracle(base.tokens, 0.6, seed=2))
    assert spec.tokens != base.tokens


@pytest.mark.parametrize("layout", ["dsv4-mqa-ring", "k3-mla-fp8"])
def test_fused_path_agrees_with_reference_greedy(layout):
    """Fused prepare + fused attention (interpreted on CPU, compiled on a GPU), speculative, vs
    reference greedy."""
    prompts = [list(_prompts(1)[0])]
    base = _engine(layout).generate(prompts, 8)
    spec = _engine(layout, prepare="fused", attn="fused").generate(prompts, 8, drafter=D.PromptLookup())
    assert spec.tokens == base.tokens


def test_engine_refuses_bad_input():
    with pytest.raises(ValueError, match="window"):
        _engine("qwen35-gqa").generate([[1] * 500], 40)
    with pytest.raises(ValueError, match="is for"):
        E.Engine(_model("qwen35-gqa"), path_mod.clean_path(_reg(), "dsv4-mqa-ring"))


def test_save_load_round_trip(tmp_path):
    m = _model("k3-mla-fp8")
    p = tmp_path / "k3.safetensors"
    M.save(m, p, extra={"data_hash": "x"})
    side = json.loads(p.with_suffix(".json").read_text())
    assert side["config"]["layout"] == "k3-mla-fp8" and side["data_hash"] == "x"
    back = M.load(p)
    assert back.cfg == m.cfg
    for k, v in m.params.items():
        assert torch.equal(back.params[k].data, v.data.cpu().to(torch.bfloat16).float()), k
    assert p.stat().st_size <= 8 * 1024 * 1024
