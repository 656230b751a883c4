"""Benchmark (not a test) of verify_tree_accept on a GPU: the fused one-launch kernel vs the
reference seven-launch chain vs torch.compile of that chain, side by side in one run.

    python -m cases.verify_tree_accept.bench --out DIR [--quick] [--b B ...] [--v V ...]

Shapes: B requests in 1..256, each an EAGLE-2 tree of top-k 8, 5 steps and N = 64 draft tokens
(S = 6: at most 5 accepted), vocabularies of the 32K and 152K classes (32,000 Llama-2, 151,936 Qwen;
``--v 128256`` for Llama-3's), bf16 logits as an LM head hands them over: a (B·N, V) slice of a
buffer whose rows are V + 128 wide (``wide_rows.lm_head_logits``). The tokens are planted so that
every request accepts a path as deep as its tree (``accept="all"``, the matching child anywhere in
its sibling list): the fused kernel reads the rows of that path, at most S of a request's N (the
chain takes the argmax of all B·N rows).

Per implementation: p20/p50/p80 (``harness.gpu.profiling.time_quantiles_us``), ratios to the
reference chain and to torch.compile of it, achieved bandwidth against the measured copy
bandwidth — the bytes are those the *op* must move, which for a tree walk are the rows of the
accepted path, not all B·N rows (``bytes_moved``; the chain's own traffic is larger by ~N/S) —
and the kernel launches of one call (``count_launches``). The fused kernel must be exactly 1
launch (else exit 1). SGLang's greedy tree verify (``PEER``: EAGLE's torch.argmax, then its Triton tree
kernel, ``harness.adapters.sglang.tree_bench_calls``) is timed beside them where sglang is installed, and
its outputs are compared with the chain's too (``sglang_mismatches``). Each shape also compares the fused outputs with the chain's
(``mismatches``: differing elements; a MISMATCH line when not 0). Writes
DIR/verify_tree_accept_bench.csv (wide, one row per shape) and DIR/perf.csv (PerfRow). Without a
GPU it says so and exits 0.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from harness.bench import perf
from harness.bench import perf_rows as pr
from harness.bench import wide_rows as wr
from reports.rows import PerfRow

OP = "verify_tree_accept"
IMPLS = ("fused", "reference", "compiled")
EXPECTED_LAUNCHES = {"fused": 1}
WARMUP_MS, REP_MS = 10, 50
EXTRA_TIMINGS = 0
TOPK, DEPTH, N = 8, 5, 64  # an EAGLE-2/3 tree as deployed
B_FULL, V_FULL = (1, 8, 64, 256), (32000, 151936)
PEER = "sglang-tree-greedy"
# the quick set (the nightly's bench step): one request at the largest vocabulary (one program walks it),
# a full batch at the largest
QUICK = ((1, 151936), (64, 151936))


@dataclass(frozen=True)
class Shape:
    B: int  # requests
    V: int  # vocabulary
    N: int = N

    @property
    def T(self) -> int:  # target rows
        return self.B * self.N

    @property
    def case(self) -> str:
        return f"B={self.B},N={self.N},V={self.V}"


def shapes(quick: bool, b: list[int] | None = None, v: list[int] | None = None) -> list[Shape]:
    """The benchmarked shapes (``wide_rows.batch_vocab_shapes``)."""
    return wr.batch_vocab_shapes(Shape, QUICK, B_FULL, V_FULL, quick, b, v)


def bytes_moved(s: Shape, path_rows: int) -> int:
    """The rows of the accepted paths (``path_rows`` in all) read once in bf16, the tree's four (B, N)
    int64 tensors read, predicts (B·N), accept_index (B, DEPTH + 1) and lengths (B,) int32 written."""
    return path_rows * s.V * 2 + 4 * s.T * 8 + s.T * 4 + s.B * (DEPTH + 1) * 4 + s.B * 4


# mismatches: fused vs the chain, elements of the three outputs (must be 0); path_rows: rows the walk reads;
# sglang_*: SGLang's tree verify (PEER; NaN, and -1 launches / mismatches, where it does not run)
BenchRow = wr.wide_row_type(__name__, (("B", int), ("N", int), ("V", int), ("T", int), ("bytes_moved", int)),
                            (("sglang_us", float), ("sglang_over_fused", float), ("sglang_launches", int),
                             ("sglang_mismatches", int), ("path_rows", int), ("mismatches", int)))


def _inputs(s: Shape, dev) -> dict:
    """Strided bf16 logits drawn on the device; EAGLE-2 trees with every request accepting as deep as
    its tree goes (the tokens planted against the device's argmax)."""
    from cases.verify_tree_accept import catalog as c

    logits = wr.lm_head_logits(s.T, s.V, seed=s.B * 1000 + s.V, device=dev)
    case = c.VerifyTreeAcceptCase(B=s.B, topk=TOPK, depth=DEPTH, N=s.N, V=s.V, accept="all", seed=s.B + s.V)
    tree = c.tree_tensors(case, torch.argmax(logits, dim=-1).cpu())
    return dict(target_logits=logits, **{k: t.to(dev) for k, t in tree.items()}, num_speculative_tokens=case.S)


def _implementations(kw: dict, compiled_chain) -> dict:
    """Zero-argument callables, each doing the whole op once on the same inputs (no validation:
    it copies the tree's faults to the host, a sync that is not the op)."""
    from cases.verify_tree_accept.spec import chain_body
    from fused.verify_tree_accept import wrapper as f
    from reference.verify_tree_accept import chain as r

    B, Nn = kw["candidates"].shape
    S = kw["num_speculative_tokens"]
    dev = kw["target_logits"].device
    tree = {k: kw[k] for k in ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")}

    def fused():
        out = dict(predicts=torch.empty((B * Nn,), dtype=r.OUT_DTYPE, device=dev),
                   accept_index=torch.empty((B, S), dtype=r.OUT_DTYPE, device=dev),
                   accept_token_num=torch.empty((B,), dtype=r.OUT_DTYPE, device=dev))
        f.launch(**out, target_logits=kw["target_logits"], **tree)
        return out["predicts"], out["accept_index"], out["accept_token_num"]

    args = (kw["target_logits"], *tree.values(), S)
    return {"fused": fused, "reference": lambda: chain_body(*args), "compiled": lambda: compiled_chain(*args)}


def _peers(kw: dict, dev) -> dict:
    """SGLang's tree verify on the same inputs (compiled devices only: the interpreter times nothing real)."""
    if dev.interpreted:
        return {}
    from harness.adapters import sglang

    return sglang.tree_bench_calls(kw)


WIDE_CSV = "verify_tree_accept_bench.csv"


def measurements(shape_list: list[Shape], ctx: perf.Context):
    from cases.verify_tree_accept.spec import chain_body

    compiled_chain = perf.compile_static(chain_body)
    for s in shape_list:
        kw = _inputs(s, ctx.dev.torch_device)
        impls = _implementations(kw, compiled_chain)
        fo, ro = impls["fused"](), impls["reference"]()
        bad = sum(int((a != b).sum()) for a, b in zip(fo, ro))
        path_rows = int((ro[1] >= 0).sum())
        peers = _peers(kw, ctx.dev)
        peer_bad = -1
        if peers:
            po = peers[PEER]()
            peer_bad = sum(int((po[k] != r).sum()) for k, r in zip(("predicts", "accept_index", "accept_token_num"), ro))
        t = perf.measure(impls, ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS)
        t.update(perf.measure(peers, ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS))
        del kw, impls, peers, fo, ro
        yield wr.Measured(s, t, bytes_moved(s, path_rows), {"mismatches": bad, "sglang_mismatches": peer_bad,
                                                            "path_rows": path_rows})


def wide_row(m: wr.Measured, rows: dict[str, PerfRow]) -> tuple[BenchRow, str]:
    s, bad, t = m.shape, m.extra["mismatches"], m.timings
    sgl, sgl_bad = t.get(PEER, pr.NOT_MEASURED), m.extra["sglang_mismatches"]
    row = BenchRow(B=s.B, N=s.N, V=s.V, T=s.T, bytes_moved=m.bytes_moved, **wr.fused_vs_chain(m, rows["fused"]),
                   sglang_us=sgl.p50_us, sglang_over_fused=pr.ratio(sgl.p50_us, t["fused"].p50_us),
                   sglang_launches=sgl.launches, sglang_mismatches=sgl_bad, path_rows=m.extra["path_rows"],
                   mismatches=bad)
    peer = (f" | sglang {sgl.p50_us:8.2f} us (launches {sgl.launches}, x{row.sglang_over_fused:5.2f} vs fused, "
            f"mismatches {sgl_bad})" if PEER in t else "")
    line = f"{wr.fused_line(m, rows['fused'])}{peer} | path rows {m.extra['path_rows']} | mismatches {bad}"
    line += wr.mismatch_line(s.case, bad) + wr.mismatch_line(s.case, sgl_bad, "SGLang's tree verify")
    return row, line


def main(argv: list[str] | None = None) -> int:
    return perf.main_for(sys.modules[__name__], argv, quick_help=f"(B, V) {QUICK} only",
                         options={"--b": f"batch sizes (default {B_FULL})", "--v": f"vocabularies (default {V_FULL})"},
                         pick=lambda args, ap: shapes(args.quick, args.b, args.v))


if __name__ == "__main__":
    sys.exit(main())
