"""Train one micro-model on the shipped GSM8K-style train split.

    python -m harness.e2e.train --layout dsv4-mqa-ring --out cases/models/dsv4-mqa-ring.safetensors

Meant for the GPU (defaults: about 10 minutes on one H200 per layout, stopped early by
``--max-minutes``); on the CPU a few steps run for the tests. Next to the safetensors file a
``.json`` holds the model config, the sha256 of the training data, this run's arguments, the
loss curve (every ``--log-every`` steps), the wall time, device and git sha.

Data: ``--data split`` samples the shipped train split (4,000 problems, fixed); ``--data stream``
(the default) draws fresh problems from the same seeded generator (``cases.gsm8k_synth``, seed
``--seed + 1000``) and drops any whose question is in the test split, so the held-out problems stay
held out. The sidecar records which, with the hash of the shipped train split either way.

Schedule: linear warm-up, then cosine decay over the run's progress, where progress is
``max(step / --steps, elapsed / --max-minutes)``: a run stopped by its time budget still ends at
a decayed learning rate. Every ``--eval-every`` minutes (and at the end) it decodes test-split
problems greedily with the training forward (batched, no KV cache) and logs exact-match accuracy
of the final answer; the end-of-run figure on ``--eval-n`` problems goes into the sidecar. The
gate (``python -m harness gate``) measures the shipped model through the engine; this is the
training-time estimate.

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

from cases import e2e_gate
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


def stream(seed: int):
    """Fresh training problems forever: the seeded generator, test-split questions excluded."""
    held_out = {r["question"] for r in g.load("test")}
    rng = random.Random(seed)
    while True:
        row = g.make_problem(rng)
        if row["question"] in held_out:
            continue
        p = tok.encode(tok.prompt(row["question"]))
        yield p + tok.encode(row["answer"], bos=False) + [tok.EOS], len(p)


@torch.no_grad()
def greedy_accuracy(model, rows, device, max_new: int = 200, batch_size: int = 256) -> float:
    """Exact-match accuracy of the final answer under greedy decoding with the training forward.
    Right-padded batch, whole-sequence recompute per token: with causal attention a row never
    sees the padding after its own end."""
    was_training = model.training
    model.eval()
    correct = 0
    for s in range(0, len(rows), batch_size):
        chunk = rows[s: s + batch_size]
        prompts = [tok.encode(tok.prompt(r["question"])) for r in chunk]
        n = torch.tensor([len(p) for p in prompts], device=device)
        N = int(n.max()) + max_new
        x = torch.full((len(chunk), N), tok.PAD, dtype=torch.long, device=device)
        for b, p in enumerate(prompts):
            x[b, : len(p)] = torch.tensor(p, device=device)
        done = torch.zeros(len(chunk), dtype=torch.bool, device=device)
        start = n.clone()
        rows_idx = torch.arange(len(chunk), device=device)
        for _ in range(max_new):
            upto = int(n.max())
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                logits = model(x[:, :upto])
            nxt = logits[rows_idx, n - 1].argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, tok.PAD), nxt)
            x[rows_idx, torch.clamp(n, max=N - 1)] = torch.where(done, x[rows_idx, torch.clamp(n, max=N - 1)], nxt)
            done |= nxt == tok.EOS
            n = torch.where(done, n, n + 1)
            if bool(done.all()):
                break
        for b, r in enumerate(chunk):
            text = tok.decode(x[b, int(start[b]): int(n[b]) + 1].tolist())
            correct += g.final_answer(text) == g.final_answer(r["answer"])
    model.train(was_training)
    return correct / max(1, len(rows))


class Batches(torch.utils.data.IterableDataset):
    """Streamed training batches, built in DataLoader worker processes so that problem generation
    overlaps the GPU step. Each worker draws from its own generator seed (``seed + 7919·worker``)
    and sorts a pool of ``pool`` batches by length before cutting it into batches (less padding)."""

    def __init__(self, seed: int, batch: int, max_len: int, pool: int = 4):
        super().__init__()
        self.seed, self.batch, self.max_len, self.pool = seed, batch, max_len, pool

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid = info.id if info is not None else 0
        fresh = (e for e in stream(self.seed + 7919 * wid) if len(e[0]) <= self.max_len - 8)
        rng = random.Random(self.seed + wid)
        while True:
            items = sorted((next(fresh) for _ in range(self.batch * self.pool)), key=lambda e: len(e[0]))
            chunks = [items[i: i + self.batch] for i in range(0, len(items), self.batch)]
            rng.shuffle(chunks)
            for c in chunks:
                yield batch(c, "cpu")


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
    fits = lambda e: len(e[0]) <= cfg.max_len - 8  # noqa: E731
    if args.data == "split":
        data = [e for e in examples(args.limit) if fits(e)]
        rng = random.Random(args.seed)
        draw = lambda: rng.sample(data, min(args.batch, len(data)))  # noqa: E731
    else:
        loader = iter(torch.utils.data.DataLoader(
            Batches(args.seed + 1000, args.batch, cfg.max_len), batch_size=None, num_workers=args.workers,
            pin_memory=device.type == "cuda", prefetch_factor=8 if args.workers else None))
        draw = lambda: next(loader)  # noqa: E731
    test_rows = list(g.load("test", limit=args.eval_n))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01,
                            fused=device.type == "cuda")
    warm = max(1, min(args.steps // 20, 500))
    t0, curve, evals, step = time.time(), [], [], 0
    budget = args.max_minutes * 60
    progress = lambda s: max(s / args.steps, (time.time() - t0) / budget)  # noqa: E731
    next_eval = args.eval_every * 60
    for step in range(1, args.steps + 1):
        p = min(1.0, progress(step))
        for grp in opt.param_groups:
            grp["lr"] = args.lr * min(1.0, step / warm) * 0.5 * (1 + math.cos(math.pi * p))
        x, y = batch(draw(), device) if args.data == "split" else (t.to(device, non_blocking=True) for t in draw())
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), y.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            curve.append((step, round(loss.item(), 5)))
            print(f"step {step} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"{time.time() - t0:.0f}s", flush=True)
        if args.eval_every and time.time() - t0 > next_eval:
            next_eval += args.eval_every * 60
            acc = greedy_accuracy(model, test_rows[:128], device)
            evals.append((step, round(time.time() - t0, 1), 128, acc))
            print(f"step {step} greedy exact-match on 128 test problems: {acc:.3f}", flush=True)
        if progress(step) >= 1.0:
            print(f"stopping at step {step}: --max-minutes {args.max_minutes}", flush=True)
            break
    acc = greedy_accuracy(model, test_rows, device)
    evals.append((step, round(time.time() - t0, 1), len(test_rows), acc))
    print(f"final greedy exact-match on {len(test_rows)} test problems (training forward): {acc:.3f}", flush=True)
    from reports.rows import git_sha

    data = (str(g.path("train").name) if args.data == "split" else
            f"stream: cases.gsm8k_synth generator seed {args.seed + 1000}, test-split questions excluded")
    meta = {"data": data, "data_hash": g.data_hash("train"), "args": vars(args), "evals": evals,
            "steps_run": step, "loss_curve": curve, "wall_s": round(time.time() - t0, 1), "device": str(device),
            "git_sha": git_sha()}
    M.save(model, args.out, extra=meta)
    print(f"saved {args.out} ({step} steps, loss {curve[-1][1]})")
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.e2e.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", required=True, choices=e2e_gate.LAYOUTS)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=200_000, help="upper bound; --max-minutes usually ends the run")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--data", choices=("stream", "split"), default="stream")
    ap.add_argument("--eval-every", type=float, default=2.0, help="minutes between greedy evaluations (0: only at the end)")
    ap.add_argument("--workers", type=int, default=3, help="DataLoader processes building streamed batches (0: inline)")
    ap.add_argument("--eval-n", type=int, default=500, help="test problems in the final evaluation")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=768)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--limit", type=int, default=None, help="use only the first N training problems")
    ap.add_argument("--max-minutes", type=float, default=10.0)
    ap.add_argument("--log-every", type=int, default=200)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    # TF32 for the training matmuls: a process-wide switch, so only in this CLI's own process; train()
    # called in another process (a test, a notebook) must not turn it on for that process's references
    torch.backends.cuda.matmul.allow_tf32 = True
    train(ap.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
