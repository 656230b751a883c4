"""Benchmark (not a test) of qk_norm_rope on a GPU: the fused one-launch kernel vs the reference
two-launch chain vs torch.compile of that chain, in target-verify mode (no ring store: seed 000's
gate keeps the store out of the verify launch).

    python -m cases.qk_norm_rope.bench --out DIR [--quick]

Shapes: DeepSeek-V4 MQA as ``cases.qk_norm_rope.catalog`` builds it (D 512, R 64 interleaved, no q
weight, kv a strided slice of qkv_a, positions in an 8192-row table): B requests × L = 4 tokens
(3 drafts + the bonus token, T = B·L), local heads H 8..64.

Per implementation, and SGLang's own kernel beside them where it is installed (``PEERS``,
``harness.adapters.sglang.qk_bench_calls``): p20/p50/p80 (``harness.gpu.profiling.time_quantiles_us``), the
median replayed from a CUDA graph (``graph_time_us``), kernel launches of
one call (``count_launches``; the fused kernel must be exactly 1, else exit 1), bandwidth of
the bytes the op must move (read q, kv, positions, cos/sin rows, weight; write q_out, kv_out)
against the measured copy bandwidth. The fused call allocates its outputs, as the wrapper does,
but skips the wrapper's argument checks (they sync the device; they are not the op). Writes
DIR/qk_norm_rope_bench.csv (wide, one row per shape) and DIR/perf.csv (PerfRow). Without a GPU
it says so and exits 0.

    python -m cases.qk_norm_rope.bench --vs-sglang --out DIR [--T ..] [--H ..] [--modes verify decode]
        [--configs default,2x4,8x8] [--before OLD/fused/qk_norm_rope/wrapper.py] [--no-sglang] [--no-sglang-jit]

Ours against SGLang's own ``fused_qk_norm_rope_swa_store`` (``harness.adapters.sglang.load``: the
installed wheel's kernel file), DeepSeek-V4 shapes, T 1..4096 x H 8..128, verify (no store) and
decode (the bf16 ring store in the kernel). Graph-replayed (``do_bench_cudagraph``): our kernel at
each ``--configs`` (BLOCK_T x num_warps), ``--before``'s kernel, SGLang's, the reference chain and
torch.compile of it (verify only), each with its % of the copy bandwidth; eager (a back-to-back
loop, what a caller pays): our public wrapper with its value checks (the default) and with
``checked=False``, against SGLang's call. Each row also counts the output bytes (q_out, kv_out,
ring) in which the other configs and ``--before`` differ from ours. Beside SGLang's Triton kernel, its
JIT-compiled CUDA kernels ``fused_q_norm_rope`` + ``fused_norm_rope_inplace`` (``sglang-jit``: DeepSeek-V4's
target verify, through ``harness.adapters.sglang_jit.qk_bench_call``), graph and eager, with ours / them
(``graph_ours_over_sglang-jit``, ``eager_ours-wrapper_over_sglang-jit``); they need a CUDA GPU, nvcc, ninja and
the ``sglang-jit`` extra: elsewhere one line says what is missing, and rows they do not cover (decode) keep the
adapter's reason, said once; their columns are then NaN (``sglang-jit_refused``: why). Writes
DIR/qk_norm_rope_vs_sglang.csv. Without a GPU: the same path at whatever size is asked, under the
interpreter with wall-clock timers (a smoke test; the times mean nothing).
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

from cases.qk_norm_rope.bench_shape import D, EPS, R, ROPE_STYLE, reference_chain
from harness import usage
from harness.bench import perf
from harness.bench import perf_rows as pr
from harness.bench import wide_rows as wr
from reports.rows import PerfRow

OP = "qk_norm_rope"
IMPLS = ("fused", "reference", "compiled")
EXPECTED_LAUNCHES = {"fused": 1}
WARMUP_MS, REP_MS = 25, 100
GRAPH_REP_MS = 20  # do_bench_cudagraph's rep per graph timing
# measured beside IMPLS where installed (not in IMPLS): SGLang's own kernel (harness.adapters.sglang.qk_bench_calls)
PEERS = ("sglang-qk-norm-rope",)
EXTRA_TIMINGS = 0
L = 4  # tokens per request in a verify batch: 3 drafts + 1 bonus (cases.qk_norm_rope.catalog's verify entries)
B_FULL, H_FULL = (1, 8, 64), (8, 16, 32, 64)
B_QUICK, H_QUICK = (1, 64), (16, 64)


Shape = functools.partial(wr.VerifyShape, L=L, suffix=f",D={D}")  # Shape(B, H)


def shapes(quick: bool) -> list[wr.VerifyShape]:
    return [Shape(B, H) for B in (B_QUICK if quick else B_FULL) for H in (H_QUICK if quick else H_FULL)]


def bytes_moved(s: wr.VerifyShape) -> int:
    """q and q_out (T, H, D) bf16, kv and kv_out (T, D) bf16, positions (T) int64, the cos and sin
    rows (T, R/2) fp32, the kv weight (D) bf16."""
    T, H = s.T, s.H
    return 2 * T * H * D * 2 + 2 * T * D * 2 + T * 8 + 2 * T * (R // 2) * 4 + D * 2


# max_abs_diff: fused vs reference chain, q_out and kv_out (bf16 rounding: ~1e-2 at most)
# *_graph_us: replayed from a CUDA graph; sglang_*: SGLang's kernel (PEERS; NaN where not installed)
BenchRow = wr.wide_row_type(__name__, (("B", int), ("L", int), ("T", int), ("H", int), ("D", int), ("bytes_moved", int)),
                            (("max_abs_diff", float), ("fused_graph_us", float), ("sglang_us", float),
                             ("sglang_graph_us", float), ("sglang_over_fused_graph", float)))


def _implementations(kw: dict, compiled_chain) -> dict:
    """Zero-argument callables, each doing the whole op once on the same inputs."""
    from fused.qk_norm_rope import wrapper as f

    args = (kw["q"], kw["kv"], kw["kv_norm_weight"], kw["cos"], kw["sin"], kw["positions"])

    def fused():
        q_out = torch.empty_like(kw["q"])
        kv_out = torch.empty(kw["kv"].shape, dtype=kw["kv"].dtype, device=kw["kv"].device)
        f.launch(q_out=q_out, kv_out=kv_out, q=kw["q"], kv=kw["kv"], kv_norm_weight=kw["kv_norm_weight"],
                 q_norm_weight=None, eps=EPS, rope_dim=R, cos=kw["cos"], sin=kw["sin"], positions=kw["positions"],
                 rope_style=ROPE_STYLE)
        return q_out, kv_out

    return {"fused": fused, "reference": lambda: reference_chain(*args), "compiled": lambda: compiled_chain(*args)}


def _peers(kw: dict, dev) -> dict:
    """Peers' kernels on the same inputs (compiled devices only: the interpreter times nothing real)."""
    if dev.interpreted:
        return {}
    from harness.adapters import sglang

    return sglang.qk_bench_calls(kw)


