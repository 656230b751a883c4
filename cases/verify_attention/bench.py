"""GPU benchmark (not a test) for verify_attention: shared-KV vs per-head split-KV vs the
reference chain vs a torch.compile'd dense reference vs SDPA, side by side in one run.

    python -m cases.verify_attention.bench --out DIR [--quick]

Shapes: GQA (H 16, one KV head, D 256 — Qwen3.5 TP2) and Kimi-K3 MLA (H 16, D 576 / Dv 512,
V = latent), L 4 drafts, prefix 1K / 4K / 16K / 64K, B 1 / 8 / 64, bf16 KV in random
page-size-1 slots. Implementations (PerfRow ``impl``): ``fused-shared-kv`` and ``fused-split-kv``
(the two Triton kernels, prefix + combine: 2 launches each, else exit 1), ``fused-shared-kv-bf16p``
(the shared-KV kernel with one bf16(P)·V dot per tile instead of two: precision class bf16-p,
beside the exact one so that what the class buys is measured), ``reference`` (the
unfused per-head chain of ``reference.verify_attention.chain``, with its host-side loop over requests),
``sglang-shared-kv`` / ``sglang-split-kv`` (peers: SGLang's own kernels as its backend calls them,
scratch cached across calls, its own split counts; measured on a GPU when sglang is installed,
``harness.adapters.sglang.bench_calls``), ``compiled`` (torch.compile of a dense masked formulation of the reference: gather the prefix,
append the drafts, fp32 softmax — what compile can make fast; the chain's per-request loop is
not), ``sdpa`` (SDPA on K/V already gathered dense, explicit mask). Times are p20/p50/p80 of
``harness.gpu.profiling.time_quantiles_us``; bandwidth counts the KV bytes a single pass must read
(MLA: K only, V is its first 512 dims) against the measured device copy bandwidth. Each wide row
also records the max |Δ| between the two kernels (a fast wrong kernel is visible), and the shared-KV
op, its prefix launch and its combine launch replayed from a CUDA graph (``profiling.graph_time_us``:
device time without the host's launch cost, which dominates an eager time of a short launch). Writes DIR/verify_attention_bench.csv
(wide, one row per shape) and DIR/perf.csv (PerfRow). Exits 0 with a message without a GPU.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch

from harness.gpu import profiling
from harness.bench import perf
from harness.bench import perf_rows as pr
from harness.bench import wide_rows as wr
from reports.rows import PerfRow

OP = "verify_attention"
IMPLS = ("fused-shared-kv", "fused-shared-kv-bf16p", "fused-split-kv", "reference", "compiled", "sdpa")
EXPECTED_LAUNCHES = {"fused-shared-kv": 2, "fused-shared-kv-bf16p": 2, "fused-split-kv": 2}  # prefix + combine
WARMUP_MS, REP_MS = 5, 50
EXTRA_TIMINGS = 3  # the shared-KV op, its prefix and its combine kernel replayed from a graph
LAYOUTS = ("gqa", "mla")
H, L = 16, 4
PREFIX_FULL, B_FULL = (1024, 4096, 16384, 65536), (1, 8, 64)
PREFIX_QUICK, B_QUICK = (1024, 4096), (1, 64)


@dataclass(frozen=True)
class Shape:
    layout: str  # gqa | mla
    B: int  # requests
    prefix: int  # prefix tokens per request
    H: int = H  # query heads (one KV head)

    @property
    def case(self) -> str:
        return f"{self.layout},B={self.B},prefix={self.prefix},H={self.H},L={L}"


def shapes(quick: bool) -> list[Shape]:
    return [Shape(layout, B, n) for layout in LAYOUTS for n in (PREFIX_QUICK if quick else PREFIX_FULL)
            for B in (B_QUICK if quick else B_FULL)]


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
    shared_ms: float  # p50
    shared_bf16p_ms: float  # the single-dot variant (p_precision "bf16", class bf16-p)
    split_ms: float
    reference_ms: float
    compiled_ms: float
    sdpa_ms: float
    split_over_shared: float
    reference_over_shared: float
    compiled_over_shared: float
    sdpa_over_shared: float
    shared_over_bf16p: float  # > 1: the single P·V dot is faster
    sglang_shared_ms: float  # SGLang's verify_shared_kv_fwd (NaN: not installed, or it declines the shape)
    sglang_split_ms: float  # SGLang's verify_splitkv_fwd
    sglang_shared_over_bf16p: float  # > 1: ours (single dot, the same class as SGLang's) is faster
    shared_tb_s: float
    shared_pct_copy: float  # of the measured copy bandwidth
    split_pct_copy: float
    max_abs_diff: float  # shared-KV vs split-KV outputs
    shared_prefix_ms: float  # the shared-KV prefix kernel alone (the combine left out), replayed from a graph
    shared_combine_ms: float  # the combine kernel alone (draft triangle + LSE merge), replayed from a graph
    shared_graph_ms: float  # prefix + combine replayed from a graph: no host launch cost (eager small shapes pay it)
    shared_graph_pct_copy: float


def bench_inputs(layout: str, B: int, n: int, H: int, L: int, dev: str = "cuda"):
    """The benchmark's inputs: B requests of L drafts over n prefix tokens each (page size 1, random
    slots), H query heads on one KV head, ``layout`` "gqa" (D = Dv = 256) or "mla" (576 / 512) ->
    (kwargs of the op, D, Dv)."""
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


def kv_bytes_read(layout: str, B: int, n: int, D: int, Dv: int) -> int:
    """KV bytes one pass must read (bf16): K, and V unless it is K's first Dv dims (MLA latent)."""
    return B * n * (D + (0 if layout == "mla" else Dv)) * 2


