"""Benchmark (not a test) of mla_fp8_prepare on a GPU: the fused kernel vs the reference chain
vs torch.compile of the chain vs the plain aten chain of the seed, side by side in one run.

    python -m harness.bench.mla_fp8_prepare --out runs/bench-mla

Shapes: Kimi-K3 absorbed MLA (Dn 512, R 64), verify batches B in 1..64 with L = 4 tokens per
request (T = B·L), local heads H in 8..64, kv_descale 0.37 (1.0 for the aten chain, which
has none), strided inputs as the model hands them over, a pool of max(4·T, 4096) rows.

Per row: median time (``triton.testing.do_bench``, return_mode="median") of each
implementation, ratios to the fused kernel, achieved bandwidth (bytes the op must move:
read q and k in bf16 + loc, write q8 and the KV rows in fp8) against a measured
device-to-device copy bandwidth, and the kernel launches of one call counted with
``torch.profiler`` (memcpy/memset excluded). The fused kernel must be exactly 1 launch; the
script exits 1 otherwise. Without a GPU it prints why and exits 0.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

B_VALUES = (1, 2, 4, 8, 16, 32, 64)
L = 4
H_VALUES = (8, 16, 32, 64)
DN, R = 512, 64
KV_DESCALE = 0.37


@dataclass(frozen=True)
class BenchRow:
    B: int
    L: int
    T: int
    H: int
    bytes_moved: int
    fused_us: float
    reference_us: float
    compiled_us: float
    aten5_us: float
    reference_over_fused: float
    compiled_over_fused: float
    aten5_over_fused: float
    fused_gbps: float
    fused_frac_of_copy: float
    fused_launches: int
    reference_launches: int
    compiled_launches: int
    aten5_launches: int


def _inputs(T: int, H: int, dev) -> dict:
    """Model layouts: q_nope a transposed bmm output, q_rope a slice, k_nope/k_rope slices of kv_a."""
    g = torch.Generator(device=dev).manual_seed(T * 1000 + H)
    q_nope = torch.randn(H, T, DN, device=dev, generator=g).bfloat16().transpose(0, 1)  # (T, H, DN) strided
    q_rope = torch.randn(T, H, 128 + R, device=dev, generator=g).bfloat16()[..., 128:]  # (T, H, R) strided
    kv_a = torch.randn(T, DN + R, device=dev, generator=g).bfloat16()
    S = max(4 * T, 4096)
    return dict(q_nope=q_nope, q_rope=q_rope, k_nope=kv_a[:, :DN], k_rope=kv_a[:, DN:],
                kv_buffer=torch.zeros(S, DN + R, dtype=torch.float8_e4m3fn, device=dev),
                loc=torch.randperm(S - 1, device=dev)[:T] + 1)


def _bytes_moved(T: int, H: int) -> int:
    return T * H * (DN + R) * 2 + T * (DN + R) * 2 + T * 8 + T * H * (DN + R) + T * (DN + R)


def _copy_bandwidth(do_bench) -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write counted)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def _launches(fn) -> int:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA
               and not e.name.lower().startswith(("memcpy", "memset")))


def _implementations(kw: dict, compiled_chain):
    """Zero-argument callables, each doing the whole op once on the same inputs (no validation:
    validation syncs the device and is not part of the op)."""
    from fused import mla_fp8_prepare as f
    from reference import mla_fp8_prepare as r

    dev = kw["kv_buffer"].device
    k_mul = f.k_mul_tensor(KV_DESCALE, dev)
    inv = torch.tensor(r.inv_descale(KV_DESCALE), dtype=torch.float32, device=dev)
    T, H = kw["q_nope"].shape[:2]
    q8 = torch.empty(T, H, DN + R, dtype=kw["kv_buffer"].dtype, device=dev)

    def fused():
        f._launch(q8=q8, k_mul=k_mul, **kw)

    def reference():  # launches 1-5 as ``reference.mla_fp8_prepare`` runs them (the descale already on device)
        dt = kw["kv_buffer"].dtype
        r.cast_fp8(r.concat_q(kw["q_nope"], kw["q_rope"]), dt, "saturate")
        kn, kr = r.cast_fp8(kw["k_nope"], dt, "saturate", inv), r.cast_fp8(kw["k_rope"], dt, "saturate", inv)
        r.scatter_kv(kw["kv_buffer"], kw["loc"], kn, kr)

    def compiled():
        compiled_chain(kw["q_nope"], kw["q_rope"], kw["k_nope"], kw["k_rope"], kw["kv_buffer"], kw["loc"], inv)

    def aten5():  # the seed's fallback: concat, three aten casts, scatter (no descale, torch's own overflow)
        q = torch.cat((kw["q_nope"], kw["q_rope"]), dim=-1).to(torch.float8_e4m3fn)
        kn, kr = kw["k_nope"].to(torch.float8_e4m3fn), kw["k_rope"].to(torch.float8_e4m3fn)
        buf = kw["kv_buffer"].view(torch.uint8)  # bytes: fp8 index_put is not on every build
        buf[kw["loc"], :DN] = kn.view(torch.uint8)
        buf[kw["loc"], DN:] = kr.view(torch.uint8)
        return q

    return {"fused": fused, "reference": reference, "compiled": compiled, "aten5": aten5}


def _compiled_chain():
    from reference import mla_fp8_prepare as r

    def chain(q_nope, q_rope, k_nope, k_rope, kv_buffer, loc, inv):
        q8 = r.cast_fp8(r.concat_q(q_nope, q_rope), kv_buffer.dtype, "saturate")
        kn = r.cast_fp8(k_nope, kv_buffer.dtype, "saturate", inv)
        kr = r.cast_fp8(k_rope, kv_buffer.dtype, "saturate", inv)
        rows = torch.cat((kn.view(torch.uint8), kr.view(torch.uint8)), dim=-1)
        kv_buffer.view(torch.uint8)[loc] = rows  # loc has no padding here: a plain index_put (on bytes)
        return q8

    # one graph per benchmarked shape: past dynamo's default limit of 8 it silently runs eager,
    # and the 'compiled' column would time the eager chain (seen on the H200)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    return torch.compile(chain, dynamic=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.mla_fp8_prepare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for bench.csv and meta.json")
    ap.add_argument("--b", type=int, action="append", help="batch sizes (default 1..64)")
    ap.add_argument("--h", type=int, action="append", help="local head counts (default 8..64)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("mla_fp8_prepare bench: no GPU visible to torch (torch.cuda.is_available() is False); "
              "this benchmark only runs on a GPU. Nothing measured.")
        return 0
    from harness import devices

    dev = devices.select("cuda" if torch.version.hip is None else "rocm")
    import pandas as pd
    from triton.testing import do_bench

    bench = lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")  # noqa: E731  ms
    copy_gbps = _copy_bandwidth(bench)
    print(f"device: {dev.name} ({dev.arch}); torch {torch.__version__}; "
          f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    compiled_chain = _compiled_chain()
    rows, bad = [], []
    for B in args.b or B_VALUES:
        for H in args.h or H_VALUES:
            T = B * L
            kw = _inputs(T, H, "cuda")
            impls = _implementations(kw, compiled_chain)
            for fn in impls.values():  # compile / autotune outside the timed region
                fn()
            torch.cuda.synchronize()
            us = {k: bench(fn) * 1e3 for k, fn in impls.items()}
            n = {k: _launches(fn) for k, fn in impls.items()}
            moved = _bytes_moved(T, H)
            gbps = moved / (us["fused"] * 1e-6) / 1e9
            rows.append(BenchRow(
                B=B, L=L, T=T, H=H, bytes_moved=moved,
                fused_us=us["fused"], reference_us=us["reference"], compiled_us=us["compiled"], aten5_us=us["aten5"],
                reference_over_fused=us["reference"] / us["fused"], compiled_over_fused=us["compiled"] / us["fused"],
                aten5_over_fused=us["aten5"] / us["fused"], fused_gbps=gbps, fused_frac_of_copy=gbps / copy_gbps,
                fused_launches=n["fused"], reference_launches=n["reference"], compiled_launches=n["compiled"],
                aten5_launches=n["aten5"]))
            if n["fused"] != 1:
                bad.append(f"B={B} H={H}: fused kernel made {n['fused']} launches, expected 1")
    frame = pd.DataFrame([asdict(r) for r in rows])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "bench.csv", index=False)
    (out / "meta.json").write_text(json.dumps({"device": dev.name, "arch": dev.arch, "copy_gbps": copy_gbps,
                                               **devices.versions()}, indent=2))
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.3g}".format):
        print(frame.drop(columns=["bytes_moved"]).to_string(index=False))
    print(f"wrote {out / 'bench.csv'}")
    for line in bad:
        print("FAIL", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
