"""Train one micro-model on the shipped GSM8K-style train split.

    python -m harness.e2e.train --layout dsv4-mqa-ring --out cases/models/dsv4-mqa-ring.safetensors

Meant for the GPU (defaults: about 10 minutes on one H200 per layout, stopped early by
``--max-minutes``); on the CPU a few steps run for the tests. Next to the safetensors file a
``.json`` holds the model config, the sha256 of the training data, this run's arguments, the
loss curve (every ``--log-every`` steps), the wall time, device and git sha.

Loss: next-token cross-entropy on the solution and EOS only (the question is context).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch
import torch.nn.functional as F

from cases import gsm8k_synth as g
from harness.e2e import model as M
from harness.e2e import tokenizer as tok


def examples(limit: int | None = None) -> list[tuple[list[int], int]]:
    """(ids, answer start) per training problem: ``prompt + answer + EOS``."""
    out = []
    for row in g.load("train", limit=limit):
        p = tok.encode(tok.prompt(row["question"]))
        out.append((p + tok.encode(row["answer"], bos=False) + [tok.EOS], len(p)))
    return out


def batch(items, device):
    N = max(len(ids) for ids, _ in items)
    x = torch.full((len(items), N), tok.PAD, dtype=torch.long)
    y = torch.full((len(items), N), -100, dtype=torch.long)
    for b, (ids, start) in enumerate(items):
        t = torch.tensor(ids)
        x[b, : len(ids)] = t
        y[b, start - 1: len(ids) - 1] = t[start:]  # predict the answer tokens and EOS
    return x.to(device), y.to(device)


def train(args) -> dict:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(args.seed)
    cfg = M.MicroConfig(layout=args.layout, d_model=args.d_model, layers=args.layers, d_ff=args.d_ff,
                        max_len=args.max_len, seed=args.seed)
    model = M.Micro(cfg).to(device).train()
    data = [e for e in examples(args.limit) if len(e[0]) <= cfg.max_len - 8]
    rng = random.Random(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    t0, curve, step = time.time(), [], 0
    for step in range(1, args.steps + 1):
        x, y = batch(rng.sample(data, min(args.batch, len(data))), device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), y.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            curve.append((step, round(loss.item(), 5)))
            print(f"step {step} loss {loss.item():.4f} {time.time() - t0:.0f}s", flush=True)
        if time.time() - t0 > args.max_minutes * 60:
            print(f"stopping at step {step}: --max-minutes {args.max_minutes}", flush=True)
            break
    from reports.rows import git_sha

    meta = {"data": str(g.path("train").name), "data_hash": g.data_hash("train"), "args": vars(args),
            "steps_run": step, "loss_curve": curve, "wall_s": round(time.time() - t0, 1), "device": str(device),
            "git_sha": git_sha()}
    M.save(model, args.out, extra=meta)
    print(f"saved {args.out} ({step} steps, loss {curve[-1][1]})")
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.e2e.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", required=True, choices=M.LAYOUTS)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=768)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--limit", type=int, default=None, help="use only the first N training problems")
    ap.add_argument("--max-minutes", type=float, default=10.0)
    ap.add_argument("--log-every", type=int, default=200)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    train(ap.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
