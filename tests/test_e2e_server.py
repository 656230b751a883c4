"""Server A/B mode for real: ``python -m harness serve`` processes on loopback, the client over HTTP."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pytest

from harness.e2e import client
from tests.helpers import ROOT, harness_cli, subprocess_env

PROV = dict(git_sha="t", device="cpu", arch="interpreter", fp8_format="e4m3fn", torch="", triton="", shim="",
            profile="test", seed=0)


def _serve(tmp_path, *extra):
    cmd = [sys.executable, "-m", "harness", "serve", "--device", "cpu", "--layout", "qwen35-gqa", "--models",
           str(tmp_path), "--port", "0", *extra]
    env = subprocess_env(HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()  # "serving 127.0.0.1:PORT" once the socket is bound
    m = re.match(r"serving (127\.0\.0\.1):(\d+)", line)
    if not m:
        proc.kill()
        raise AssertionError(f"server did not start: {line}{proc.stdout.read()[-2000:]}")
    return proc, f"http://{m.group(1)}:{m.group(2)}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")  # empty: random-weight models
    procs = [_serve(d), _serve(d, "--speculative"), _serve(d, "--speculative", "--path-mutant",
                                                          "path-store-before-attention")]
    yield [u for _, u in procs]
    for p, _ in procs:
        p.terminate()
        p.wait(timeout=30)


CFG = client.ClientConfig(num_fewshot=1, max_tokens=24, concurrency=3, retries=1, timeout_s=60)


def test_openai_routes(servers):
    url = servers[0]
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        assert json.loads(r.read())["data"][0]["id"].startswith("qwen35-gqa")
    req = urllib.request.Request(url + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"prompt": ["Q: 1+1?\nA: ", "Q: 2+2?\nA: "], "max_tokens": 5}).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())
    assert out["object"] == "text_completion" and len(out["choices"]) == 2
    bad = urllib.request.Request(url + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"prompt": "x", "max_tokens": 10_000}).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=30)
    assert e.value.code == 400


def test_ab_speculative_vs_plain_is_identical_and_passes(servers):
    rows = client.ab(servers[0], servers[1], problems=6, cfg=CFG, prov=PROV)
    assert {r.extraction for r in rows} == {"strict", "flexible"} and len(rows) == 4
    assert all(r.exact_agreement == 1.0 and r.p_value == 1.0 and r.verdict == "pass" for r in rows)


def test_ab_sees_the_store_before_attention_server(servers):
    rows = client.ab(servers[0], servers[2], problems=6, cfg=CFG, prov=PROV)
    assert rows[0].exact_agreement < 1.0  # random weights: accuracy is 0 on both, the texts differ


def test_client_retries_are_bounded():
    cfg = client.ClientConfig(retries=2, timeout_s=2, backoff_s=0.01)
    with pytest.raises(RuntimeError, match="3 attempts"):
        client.complete("http://127.0.0.1:9", "x", cfg)  # discard port: nothing listens


def test_gate_cli_ab_mode(servers, tmp_path):
    out = tmp_path / "ab.csv"
    env = subprocess_env(HF_HUB_OFFLINE="1")
    res = harness_cli(["gate", "--device", "cpu", "--ab", servers[0], servers[1], "--problems", "3", "--fewshot", "1",
                       "--csv", out], env=env, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    import pandas as pd

    from reports.rows import GateRow, columns

    frame = pd.read_csv(out)
    assert list(frame.columns) == columns(GateRow) and len(frame) == 4 and (frame["verdict"] == "pass").all()
