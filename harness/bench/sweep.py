"""Block-config sweep for the verify_attention kernels on a GPU (a tool for filling the per-arch
table ``fused.verify_attention.wrapper.BLOCK_CONFIG``, not a test and not a benchmark claim).

    python -m harness.bench.sweep --out DIR [--layout gqa|mla] [--b 64] [--prefix 4096]

For one verify shape (B requests × L 4 drafts, H 16, prefix tokens in random page-size-1 slots),
every (BLOCK_H, BLOCK_N, num_warps, num_stages) candidate is patched into the table for this
arch and head_dim, launched, checked against the table's current config (max |Δ| of the outputs:
a config that changes the numbers beyond the fp32 reassociation of a different tiling is
flagged), and timed (p20/p50/p80, bandwidth against the measured copy bandwidth). Candidates
that fail to compile (shared memory, register limits) are reported as such. Writes
DIR/sweep.csv sorted by p50 and prints the best few. Without a GPU: says so and exits 0.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

BLOCK_H = (4, 8, 16)
BLOCK_N = (16, 32, 64, 128)
WARPS = (4, 8)
STAGES = (1, 2, 3)


def candidates(quick: bool = False) -> list[tuple[int, int, int, int]]:
    if quick:
        return [(bh, bn, w, s) for bh, bn, w, s in itertools.product((8, 16), (32, 64), (4, 8), (1, 2))]
    return list(itertools.product(BLOCK_H, BLOCK_N, WARPS, STAGES))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layout", default="gqa", choices=("gqa", "mla"))
    ap.add_argument("--kind", default="shared_kv", choices=("shared_kv", "split_kv"))
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="16 candidates instead of 144")
    ap.add_argument("--combine-block-h", type=int, action="append", dest="combine_block_h",
                    help="query heads per combine program to try (repeatable; default: the prefix kernel's BLOCK_H)")
    ap.add_argument("--splits", type=int, action="append",
                    help="KV split counts to try with every candidate (repeatable; default: the benchmark's own)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sweep: no GPU visible to torch (torch.cuda.is_available() is False): nothing measured")
        return 0
    import pandas as pd

    from fused.verify_attention import config as vc
    from fused.verify_attention import wrapper as f
    from harness import devices
    from harness.gpu import profiling
    from harness.bench import perf_rows as pr
    from cases.verify_attention import bench as vb

    devices.select("auto")
    arch = vc.arch()
    H, L = 16, 4
    shape = vb.Shape(args.layout, B=args.b, prefix=args.prefix, H=H)
    kw, D, Dv = vb.bench_inputs(args.layout, args.b, args.prefix, H, L)
    table = vc.BLOCK_CONFIG.setdefault(arch, dict(vc.BLOCK_CONFIG[vc.DEFAULT_ARCH]))
    key = min((d for d in table if d >= D), default=max(table))
    baseline_cfg = table[key]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy_gbps = profiling.copy_bandwidth_gbps()
    kv_bytes = vb.kv_bytes_read(args.layout, args.b, args.prefix, D, Dv)

    def launch(cfg, splits=None, cbh=None):
        table[key] = cfg
        block_h = vc.block_h_for(H, D)
        splits = splits or vb.splits_for(args.b, args.prefix, H // block_h if args.kind == "shared_kv" else H, sms)
        fn = lambda: f.launch(args.kind, **kw, num_kv_splits=splits, combine_block_h=cbh, check=False,  # noqa: E731
                              validate=False)
        return fn, splits

    want = launch(baseline_cfg)[0]()["o"].float()
    rows = []
    print(f"sweep {args.kind} {shape.case} on {arch} (table key D={key}, current {baseline_cfg}); "
          f"copy {copy_gbps:.0f} GB/s", flush=True)
    for cfg, want_splits, cbh in itertools.product(candidates(args.quick), args.splits or [None],
                                                   args.combine_block_h or [None]):
        try:
            fn, splits = launch(cfg, want_splits, cbh)
            got = fn()["o"].float()
            torch.cuda.synchronize()
            p20, p50, p80 = profiling.time_quantiles_us(fn, warmup=5, rep=40)
            diff = float((got - want).abs().max())
            gbps, frac = pr.bandwidth(kv_bytes, p50, copy_gbps)
            rows.append(dict(block_h=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3], splits=splits,
                             combine_block_h=cbh or "", p20_us=p20, p50_us=p50, p80_us=p80, gbps=gbps,
                             frac_of_copy=frac, max_abs_diff=diff, error=""))
            print(f"  {cfg} splits {splits} combine_block_h {cbh or '-'}: p50 {p50:8.1f} us  "
                  f"{frac:6.1%} of copy  max|Δ| {diff:.3g}", flush=True)
        except Exception as e:  # a candidate that does not compile or launch on this arch
            rows.append(dict(block_h=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3], splits=want_splits,
                             combine_block_h=cbh or "", error=f"{type(e).__name__}: {str(e)[:160]}"))
            print(f"  {cfg}: {type(e).__name__}", flush=True)
    table[key] = baseline_cfg
    frame = pd.DataFrame(rows).sort_values("p50_us", na_position="last")
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "sweep.csv", index=False)
    print(frame.head(8).to_string(index=False))
    print(f"-> {args.out / 'sweep.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
