"""Benchmark (not a test) of spec_sampling on a GPU: the fused one-launch kernel (uniforms given, and
drawing its own) vs the reference seven-launch chain vs torch.compile of that chain vs the engines'
samplers where they are installed (``PEERS``: vLLM's ``rejection_sample`` at temperature > 0, SGLang's
Triton ``chain_speculative_sampling_triton``), side by side in one run.

    python -m cases.spec_sampling.bench --out DIR [--quick] [--b B ...] [--v V ...]

Shapes: B requests in 1..256 × L = 4 drafts (L + 1 = 5 target rows each), vocabularies of the
32K / 128K / 152K classes (32,000 Llama-2, 128,256 Llama-3, 151,936 Qwen), bf16 logits as an LM head
hands them over (``wide_rows.lm_head_logits``: randn · 3, rows V + 128 wide), temperature 0.7, a
good drafter's q = softmax((logits + 0.5 · noise) / T) in fp32 and drafts drawn from q, so requests
stop at every position (``accept_hist``). The uniforms (B, L + 1) are drawn and moved at least 1e-4
from every decision boundary of the fp64 walk (``catalog.clear_of_boundaries``), so the fused kernel
must give the chain's ids exactly.

Implementations: ``fused`` (uniforms given: the exact contract), ``fused-seeded`` (its own Philox
uniforms from a seed, as an engine samples), ``reference`` (the chain's seven launches, no
validation), ``compiled`` (torch.compile of them), ``vllm-rejection-sampled``
(``harness.adapters.vllm.sampled_bench_calls``: vLLM's fp32 copy of the logits, its temperature
kernel, then ``rejection_sample`` with the draft-logits cache built beforehand, as its model runner
holds it; it draws its own randomness, so it has no mismatch count) and ``sglang-chain-sampling``
(``harness.adapters.sglang.sampling_bench_calls``: the softmax of logits / T, then SGLang's Triton
kernel with the uniforms as its coins; its outputs are compared with the chain's too).

Per implementation: p20/p50/p80 (``harness.gpu.profiling.time_quantiles_us``), ratios to the
reference chain and to torch.compile of it, achieved bandwidth against the copy bandwidth measured
in the same run — the bytes are those the *op* must move (``bytes_moved``): each request's target
rows up to the one where it stops, read once in bf16, the q row of a rejection in fp32, the drafts,
temperature and uniforms, the outputs; rows after a stop are never needed — and the kernel launches
of one call (``count_launches``). Both fused variants must be exactly 1 launch (else exit 1). Each
shape compares the fused outputs (uniforms given) with the chain's (``mismatches``: differing
elements of output_ids and accept_length; a MISMATCH line when not 0; SGLang's sampler likewise,
``sglang_mismatches``). Writes
DIR/spec_sampling_bench.csv (wide, one row per shape) and DIR/perf.csv (PerfRow). Without a GPU it
says so and exits 0.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch

from harness.bench import perf
from harness.bench import perf_rows as pr
from harness.bench import wide_rows as wr
from reports.rows import PerfRow

OP = "spec_sampling"
IMPLS = ("fused", "fused-seeded", "reference", "compiled")
EXPECTED_LAUNCHES = {"fused": 1, "fused-seeded": 1}
# measured beside IMPLS where installed (not in IMPLS): vLLM's and SGLang's samplers (harness.adapters)
PEERS = ("vllm-rejection-sampled", "sglang-chain-sampling")
WARMUP_MS, REP_MS = 10, 50
EXTRA_TIMINGS = 0
L = 4
TEMPERATURE, SCALE, DRAFT_NOISE = 0.7, 3.0, 0.5  # an LLM's peaked rows, a good drafter
SEED = 12345  # fused-seeded's Philox seed
B_FULL, V_FULL = (1, 8, 64, 256), (32000, 128256, 151936)
# the quick set (the nightly's bench step): one request at the largest vocabulary (one program streams
# it), a full batch there
QUICK = ((1, 151936), (256, 151936))


@dataclass(frozen=True)
class Shape(wr.ChainShape):
    L: int = L


def shapes(quick: bool, b: list[int] | None = None, v: list[int] | None = None) -> list[Shape]:
    """The benchmarked shapes (``wide_rows.batch_vocab_shapes``)."""
    return wr.batch_vocab_shapes(Shape, QUICK, B_FULL, V_FULL, quick, b, v)


def bytes_moved(s: Shape, accept_length) -> int:
    """What the op must move given each request's accepted drafts n_b: target rows 0..n_b read once in
    bf16 (p_j(x_j) needs row j's normaliser; the sample needs row n_b), q row n_b in fp32 where a draft
    was rejected (n_b < L; q_j(x_j) of the accepted drafts, one fp32 each), the drafts (B, L) int64,
    temperature (B,) and uniforms (B, L + 1) fp32 read; output_ids (B, L + 1) and accept_length (B,)
    int32 written."""
    n = np.asarray(accept_length, dtype=np.int64)
    rows = int((n + 1).sum())
    rejected = int((n < s.L).sum())
    return (rows * s.V * 2 + rejected * s.V * 4 + int(n.sum()) * 4 + s.B * s.L * 8 + s.B * 4 + s.T * 4
            + s.T * 4 + s.B * 4)


# mismatches: fused (uniforms given) vs the chain, elements of output_ids and accept_length (must be 0);
# rows_read: target rows the op needs (sum of n + 1); accept_hist: requests stopping at n = 0..L;
# vllm_*, sglang_*: the engines' samplers (PEERS; NaN, and -1 launches / mismatches, where not installed)
BenchRow = wr.wide_row_type(__name__, (("B", int), ("L", int), ("V", int), ("T", int), ("bytes_moved", int)),
                            (("fused_seeded_us", float), ("seeded_over_fused", float), ("vllm_us", float),
                             ("vllm_over_fused_seeded", float), ("vllm_launches", int), ("sglang_us", float),
                             ("sglang_over_fused", float), ("sglang_launches", int), ("sglang_mismatches", int),
                             ("rows_read", int), ("accept_hist", str), ("mismatches", int)))


def _inputs(s: Shape, dev) -> dict:
    """The op's keyword arguments on ``dev`` (module docstring): strided bf16 logits, q near the target,
    drafts drawn from q, uniforms clear of every boundary of the fp64 walk."""
    from cases.spec_sampling import catalog as c

    seed = s.B * 1000 + s.V
    logits = wr.lm_head_logits(s.T, s.V, seed=seed, device=dev, scale=SCALE).view(s.B, s.L + 1, s.V)
    t = torch.full((s.B,), TEMPERATURE, dtype=torch.float32, device=dev)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    noise = torch.randn(s.B, s.L, s.V, device=dev, generator=g)
    q = torch.softmax((logits[:, :s.L].float() + DRAFT_NOISE * noise) / TEMPERATURE, dim=-1).contiguous()
    del noise
    d = torch.multinomial(q.view(-1, s.V), 1, generator=g).view(s.B, s.L)
    p64 = torch.softmax(logits.double() / TEMPERATURE, dim=-1).cpu().numpy()  # the fp64 walk's p
    u = torch.rand(s.B, s.L + 1, generator=torch.Generator().manual_seed(seed + 2)).double().numpy()
    u = c.clear_of_boundaries(u, p64, q.double().cpu().numpy(), d.cpu().numpy())
    return {"target_logits": logits, "temperature": t, "draft_probs": q, "draft_tokens": d,
            "uniforms": torch.from_numpy(u).float().to(dev)}


def _chain(target_logits, temperature, draft_probs, draft_tokens, uniforms):
    """The reference chain's seven launches (what torch.compile gets); no validation."""
    from reference.spec_sampling import chain as r

    return r.sample_chain(r.target_probs(target_logits, temperature), draft_probs, draft_tokens, uniforms)


def _implementations(kw: dict, compiled_chain) -> dict:
    """Zero-argument callables, each doing the whole op once on the same inputs (no validation: it
    syncs the device to read the values, which is not the op)."""
    from fused.spec_sampling import wrapper as f
    from reference.spec_sampling import chain as r

    B, L = kw["draft_tokens"].shape
    dev = kw["target_logits"].device

    def fused(uniforms, seed):
        def run():
            out = torch.empty((B, L + 1), dtype=r.OUT_DTYPE, device=dev)
            n = torch.empty((B,), dtype=r.OUT_DTYPE, device=dev)
            f.launch(output_ids=out, accept_length=n, **{**kw, "uniforms": uniforms}, seed=seed)
            return out, n
        return run

    args = tuple(kw[k] for k in ("target_logits", "temperature", "draft_probs", "draft_tokens", "uniforms"))
    return {"fused": fused(kw["uniforms"], None), "fused-seeded": fused(None, SEED),
            "reference": lambda: _chain(*args), "compiled": lambda: compiled_chain(*args)}


def _peers(kw: dict, dev) -> dict:
    """Peers' kernels on the same inputs (compiled devices only: the interpreter times nothing real)."""
    if dev.interpreted:
        return {}
    from harness.adapters import sglang, vllm

    return {**vllm.sampled_bench_calls(kw), **sglang.sampling_bench_calls(kw)}


def _peer_mismatches(kw: dict, chain: tuple) -> int:
    """SGLang's sampler (uniforms given) against the chain's outputs: differing elements (under the
    interpreter too: a comparison, not a timing); -1 where sglang is not installed."""
    from harness.adapters import sglang

    if not sglang.sampling_bench_calls(kw):
        return -1
    out = sglang.chain_sampling(**kw)
    return int((out["output_ids"] != chain[0]).sum()) + int((out["accept_length"] != chain[1]).sum())


WIDE_CSV = "spec_sampling_bench.csv"


def measurements(shape_list: list[Shape], ctx: perf.Context):
    compiled_chain = perf.compile_static(_chain)
    for s in shape_list:
        kw = _inputs(s, ctx.dev.torch_device)
        impls = _implementations(kw, compiled_chain)
        (fo, fn), (ro, rn) = impls["fused"](), impls["reference"]()
        bad = int((fo != ro).sum()) + int((fn != rn).sum())
        peer_bad = _peer_mismatches(kw, (ro, rn))
        n = rn.cpu().numpy()
        t = perf.measure(impls, ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS)
        t.update(perf.measure(_peers(kw, ctx.dev), ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS))
        del kw, impls, fo, fn, ro, rn
        if not ctx.dev.interpreted:
            torch.cuda.empty_cache()
        hist = "/".join(str(int(k)) for k in np.bincount(n, minlength=s.L + 1))
        yield wr.Measured(s, t, bytes_moved(s, n), {"mismatches": bad, "sglang_mismatches": peer_bad,
                                                    "rows_read": int((n + 1).sum()), "accept_hist": hist})


def wide_row(m: wr.Measured, rows: dict[str, PerfRow]) -> tuple[BenchRow, str]:
    s, bad, t = m.shape, m.extra["mismatches"], m.timings
    seeded, peer, sgl = t["fused-seeded"], t.get(PEERS[0], pr.NOT_MEASURED), t.get(PEERS[1], pr.NOT_MEASURED)
    sgl_bad = m.extra["sglang_mismatches"]
    row = BenchRow(B=s.B, L=s.L, V=s.V, T=s.T, bytes_moved=m.bytes_moved, **wr.fused_vs_chain(m, rows["fused"]),
                   fused_seeded_us=seeded.p50_us, seeded_over_fused=pr.ratio(seeded.p50_us, t["fused"].p50_us),
                   vllm_us=peer.p50_us, vllm_over_fused_seeded=pr.ratio(peer.p50_us, seeded.p50_us),
                   vllm_launches=peer.launches, sglang_us=sgl.p50_us, sglang_over_fused=pr.ratio(sgl.p50_us,
                                                                                                t["fused"].p50_us),
                   sglang_launches=sgl.launches, sglang_mismatches=sgl_bad, rows_read=m.extra["rows_read"],
                   accept_hist=m.extra["accept_hist"], mismatches=bad)
    vllm = (f" | vllm {peer.p50_us:8.2f} us (launches {peer.launches}, x{row.vllm_over_fused_seeded:5.2f} vs "
            f"fused-seeded)" if PEERS[0] in t else "")
    vllm += (f" | sglang {sgl.p50_us:8.2f} us (launches {sgl.launches}, x{row.sglang_over_fused:5.2f} vs fused, "
             f"mismatches {sgl_bad})" if PEERS[1] in t else "")
    line = (f"{wr.fused_line(m, rows['fused'])} | seeded {seeded.p50_us:7.2f} us{vllm} | stops n=0..{s.L} "
            f"{m.extra['accept_hist']} | mismatches {bad}")
    line += wr.mismatch_line(s.case, bad) + wr.mismatch_line(s.case, sgl_bad, "SGLang's sampler")
    return row, line


def main(argv: list[str] | None = None) -> int:
    return perf.main_for(sys.modules[__name__], argv, quick_help=f"(B, V) {QUICK} only",
                         options={"--b": f"batch sizes (default {B_FULL})", "--v": f"vocabularies (default {V_FULL})"},
                         pick=lambda args, ap: shapes(args.quick, args.b, args.v))


if __name__ == "__main__":
    sys.exit(main())
