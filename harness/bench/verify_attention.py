"""GPU benchmark (not a test) for verify_attention: shared-KV vs per-head split-KV vs a
torch.compile'd dense reference vs SDPA, side by side in one run.

    python -m harness.bench.verify_attention --out DIR [--quick]

Shapes: GQA (H 16, one KV head, D 256 — Qwen3.5 TP2) and Kimi-K3 MLA (H 16, D 576 / Dv 512,
V = latent), L 4 drafts, prefix 1K / 4K / 16K / 64K, B 1 / 4 / 16 / 64, bf16 KV in random
page-size-1 slots. Times are medians of ``triton.testing.do_bench``; bandwidth counts the KV
bytes a single pass must read (MLA: K only, V is its first 512 dims) and is compared with a
measured device copy bandwidth (read + write of 1 GiB). Each row also records the max |Δ|
between the two kernels, so a fast wrong kernel is visible. Writes DIR/verify_attention_bench.csv.
Exits 0 with a message on a machine without a GPU.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class BenchRow:
    layout: str
    B: int
    prefix: int
    H: int
    D: int
    Dv: int
    L: int
    splits: int
    kv_gb: float  # KV bytes one pass must read
    shared_ms: float
    split_ms: float
    compiled_ms: float
    sdpa_ms: float
    split_over_shared: float
    compiled_over_shared: float
    sdpa_over_shared: float
    shared_tb_s: float
    shared_pct_copy: float  # of the measured copy bandwidth
    split_pct_copy: float
    max_abs_diff: float  # shared-KV vs split-KV outputs
    shared_prefix_ms: float  # the shared-KV prefix kernel alone (the combine left out)
    shared_combine_ms: float  # the combine kernel alone (draft triangle + LSE merge)


def copy_bandwidth_tb_s() -> float:
    import triton.testing

    x = torch.empty(1 << 29, dtype=torch.float16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=10, rep=100, return_mode="median")
    return 2 * x.numel() * x.element_size() / (ms * 1e-3) / 1e12


def _inputs(layout: str, B: int, n: int, H: int, L: int, dev: str = "cuda"):
    D, Dv = (576, 512) if layout == "mla" else (256, 256)
    g = torch.Generator(device=dev).manual_seed(B * 1000 + n)
    T, S = B * L, B * n
    q = torch.randn(T, H, D, device=dev, generator=g).bfloat16()
    k = torch.randn(T, 1, D, device=dev, generator=g).bfloat16()
    kb = torch.randn(S, 1, D, device=dev, generator=g).bfloat16()
    if layout == "mla":
        v, vb = k[..., :Dv], kb[..., :Dv]
    else:
        v = torch.randn(T, 1, Dv, device=dev, generator=g).bfloat16()
        vb = torch.randn(S, 1, Dv, device=dev, generator=g).bfloat16()
    kv_indices = torch.randperm(S, device=dev, generator=g).to(torch.int32)  # page size 1, random slots
    kw = dict(q=q, k=k, v=v, k_buffer=kb, v_buffer=vb,
              qo_indptr=torch.arange(0, T + 1, L, dtype=torch.int32, device=dev),
              kv_indptr=torch.arange(0, S + 1, n, dtype=torch.int32, device=dev), kv_indices=kv_indices,
              sm_scale=1.0 / math.sqrt(D if layout == "gqa" else 192), is_causal=True, k_scale=1.0, v_scale=1.0)
    return kw, D, Dv


def _splits(B: int, n: int, blocks: int, sms: int) -> int:
    """Enough programs to fill the GPU twice, each split at least 256 prefix tokens."""
    return max(1, min(64, math.ceil(2 * sms / max(1, B * blocks)), n // 256))


def _dense_mask(n: int, L: int, device) -> torch.Tensor:
    return torch.cat((torch.ones(L, n, dtype=torch.bool, device=device),
                      torch.ones(L, L, dtype=torch.bool, device=device).tril()), 1)  # (L, n + L)


def _dense_reference(q, k, v, kb, vb, idx, mask, sm_scale):
    """Dense masked verify attention from the paged pool (what torch.compile gets): gather the
    prefix by index, append the drafts, fp32 softmax. q (B, L, H, D); k, v (B, L, 1, *);
    idx (B, n); mask (L, n + L)."""
    keys = torch.cat((kb[idx], k), 1).float()  # (B, n+L, 1, D)
    vals = torch.cat((vb[idx], v), 1).float()  # (B, n+L, 1, Dv)
    x = torch.einsum("blhd,bnd->bhln", q.float(), keys[:, :, 0]) * sm_scale  # (B, H, L, n+L)
    x = x.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhln,bnd->blhd", x.softmax(-1), vals[:, :, 0]).to(q.dtype)  # (B, L, H, Dv)


def run(out: Path, quick: bool) -> list[BenchRow]:
    import triton.testing

    from fused import verify_attention as f

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth_tb_s()
    print(f"device: {torch.cuda.get_device_name(0)} ({sms} SMs); measured copy bandwidth {bw:.2f} TB/s", flush=True)
    # one graph per benchmarked shape: past dynamo's default limit of 8 it silently runs eager,
    # and the 'compiled' column would time the eager chain (seen on the H200)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    compiled = torch.compile(_dense_reference, dynamic=False)
    prefixes = (1024, 4096) if quick else (1024, 4096, 16384, 65536)
    batches = (1, 64) if quick else (1, 4, 16, 64)
    H, L = 16, 4
    rows = []
    for layout in ("gqa", "mla"):
        for n in prefixes:
            for B in batches:
                kw, D, Dv = _inputs(layout, B, n, H, L)
                block_h = f.block_h_for(H, D)
                s_shared = _splits(B, n, H // block_h, sms)
                s_split = _splits(B, n, H, sms)
                bench = lambda fn: triton.testing.do_bench(fn, warmup=5, rep=50, return_mode="median")  # noqa: E731
                a = f.verify_shared_kv(**kw, num_kv_splits=s_shared)["o"]
                b = f.verify_split_kv(**kw, num_kv_splits=s_split)["o"]
                fast = dict(check=False, validate=False)  # validated by the two calls above
                t_shared = bench(lambda: f._launch("shared_kv", **kw, num_kv_splits=s_shared, **fast))
                t_split = bench(lambda: f._launch("split_kv", **kw, num_kv_splits=s_split, **fast))
                t_prefix = bench(lambda: f._launch("shared_kv", **kw, num_kv_splits=s_shared, stages=("prefix",),
                                                   **fast))
                t_combine = bench(lambda: f._launch("shared_kv", **kw, num_kv_splits=s_shared, stages=("combine",),
                                                    **fast))
                q4 = kw["q"].view(B, L, H, D)
                k4, v4 = kw["k"].view(B, L, 1, D), kw["v"].reshape(B, L, 1, Dv)
                idx = kw["kv_indices"].view(B, n).long()
                mask = _dense_mask(n, L, "cuda")
                try:
                    t_comp = bench(lambda: compiled(q4, k4, v4, kw["k_buffer"], kw["v_buffer"], idx, mask,
                                                    kw["sm_scale"]))
                except torch.OutOfMemoryError:
                    t_comp = float("nan")
                # SDPA on dense KV (already gathered: the layout SDPA needs), explicit mask
                try:
                    kd = torch.cat((kw["k_buffer"][idx], k4), 1).transpose(1, 2)  # (B, 1, n+L, D)
                    vd = torch.cat((kw["v_buffer"][idx], v4), 1).transpose(1, 2)
                    qd = q4.transpose(1, 2)  # (B, H, L, D)
                    t_sdpa = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                        qd, kd, vd, attn_mask=mask, scale=kw["sm_scale"], enable_gqa=True))
                    del kd, vd
                except torch.OutOfMemoryError:
                    t_sdpa = float("nan")
                kv_bytes = B * n * (D + (0 if layout == "mla" else Dv)) * 2
                row = BenchRow(layout, B, n, H, D, Dv, L, s_shared, kv_bytes / 1e9, t_shared, t_split, t_comp, t_sdpa,
                               t_split / t_shared, t_comp / t_shared, t_sdpa / t_shared,
                               kv_bytes / (t_shared * 1e-3) / 1e12, 100 * kv_bytes / (t_shared * 1e-3) / 1e12 / bw,
                               100 * kv_bytes / (t_split * 1e-3) / 1e12 / bw,
                               float((a.float() - b.float()).abs().max()), t_prefix, t_combine)
                rows.append(row)
                print(f"{layout} B={B:3d} prefix={n:6d}: shared {t_shared:8.3f} ms ({row.shared_pct_copy:5.1f}% copy) | "
                      f"split {t_split:8.3f} ms ({row.split_over_shared:5.2f}x) | compiled {t_comp:8.3f} ms | "
                      f"sdpa {t_sdpa:8.3f} ms | shared prefix/combine {t_prefix:.3f}/{t_combine:.3f} ms | "
                      f"max|Δ| {row.max_abs_diff:.3g}", flush=True)
                del kw, a, b
                torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    frame = pd.DataFrame([asdict(r) for r in rows])
    frame.to_csv(out / "verify_attention_bench.csv", index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.3g}".format):
        print(frame.to_string(index=False))
    print(f"copy bandwidth {bw:.2f} TB/s; rows -> {out / 'verify_attention_bench.csv'}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.verify_attention", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="prefix 1K/4K, B 1/64 only")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("verify_attention bench: no GPU visible to torch; nothing to measure (this is a GPU benchmark)")
        return 0
    from harness import devices

    devices.select("auto")
    run(args.out, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
