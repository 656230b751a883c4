"""Server A/B gate: the same held-out problems against two OpenAI-compatible endpoints (e.g. a
serving engine with the fused switch on and off), lm-eval-style few-shot prompts from the train
split, strict and flexible answer extraction (``harness.e2e.answers``), bounded concurrency and
retries; one ``GateRow`` per endpoint and extraction, B judged against A by exact McNemar.

Server mode has no acceptance length (-1) and its ``exact_agreement`` is the fraction of problems
whose completion text is identical on both endpoints: reported, not gated (two builds may round
differently); the verdict is the paired test plus the accuracy floor when one is given.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cases import gsm8k_synth as g
from harness.e2e import answers, stats
from reports.rows import GateRow


@dataclass(frozen=True)
class ClientConfig:
    num_fewshot: int = 2
    max_tokens: int = 160
    concurrency: int = 4
    retries: int = 3  # extra attempts per request (connection errors, 5xx, timeouts)
    timeout_s: float = 120.0
    backoff_s: float = 0.2
    alpha: float = 1e-3
    min_accuracy: float | None = None
    stop: tuple[str, ...] = ("Question:", "\n\n")


def fewshot_prompt(question: str, shots) -> str:
    """lm-eval gsm8k's format: ``Question: ...\\nAnswer: ...`` blocks, blank-line separated."""
    ctx = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)
    return ctx + f"Question: {question}\nAnswer:"


def complete(url: str, prompt: str, cfg: ClientConfig) -> str:
    body = json.dumps({"model": "any", "prompt": prompt, "max_tokens": cfg.max_tokens, "temperature": 0.0,
                       "stop": list(cfg.stop)}).encode()
    last = None
    for attempt in range(cfg.retries + 1):
        try:
            req = urllib.request.Request(url.rstrip("/") + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:
                return json.loads(resp.read())["choices"][0]["text"]
        except urllib.error.HTTPError as exc:
            if exc.code < 500:  # the request is wrong: retrying will not help
                raise RuntimeError(f"{url}: HTTP {exc.code}: {exc.read()[:300]!r}") from exc
            last = exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            last = exc
        time.sleep(cfg.backoff_s * (2 ** attempt))
    raise RuntimeError(f"{url}: no answer after {cfg.retries + 1} attempts: {last}")


def run_endpoint(url: str, prompts: list[str], cfg: ClientConfig) -> list[str]:
    with ThreadPoolExecutor(max_workers=cfg.concurrency) as pool:
        return list(pool.map(lambda p: complete(url, p, cfg), prompts))


def ab(url_a: str, url_b: str, *, problems: int, cfg: ClientConfig = ClientConfig(), source: str = "synth",
       labels: tuple[str, str] = ("A", "B"), prov: dict) -> list[GateRow]:
    test = g.load("test", source=source, limit=problems)
    shots = list(g.load("train", source=source, limit=cfg.num_fewshot)) if cfg.num_fewshot else []
    prompts = [fewshot_prompt(r["question"], shots) for r in test]
    golds = [r["answer"] for r in test]
    t0 = time.time()
    texts = {labels[0]: run_endpoint(url_a, prompts, cfg), labels[1]: run_endpoint(url_b, prompts, cfg)}
    secs = round(time.time() - t0, 2)
    same = sum(a == b for a, b in zip(*texts.values())) / len(prompts)
    rows = []
    for extraction, fn in (("strict", answers.strict), ("flexible", answers.flexible)):
        ok = {k: [answers.correct(fn(t), gold) for t, gold in zip(v, golds)] for k, v in texts.items()}
        ref = ok[labels[0]]
        for label, url in zip(labels, (url_a, url_b)):
            acc, mc = stats.accuracy(ok[label]), stats.mcnemar(ref, ok[label])
            why = []
            if mc.p_value < cfg.alpha and mc.worse > mc.better:
                why.append(f"McNemar p={mc.p_value:.2g} < {cfg.alpha} ({mc.worse} worse, {mc.better} better)")
            if cfg.min_accuracy is not None and acc.value < cfg.min_accuracy:
                why.append(f"accuracy {acc.value:.3f} < {cfg.min_accuracy}")
            rows.append(GateRow(layout=source, path=f"{label}={url}", expect="pass", model="server",
                                drafter="server", extraction=extraction, problems=len(prompts), accuracy=acc.value,
                                accuracy_lo=acc.lo, accuracy_hi=acc.hi, ref_accuracy=sum(ref) / len(ref),
                                exact_agreement=same, tie_divergences=-1, mean_accept_len=-1.0, worse=mc.worse, better=mc.better,
                                p_value=mc.p_value, temperature=0.0, dist_tokens=0, dist_log10_p=0.0,
                                verdict="fail" if why else "pass",
                                detail="; ".join(why) or f"{cfg.num_fewshot}-shot", seconds=secs, **prov))
    return rows
