"""Benchmark (not a test) of verify_accept on a GPU: the fused kernels (two launches: the split-V
argmax, then the combine and the walk) vs the reference six-launch chain vs torch.compile of that
chain, side by side in one run, eager and replayed from a CUDA graph.

    python -m cases.verify_accept.bench --out DIR [--quick] [--b B ...] [--v V ...]
        [--before OLD/fused/verify_accept/wrapper.py]

Shapes: B requests in 1..256 × L = 4 drafts (L + 1 = 5 target rows each), vocabularies of the
32K / 160K / 256K classes (32,000 Llama-2, 160,000, 256,000), bf16 logits as an LM head hands them
over: a (B·(L + 1), V) slice of a buffer whose rows are V + 128 wide (row stride > V;
``wide_rows.lm_head_logits``). Every draft is the target's argmax, so every request accepts all L
drafts (every implementation reads every row).

Per implementation: p20/p50/p80 (``harness.gpu.profiling.time_quantiles_us``), the median replayed
from a CUDA graph (``graph_time_us``), ratios to the reference chain and to torch.compile of it,
achieved bandwidth (bytes the op must move: read the logits once in bf16, the drafts and qo_indptr;
write the ids and lengths) against the device-to-device copy bandwidth measured in the same run,
and the kernel launches of one call (``count_launches``). The fused call must be exactly 2 launches
(else exit 1). ``--before``: an earlier tree's fused/verify_accept/wrapper.py (``harness.bench.before``;
e.g. the one-program-per-request kernel of trees up to 5f017f8 (2026-12-07)) timed as ``before`` beside ours.
vLLM's greedy verify (``PEER``: ``rejection_sample`` at temperature 0, its index tensors built once, as
its model runner holds them; ``harness.adapters.vllm.greedy_bench_calls``) is timed beside them, eager and
replayed, where vllm is installed. Each shape also compares the fused outputs (and ``--before``'s, and
vLLM's: ``vllm_mismatches``) with the chain's (``mismatches``: differing elements; a MISMATCH line when
not 0). Writes DIR/verify_accept_bench.csv (wide, one row
per shape) and DIR/perf.csv (PerfRow). Without a GPU it says so and exits 0.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import usage
from harness.bench import perf
from harness.bench import perf_rows as pr
from harness.bench import wide_rows as wr
from reports.rows import PerfRow

OP = "verify_accept"
IMPLS = ("fused", "reference", "compiled")
EXPECTED_LAUNCHES = {"fused": 2}
WARMUP_MS, REP_MS = 10, 50
GRAPH_REP_MS = 20  # do_bench_cudagraph's rep per graph timing
EXTRA_TIMINGS = 0
L = 4
B_FULL, V_FULL = (1, 64, 256), (32000, 160000, 256000)
# the quick set (the nightly's bench step): one request at the largest vocabulary (one program streams
# it all), a full batch at both ends; 3 shapes, so every op's quick plan together stays within
# harness.bench.perf.QUICK_BUDGET_S (4 shapes here: 123 s modelled against its 120)
QUICK = ((1, 160000), (64, 32000), (64, 160000))


@dataclass(frozen=True)
class Shape(wr.ChainShape):
    L: int = L


def shapes(quick: bool, b: list[int] | None = None, v: list[int] | None = None) -> list[Shape]:
    """The benchmarked shapes (``wide_rows.batch_vocab_shapes``)."""
    return wr.batch_vocab_shapes(Shape, QUICK, B_FULL, V_FULL, quick, b, v)


def bytes_moved(s: Shape) -> int:
    """Logits (T, V) bf16 read once, drafts (B·L) int64, qo_indptr (B + 1) int32, output ids
    (B, L + 1) and lengths (B,) int32 written."""
    return s.T * s.V * 2 + s.B * s.L * 8 + (s.B + 1) * 4 + s.B * (s.L + 1) * 4 + s.B * 4


# mismatches: fused (and --before's) vs the chain, elements of output_ids and accept_length (must be 0);
# *_graph_us: replayed from a CUDA graph; before_*: --before's kernel (NaN when not asked)
# vllm_*: vLLM's greedy verify (PEER, its adapter's rejection_sample at temperature 0; NaN, and -1 launches /
# mismatches, where vllm is not installed); vllm_mismatches: its outputs against the chain's
BenchRow = wr.wide_row_type(__name__, (("B", int), ("L", int), ("V", int), ("T", int), ("bytes_moved", int)),
                            (("mismatches", int), ("fused_graph_us", float), ("compiled_graph_us", float),
                             ("before_us", float), ("before_graph_us", float), ("vllm_us", float),
                             ("vllm_graph_us", float), ("vllm_launches", int), ("vllm_mismatches", int)))
PEER = "vllm-rejection-greedy"

# --before's module (harness.bench.before.load_module), set by main for the run's measurements
before_modules: list = []


def _inputs(s: Shape, dev) -> dict:
    """Strided bf16 logits, every draft the target's argmax (all accepted), qo_indptr of L + 1 rows each."""
    logits = wr.lm_head_logits(s.T, s.V, seed=s.B * 1000 + s.V, device=dev)
    target = torch.argmax(logits, dim=-1).view(s.B, s.L + 1)
    return dict(target_logits=logits, draft_tokens=target[:, :s.L].contiguous().flatten(),
                qo_indptr=torch.arange(0, s.T + 1, s.L + 1, dtype=torch.int32, device=dev))


