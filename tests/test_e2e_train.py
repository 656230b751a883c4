"""The training script runs on the CPU for a few steps: files, metadata, and a loss that falls."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cases import gsm8k_synth as g
from harness.e2e import model as M

ROOT = Path(__file__).resolve().parents[1]


def test_train_cli_writes_model_and_metadata(tmp_path):
    out = tmp_path / "m" / "qwen.safetensors"
    cmd = [sys.executable, "-m", "harness.e2e.train", "--layout", "qwen35-gqa", "--out", str(out), "--steps", "30",
           "--batch", "4", "--d-model", "64", "--layers", "1", "--d-ff", "128", "--lr", "3e-3", "--limit", "64",
           "--log-every", "10", "--device", "cpu"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["data_hash"] == g.data_hash("train") and side["steps_run"] == 30
    assert side["config"]["layout"] == "qwen35-gqa" and side["config"]["d_model"] == 64
    curve = [loss for _, loss in side["loss_curve"]]
    assert curve[0] > 3.0 and curve[-1] < curve[0] - 1.0, curve  # from ~ln(vocab) down: it learns something
    m = M.load(out)
    assert m.cfg.layers == 1 and sum(p.numel() for p in m.parameters()) > 0