def splits_for(B: int, n: int, blocks: int, sms: int) -> int:
    """As many splits as keep the prefix programs within two per SM (no partial third wave), each
    split at least 256 prefix tokens. Measured on the H200 (explore of 2026-11-29, shared-KV, L 4,
    H 16): GQA B 64 prefix 16K 376 us at 4 splits (256 programs) vs 391 at 8 (what rounding up
    chose before: 5, 320 programs); MLA B 64 prefix 4K 394 us at 2 vs 411 at 4; GQA B 8 prefix
    16K 147 us at 32 vs 158 at 16 and 165 at 64."""
    return max(1, min(64, 2 * sms // max(1, B * blocks), n // 256))


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


def _implementations(kw: dict, B: int, n: int, D: int, Dv: int, s_shared: int, s_split: int, compiled) -> dict:
    """Zero-argument callables, each computing the whole op once on the same inputs. The kernels
    skip argument checks (validated once by the caller; they sync the device)."""
    from fused.verify_attention import wrapper as f
    from reference.verify_attention import chain as r

    fast = dict(check=False, validate=False)
    q4 = kw["q"].view(B, L, -1, D)
    k4, v4 = kw["k"].view(B, L, 1, D), kw["v"].reshape(B, L, 1, Dv)
    idx = kw["kv_indices"].view(B, n).long()
    mask = _dense_mask(n, L, q4.device)
    dense = {}

    def sdpa():  # K/V gathered dense once, outside the timed region (the layout SDPA needs)
        if not dense:
            dense["k"] = torch.cat((kw["k_buffer"][idx], k4), 1).transpose(1, 2)  # (B, 1, n+L, D)
            dense["v"] = torch.cat((kw["v_buffer"][idx], v4), 1).transpose(1, 2)  # (B, 1, n+L, Dv)
        return torch.nn.functional.scaled_dot_product_attention(
            q4.transpose(1, 2), dense["k"], dense["v"], attn_mask=mask, scale=kw["sm_scale"], enable_gqa=True)

    return {
        "fused-shared-kv": lambda: f.launch("shared_kv", **kw, num_kv_splits=s_shared, **fast),
        "fused-shared-kv-bf16p": lambda: f.launch("shared_kv", **kw, num_kv_splits=s_shared, p_precision="bf16",
                                                  **fast),
        "fused-split-kv": lambda: f.launch("split_kv", **kw, num_kv_splits=s_split, **fast),
        "reference": lambda: r.verify_attention(**kw, num_kv_splits=s_split),
        "compiled": lambda: compiled(q4, k4, v4, kw["k_buffer"], kw["v_buffer"], idx, mask, kw["sm_scale"]),
        "sdpa": sdpa,
    }


PEERS = ("sglang-shared-kv", "sglang-split-kv")  # measured beside IMPLS where they run (not in IMPLS)


def _peers(kw: dict, dev) -> dict:
    """Peers' kernels on the same inputs (compiled devices only: the interpreter times nothing real)."""
    if dev.interpreted:
        return {}
    from harness.adapters import sglang

    return sglang.bench_calls(kw)


WIDE_CSV = "verify_attention_bench.csv"


def measurements(shape_list: list[Shape], ctx: perf.Context):
    from fused.verify_attention import config as vc
    from fused.verify_attention import wrapper as f

    compiled = perf.compile_static(_dense_reference)
    for s in shape_list:
        B, n = s.B, s.prefix
        kw, D, Dv = bench_inputs(s.layout, B, n, s.H, L, dev=ctx.dev.torch_device)
        s_shared = splits_for(B, n, s.H // vc.block_h_for(s.H, D), ctx.sms)
        s_split = splits_for(B, n, s.H, ctx.sms)
        a = f.verify_shared_kv(**kw, num_kv_splits=s_shared)["o"]
        b = f.verify_split_kv(**kw, num_kv_splits=s_split)["o"]
        diff = float((a.float() - b.float()).abs().max())
        del a, b
        t = perf.measure(_implementations(kw, B, n, D, Dv, s_shared, s_split, compiled), ctx.dev,
                         warmup_ms=WARMUP_MS, rep_ms=REP_MS)
        t.update(perf.measure(_peers(kw, ctx.dev), ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS))
        fast = dict(num_kv_splits=s_shared, check=False, validate=False)
        # replayed from a graph: a launch alone is shorter than its host-side launch path, so its eager time is the host's
        t_prefix, t_combine, t_graph = (profiling.graph_time_us(lambda st=st: f.launch("shared_kv", **kw, stages=st, **fast))
                                        for st in (("prefix",), ("combine",), ("prefix", "combine")))
        del kw
        if not ctx.dev.interpreted:
            torch.cuda.empty_cache()
        yield wr.Measured(s, t, kv_bytes_read(s.layout, B, n, D, Dv),
                          dict(D=D, Dv=Dv, s_shared=s_shared, diff=diff, t_prefix=t_prefix, t_combine=t_combine,
                               t_graph=t_graph, copy_gbps=ctx.copy_gbps))


def wide_row(m: wr.Measured, rows: dict[str, PerfRow]) -> tuple[BenchRow, str]:
    s, x = m.shape, m.extra
    sh, sp = rows["fused-shared-kv"], rows["fused-split-kv"]
    ms = {k: v.p50_us / 1e3 for k, v in m.timings.items()}
    peer = {k: ms.get(k, float("nan")) for k in PEERS}
    row = BenchRow(s.layout, s.B, s.prefix, s.H, x["D"], x["Dv"], L, x["s_shared"], m.bytes_moved / 1e9,
                   ms["fused-shared-kv"], ms["fused-shared-kv-bf16p"], ms["fused-split-kv"], ms["reference"],
                   ms["compiled"], ms["sdpa"],
                   *(pr.ratio(ms[k], ms["fused-shared-kv"]) for k in ("fused-split-kv", "reference", "compiled",
                                                                       "sdpa")),
                   pr.ratio(ms["fused-shared-kv"], ms["fused-shared-kv-bf16p"]), peer["sglang-shared-kv"],
                   peer["sglang-split-kv"], pr.ratio(peer["sglang-shared-kv"], ms["fused-shared-kv-bf16p"]),
                   sh.gbps / 1e3, 100 * sh.frac_of_copy, 100 * sp.frac_of_copy, x["diff"], x["t_prefix"] / 1e3,
                   x["t_combine"] / 1e3, x["t_graph"] / 1e3,
                   100 * pr.bandwidth(m.bytes_moved, x["t_graph"], x["copy_gbps"])[1])
    line = (f"shared {row.shared_ms:8.3f} ms ({row.shared_pct_copy:5.1f}% copy) | "
            f"bf16p {row.shared_bf16p_ms:8.3f} ms ({row.shared_over_bf16p:5.2f}x) | "
            f"sglang shared {row.sglang_shared_ms:8.3f} ms ({row.sglang_shared_over_bf16p:5.2f}x bf16p) "
            f"split {row.sglang_split_ms:8.3f} ms | "
            f"split {row.split_ms:8.3f} ms ({row.split_over_shared:5.2f}x) | reference {row.reference_ms:8.3f} ms | "
            f"compiled {row.compiled_ms:8.3f} ms | sdpa {row.sdpa_ms:8.3f} ms | "
            f"graph {row.shared_graph_ms:.3f} ms ({row.shared_graph_pct_copy:.1f}%), prefix/combine "
            f"{row.shared_prefix_ms:.3f}/{row.shared_combine_ms:.3f} ms | "
            f"max|Δ| {row.max_abs_diff:.3g}")
    return row, line


def _picked(args, ap) -> list[Shape]:
    picked = [s for s in shapes(args.quick) if (not args.prefix or s.prefix in args.prefix)
              and (not args.batch or s.B in args.batch)]
    if not picked:
        ap.error(f"no shape has prefix in {args.prefix} and B in {args.batch}")
    return picked


def main(argv: list[str] | None = None) -> int:
    return perf.main_for(sys.modules[__name__], argv, quick_help=f"prefix {PREFIX_QUICK} x B {B_QUICK} only",
                         options={"--prefix": "only these prefix lengths (repeatable)",
                                  "--batch": "only these batch sizes (repeatable)"}, pick=_picked)


# ----------------------------------------------------------------------------- wrapper checks

def wrapper_entries(dev, small: bool) -> list:
    """The fused wrappers' entries for ``harness.bench.wrapper_checks`` (host cost of their argument
    checks) on hot-path shapes; ``small``: the CPU's."""
    from cases.verify_attention import catalog as c
    from fused.verify_attention import wrapper as f
    from harness.bench.wrapper_checks import Entry
    from reference.verify_attention import chain as r

    B, H, D, n = (2, 4, 64, 64) if small else (8, 16, 256, 4096)
    case = c.VerifyAttentionCase(B=B, L=4, H=H, Hkv=1, D=D, Dv=D, prefix=f"const:{n}", splits=8, family="qwen3.5",
                                 seed=2)
    shape = f"gqa,B={B},L=4,H={H},D={D},prefix={n},splits=8"
    ref_args = lambda kw: kw  # noqa: E731  (the wrappers take validate's arguments)
    return [Entry(OP, name, shape, lambda: c.build_inputs(case, dev), fn, ((r, "validate", ref_args),))
            for name, fn in (("fused.verify_split_kv", f.verify_split_kv), ("fused.verify_shared_kv", f.verify_shared_kv),
                             ("fused.verify_attention.wrapper", f.verify_attention))]


if __name__ == "__main__":
    sys.exit(main())