def _chain(target_logits, drafts, qo_indptr):
    """The reference chain's six launches (what torch.compile gets); no validation."""
    from reference.verify_accept import chain as r

    rows, real = r.request_rows(qo_indptr, drafts.shape[1])
    target = r.gather_targets(r.row_argmax(target_logits), rows, real)
    n = r.accept_lengths(r.match(target, drafts), real)
    return r.output_ids(drafts, r.bonus_tokens(target, n), n, real), n


def _implementations(kw: dict, compiled_chain) -> dict:
    """Zero-argument callables, each doing the whole op once on the same inputs (no validation:
    it copies qo_indptr and the drafts' range to the host, a sync that is not the op)."""
    from fused.verify_accept import wrapper as f
    from reference.verify_accept import chain as r

    B = kw["qo_indptr"].shape[0] - 1
    drafts = kw["draft_tokens"].view(B, -1)
    dev = kw["target_logits"].device

    def call(mod):
        def run():
            out = torch.empty((B, drafts.shape[1] + 1), dtype=r.OUT_DTYPE, device=dev)
            n = torch.empty((B,), dtype=r.OUT_DTYPE, device=dev)
            mod.launch(output_ids=out, accept_length=n, **kw)
            return out, n
        return run

    args = (kw["target_logits"], drafts, kw["qo_indptr"])
    impls = {"fused": call(f), "reference": lambda: _chain(*args), "compiled": lambda: compiled_chain(*args)}
    if before_modules:
        impls["before"] = call(before_modules[0])
    return impls


WIDE_CSV = "verify_accept_bench.csv"


def measurements(shape_list: list[Shape], ctx: perf.Context):
    compiled_chain = perf.compile_static(_chain)
    for s in shape_list:
        kw = _inputs(s, ctx.dev.torch_device)
        impls = _implementations(kw, compiled_chain)
        ro, rn = impls["reference"]()
        bad = sum(int((o != ro).sum()) + int((n != rn).sum())
                  for o, n in (impls[k]() for k in ("fused", "before") if k in impls))
        peers = _peers(kw, ctx.dev)
        peer_bad = -1
        if peers:
            from harness.adapters import vllm

            po = vllm.rejection_greedy(**kw)
            peer_bad = int((po["output_ids"] != ro).sum()) + int((po["accept_length"] != rn).sum())
        t = perf.measure(impls, ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS, graph_rep_ms=GRAPH_REP_MS)
        t.update(perf.measure(peers, ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS, graph_rep_ms=GRAPH_REP_MS))
        del kw, impls, peers, ro, rn
        yield wr.Measured(s, t, bytes_moved(s), {"mismatches": bad, "vllm_mismatches": peer_bad})


def _peers(kw: dict, dev) -> dict:
    """vLLM's greedy verify on the same inputs (compiled devices only: the interpreter times nothing real)."""
    if dev.interpreted:
        return {}
    from harness.adapters import vllm

    return vllm.greedy_bench_calls(kw)


def wide_row(m: wr.Measured, rows: dict[str, PerfRow]) -> tuple[BenchRow, str]:
    s, bad, t = m.shape, m.extra["mismatches"], m.timings
    before, peer, peer_bad = t.get("before", pr.NOT_MEASURED), t.get(PEER, pr.NOT_MEASURED), m.extra["vllm_mismatches"]
    row = BenchRow(B=s.B, L=s.L, V=s.V, T=s.T, bytes_moved=m.bytes_moved, **wr.fused_vs_chain(m, rows["fused"]),
                   mismatches=bad, fused_graph_us=t["fused"].graph_us, compiled_graph_us=t["compiled"].graph_us,
                   before_us=before.p50_us, before_graph_us=before.graph_us, vllm_us=peer.p50_us,
                   vllm_graph_us=peer.graph_us, vllm_launches=peer.launches, vllm_mismatches=peer_bad)
    line = (f"{wr.fused_line(m, rows['fused'])} | graph fused {t['fused'].graph_us:7.2f} us, compiled "
            f"{t['compiled'].graph_us:7.2f} us" + (f", before {before.graph_us:7.2f} us" if "before" in t else "")
            + (f", vllm {peer.graph_us:7.2f} us (eager {peer.p50_us:7.2f}, launches {peer.launches}, mismatches "
               f"{peer_bad})" if PEER in t else "") + f" | mismatches {bad}")
    line += wr.mismatch_line(s.case, bad) + wr.mismatch_line(s.case, peer_bad, "vLLM's greedy verify")
    return row, line


def main(argv: list[str] | None = None) -> int:
    ap = usage.ArgumentParser(prog=f"python -m cases.{OP}.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help=f"directory for {WIDE_CSV} and perf.csv")
    ap.add_argument("--quick", action="store_true", help=f"(B, V) {QUICK} only")
    ap.add_argument("--b", type=usage.positive_int, action="append", help=f"batch sizes (default {B_FULL})")
    ap.add_argument("--v", type=usage.positive_int, action="append", help=f"vocabularies (default {V_FULL})")
    ap.add_argument("--before", type=Path, help="another fused/verify_accept/wrapper.py (e.g. an earlier commit's): "
                                                "timed as 'before' beside ours")
    args = ap.parse_args(argv)
    if args.before is not None:
        from harness.bench import before

        if not args.before.is_file():
            ap.error(f"--before: no file {args.before}")
        before_modules[:] = [before.load_module(args.before)]
    try:
        return perf.run_ops([sys.modules[__name__]], out=args.out, quick=args.quick, nested=False, prog=ap.prog,
                            shapes={OP: shapes(args.quick, args.b, args.v)})
    finally:
        before_modules.clear()


if __name__ == "__main__":
    sys.exit(main())