def _inputs(s: wr.VerifyShape, dev) -> dict:
    from cases.qk_norm_rope import catalog as c

    case = c.QkNormRopeCase(T=s.T, H=s.H, D=D, R=R, rope_style=ROPE_STYLE, eps=EPS, seed=1000 * s.B + s.H,
                            name=s.case)
    return c.build_inputs(case, dev)


WIDE_CSV = "qk_norm_rope_bench.csv"


def measurements(shape_list: list[wr.VerifyShape], ctx: perf.Context):
    compiled_chain = perf.compile_static(reference_chain)
    for s in shape_list:
        kw = _inputs(s, ctx.dev)
        impls = _implementations(kw, compiled_chain)
        (qa, ka), (qb, kb) = impls["fused"](), impls["reference"]()
        diff = max(float((qa.float() - qb.float()).abs().max()), float((ka.float() - kb.float()).abs().max()))
        t = perf.measure(impls, ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS, graph_rep_ms=GRAPH_REP_MS)
        t.update(perf.measure(_peers(kw, ctx.dev), ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS,
                              graph_rep_ms=GRAPH_REP_MS))
        del kw, impls, qa, ka, qb, kb
        yield wr.Measured(s, t, bytes_moved(s), {"max_abs_diff": diff})


def wide_row(m: wr.Measured, rows: dict[str, PerfRow]) -> tuple[BenchRow, str]:
    s, diff, t = m.shape, m.extra["max_abs_diff"], m.timings
    peer = t.get(PEERS[0], pr.NOT_MEASURED)
    fused_g, peer_g = t["fused"].graph_us, peer.graph_us
    row = BenchRow(B=s.B, L=L, T=s.T, H=s.H, D=D, bytes_moved=m.bytes_moved, **wr.fused_vs_chain(m, rows["fused"]),
                   max_abs_diff=diff, fused_graph_us=fused_g, sglang_us=peer.p50_us,
                   sglang_graph_us=peer_g, sglang_over_fused_graph=pr.ratio(peer_g, fused_g))
    sglang = f" | graph fused {fused_g:6.2f} us, sglang {peer_g:6.2f} us (x{row.sglang_over_fused_graph:4.2f})"
    return row, f"{wr.fused_line(m, rows['fused'])} | max|Δ| {diff:.3g}{sglang if PEERS[0] in t else ''}"


def main(argv: list[str] | None = None) -> int:
    ap = usage.ArgumentParser(prog=f"python -m cases.{OP}.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for qk_norm_rope_bench.csv and perf.csv")
    ap.add_argument("--quick", action="store_true", help=f"B {B_QUICK} x H {H_QUICK} only")
    from cases.qk_norm_rope import bench_vs_sglang as vs

    vs.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.vs_sglang:
        return vs.vs_main(args)
    return perf.run_ops([sys.modules[__name__]], out=args.out, quick=args.quick, nested=False, prog=ap.prog)


# ----------------------------------------------------------------------------- wrapper checks

def wrapper_entries(dev, small: bool) -> list:
    """The fused wrappers' entries for ``harness.bench.wrapper_checks`` (host cost of their argument
    checks) on hot-path shapes; ``small``: the CPU's."""
    from cases.qk_norm_rope import catalog as c
    from fused.qk_norm_rope import wrapper as f
    from harness.bench.wrapper_checks import Entry
    from reference.qk_norm_rope import chain as r

    H, D, R, Ts = (4, 64, 32, (5, 64)) if small else (16, 512, 64, (5, 64, 1280))
    out = []
    for T in Ts:
        for mode in ("target_verify", "decode"):
            case = c.QkNormRopeCase(T=T, H=H, D=D, R=R, mode=mode, seed=T)

            def build(case=case, mode=mode):
                kw = c.build_inputs(case, dev)
                kw.pop("forward_mode")
                if mode != "decode":  # target-verify: no store in the launch
                    kw["ring"] = kw["loc"] = None
                return kw

            for checked in (True, False):  # value checks on (the default) / off (checked=False: no sync)
                out.append(Entry(OP, "fused.qk_norm_rope.wrapper", f"{mode},T={T},H={H},D={D}"
                                 + ("" if checked else ",checked=False"), build,
                                 functools.partial(f.qk_norm_rope, checked=checked),
                                 ((r, "validate", lambda kw, checked=checked: {**kw, "check_values": checked}),)))
    return out


if __name__ == "__main__":
    sys.exit(main())
