"""The training script runs on the CPU for a few steps: files, metadata, and a loss that falls."""
from __future__ import annotations

import json
import subprocess
import sys

from cases import gsm8k_synth as g
import torch

from harness.e2e import model as M
from harness.e2e import tokenizer as tok
from harness.e2e import train
from tests.helpers import ROOT, subprocess_env


def test_train_cli_writes_model_and_metadata(tmp_path):
    out = tmp_path / "m" / "qwen.safetensors"
    cmd = [sys.executable, "-m", "harness.e2e.train", "--layout", "qwen35-gqa", "--out", str(out), "--steps", "30",
           "--batch", "4", "--d-model", "64", "--layers", "1", "--d-ff", "128", "--lr", "3e-3", "--limit", "64",
           "--log-every", "10", "--device", "cpu", "--eval-every", "0", "--eval-n", "8", "--workers", "1"]
    env = subprocess_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["data_hash"] == g.data_hash("train") and side["steps_run"] == 30
    assert side["data"].startswith("stream") and side["args"]["lr"] == 3e-3
    (step, _, n, acc), = side["evals"]  # one final greedy evaluation on the 8 requested problems
    assert step == 30 and n == 8 and 0.0 <= acc <= 1.0
    assert side["config"]["layout"] == "qwen35-gqa" and side["config"]["d_model"] == 64
    curve = [loss for _, loss in side["loss_curve"]]
    assert curve[0] > 3.0 and curve[-1] < curve[0] - 1.0, curve  # from ~ln(vocab) down: it learns something
    m = M.load(out)
    assert m.cfg.layers == 1 and sum(p.numel() for p in m.parameters()) > 0


class _Scripted(torch.nn.Module):
    """Emits, for row b at position i, the next token of ``targets[b]``: a model whose greedy
    output is known, to test the right-padded batched decoding (rows of different prompt lengths)."""

    def __init__(self, targets):
        super().__init__()
        self.targets = targets

    def forward(self, ids):
        B, N = ids.shape
        out = torch.zeros(B, N, tok.VOCAB)
        for b, t in enumerate(self.targets):
            for i in range(N):
                out[b, i, t[i + 1] if i + 1 < len(t) else tok.PAD] = 1.0
        return out


def test_greedy_accuracy_decodes_each_row_to_its_own_end():
    rows = list(g.load("test", limit=5))
    assert len({len(r["question"]) for r in rows}) > 1  # different prompt lengths share the batch
    targets = [tok.encode(tok.prompt(r["question"])) + tok.encode(r["answer"], bos=False) + [tok.EOS] for r in rows]
    assert train.greedy_accuracy(_Scripted(targets), rows, torch.device("cpu"), max_new=300) == 1.0
    wrong = list(targets)
    wrong[2] = targets[2][:-3] + tok.encode("7", bos=False) + targets[2][-2:]  # last digit of row 2's answer changed
    assert train.greedy_accuracy(_Scripted(wrong), rows, torch.device("cpu"), max_new=300) == 0.8


def test_stream_never_yields_a_test_question():
    test_prompts = {tuple(tok.encode(tok.prompt(r["question"]))) for r in g.load("test")}
    it = train.stream(seed=g.SPLIT_SEED["test"])  # the very draws the test split was made of
    for _ in range(300):
        ids, start = next(it)
        assert tuple(ids[:start]) not in test_prompts
