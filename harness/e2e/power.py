"""How the sampled gate's distribution test does over many seeds: its p-values on clean samplers and
its detection of a sampler mutant, on the shipped models (or random weights with ``--models`` an
empty directory).

    python -m harness.e2e.power --sampler mutant-residual-from-q --seeds 10 [--layout L ...] [--out CSV]
    python -m harness.e2e.power --sampler reference --sampler fused --seeds 5

Run s of a (layout, sampler) is the ``sampled`` profile's speculative run (its problems, temperature,
traced tokens; ``--profile`` another) with gate seed s, judged by the same test the gate uses
(``harness.e2e.gate.distribution``). Only the traced tokens matter, so each run decodes ``record``
tokens per request: the traced tokens follow the distribution of the gate's run (not its draws: the
sampler's uniforms are drawn per step for the requests still running). One line per run: the
adjusted log10 p, and the draft's surprise Σ −log p(draft) over the traced positions with a draft —
what a sampler that always emits the draft adds to the test's Σ −log U, whose sd is √N.
"""
from __future__ import annotations

import argparse
import sys
import time

import pandas as pd
import torch

from cases import e2e_gate as cfg
from harness import devices
from harness.e2e import gate
from harness.ops import default_registry


def draft_surprise(gen, temperature: float) -> float:
    """Σ −log p(draft) over the traced positions that had a draft (p = softmax(row / T), fp64)."""
    d = torch.cat([t.drafts for t in gen.traces]).long()
    rows = torch.cat([t.logits for t in gen.traces]).double()
    has = d >= 0
    p = torch.softmax(rows[has] / temperature, dim=-1).gather(-1, d[has][:, None])[:, 0]
    return float(-p.clamp_min(1e-300).log().sum())


def measure(layouts, samplers, seeds: int, profile: cfg.GateProfile, models_dir: str) -> pd.DataFrame:
    from dataclasses import replace

    from harness.e2e import engine as E

    dev = devices.select("auto")
    reg = default_registry(with_plugins=False)
    prompts = gate.gate_problems(profile.problems)[0]
    rows = []
    for layout in layouts:
        model = gate.load_model(layout, models_dir, dev.torch_device)[0]
        base = gate.paths_for(reg, layout, profile)[0][1]  # the reference path
        for name in samplers:
            path = replace(base, sampler=reg.impls[f"{gate.sampler_op(reg)}/{name}"])
            label = f"reference+reference+{name}"
            for s in range(seeds):
                t0 = time.perf_counter()
                smp = E.Sampling(profile.temperature, gate.run_seed(s, layout, label, "sampling", 0),
                                 record=profile.record)
                gen = gate.generate(model, path, prompts, profile.record, gate.shared_drafter(),
                                    profile.batch, dev.torch_device, profile.num_kv_splits, sampling=smp)
                res = gate.distribution(gen, profile.temperature, s, layout, label)
                rows.append({"layout": layout, "sampler": name, "seed": s, "tokens": res.tokens,
                             "log10_p": res.log10_p, "failed": not res.passed(profile.thresholds.dist_alpha),
                             "draft_surprise": draft_surprise(gen, profile.temperature), "worst": res.worst,
                             "seconds": round(time.perf_counter() - t0, 1)})
                print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sampler", action="append", help="implementations of the sampler op (default: mutant-residual-from-q)")
    ap.add_argument("--seeds", type=int, default=10, help="runs per (layout, sampler): gate seeds 0..N-1")
    ap.add_argument("--layout", action="append", choices=cfg.LAYOUTS, help="default: every layout")
    ap.add_argument("--profile", default="sampled", choices=[k for k, p in cfg.PROFILES.items() if p.temperature > 0])
    ap.add_argument("--models", default=cfg.MODEL_DIR, help="directory of <layout>.safetensors (else random weights)")
    ap.add_argument("--out", help="CSV of every run")
    args = ap.parse_args(argv)
    df = measure(args.layout or cfg.LAYOUTS, args.sampler or ["mutant-residual-from-q"], args.seeds,
                 cfg.PROFILES[args.profile], args.models)
    if args.out:
        df.to_csv(args.out, index=False)
    print(df.groupby(["layout", "sampler"]).agg(runs=("seed", "size"), failed=("failed", "sum"),
                                                log10_p_min=("log10_p", "min"), log10_p_max=("log10_p", "max"),
                                                surprise_min=("draft_surprise", "min"), tokens=("tokens", "first"),
                                                seconds=("seconds", "sum")).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
