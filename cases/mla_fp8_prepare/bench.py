"""Benchmark (not a test) of mla_fp8_prepare on a GPU: the fused kernel vs the reference chain
vs torch.compile of the chain vs the plain aten chain of the seed, side by side in one run.

    python -m cases.mla_fp8_prepare.bench --out runs/bench-mla [--quick] [--b B ...] [--h H ...]

Shapes: Kimi-K3 absorbed MLA (Dn 512, R 64), verify batches B in 1..64 with L = 4 tokens per
request (T = B·L), local heads H in 8..64, kv_descale 0.37 (1.0 for the aten chain, which
has none), strided inputs as the model hands them over, a pool of max(4·T, 4096) rows.

Per implementation, eager: p20/p50/p80 (``harness.gpu.profiling.time_quantiles_us``, the host's
launch path included); replayed from a CUDA graph: the median (``harness.gpu.profiling.graph_time_us``,
the device's time: what a captured decode step pays; an impl that cannot be captured is said and
its graph numbers are NaN). Ratios to the fused kernel in both modes, achieved bandwidth (bytes the op must move: read q and k in bf16 + loc, write q8
and the KV rows in fp8) against the measured device-to-device copy bandwidth, and the kernel
launches of one call (``count_launches``). The fused kernel must be exactly 1 launch; the
script exits 1 otherwise. Writes DIR/bench.csv (wide, one row per shape: the eager columns, then
the ``*_graph_*`` ones), DIR/meta.json, DIR/perf.csv (PerfRow, ``mode`` eager and graph) and
DIR/table.csv (``harness.bench.perf_rows.table``, also printed). Without a GPU it says so and exits 0.

Beside them, where this machine runs it (``PEERS``): SGLang's JIT-compiled CUDA kernel
``set_mla_kv_concat_q_fp8`` (``harness.adapters.sglang_jit.fp8_bench_call``: the adapter's loading, gate
and physical rows), eager and graph-replayed, with ours over it (``fused_over_sglang_jit``, ``_graph``;
< 1: ours faster). It has no k scale (SGLang's fp8 MLA path has none): it casts k unscaled, as ``aten5``
does, on the same tensors and its own copy of the pool; its q8 is allocated per call, as SGLang's call
does. It needs a CUDA GPU of SM90+, nvcc, ninja and the ``sglang-jit`` extra; elsewhere (the CPU, ROCm)
one line of the plan says what is missing and its columns are NaN with that reason
(``sglang_jit_refused``); a shape its gate declines keeps the gate's reason there, said once.
"""
from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.bench import perf
from harness.bench import perf_rows as pr
from harness.bench import wide_rows as wr
from reports.rows import PerfRow

OP = "mla_fp8_prepare"
IMPLS = ("fused", "reference", "compiled", "aten5")
EXPECTED_LAUNCHES = {"fused": 1}
WARMUP_MS, REP_MS = 25, 100
GRAPH_REP_MS = 20  # do_bench_cudagraph's rep per graph timing
EXTRA_TIMINGS = 0
# measured beside IMPLS where this machine runs it (not in IMPLS): SGLang's JIT-compiled CUDA kernel
JIT = "sglang-jit-fp8-prepare"
PEERS = (JIT,)
B_FULL, H_FULL = (1, 8, 64), (8, 16, 32, 64)
B_QUICK, H_QUICK = (1, 64), (16, 64)
L = 4
DN, R = 512, 64
KV_DESCALE = 0.37


Shape = functools.partial(wr.VerifyShape, L=L)  # Shape(B, H)


def shapes(quick: bool, b: list[int] | None = None, h: list[int] | None = None) -> list[wr.VerifyShape]:
    """The benchmarked shapes; ``b`` / ``h`` replace the profile's batch / head lists."""
    return [Shape(B, H) for B in (b or (B_QUICK if quick else B_FULL)) for H in (h or (H_QUICK if quick else H_FULL))]


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
    fused_graph_us: float  # replayed from a CUDA graph (median); NaN: not captured
    reference_graph_us: float
    compiled_graph_us: float
    aten5_graph_us: float
    reference_over_fused_graph: float
    compiled_over_fused_graph: float
    aten5_over_fused_graph: float
    fused_graph_frac_of_copy: float
    sglang_jit_us: float  # SGLang's JIT CUDA kernel (PEERS), p50; NaN where not measured (sglang_jit_refused)
    sglang_jit_graph_us: float
    fused_over_sglang_jit: float  # ours / it, eager p50; < 1: ours faster
    fused_over_sglang_jit_graph: float
    sglang_jit_refused: str  # why it was not measured here ("" when it was)


def _inputs(T: int, H: int, dev, fp8_dtype=torch.float8_e4m3fn) -> dict:
    """Model layouts: q_nope a transposed bmm output, q_rope a slice, k_nope/k_rope slices of kv_a."""
    g = torch.Generator(device=dev).manual_seed(T * 1000 + H)
    q_nope = torch.randn(H, T, DN, device=dev, generator=g).bfloat16().transpose(0, 1)  # (T, H, DN) strided
    q_rope = torch.randn(T, H, 128 + R, device=dev, generator=g).bfloat16()[..., 128:]  # (T, H, R) strided
    kv_a = torch.randn(T, DN + R, device=dev, generator=g).bfloat16()
    S = max(4 * T, 4096)
    return dict(q_nope=q_nope, q_rope=q_rope, k_nope=kv_a[:, :DN], k_rope=kv_a[:, DN:],
                kv_buffer=torch.zeros(S, DN + R, dtype=fp8_dtype, device=dev),
                loc=torch.randperm(S - 1, device=dev)[:T] + 1)


def _bytes_moved(T: int, H: int) -> int:
    return T * H * (DN + R) * 2 + T * (DN + R) * 2 + T * 8 + T * H * (DN + R) + T * (DN + R)


def _implementations(kw: dict, compiled_chain):
    """Zero-argument callables, each doing the whole op once on the same inputs (no validation:
    validation syncs the device and is not part of the op)."""
    from fused.mla_fp8_prepare import wrapper as f
    from reference.mla_fp8_prepare import chain as r

    dev = kw["kv_buffer"].device
    k_mul = f.k_mul_tensor(KV_DESCALE, dev)
    inv = torch.tensor(r.inv_descale(KV_DESCALE), dtype=torch.float32, device=dev)
    T, H = kw["q_nope"].shape[:2]
    q8 = torch.empty(T, H, DN + R, dtype=kw["kv_buffer"].dtype, device=dev)

    def fused():
        f.launch(q8=q8, k_mul=k_mul, **kw)

    def reference():  # _chain eager: the reference's launches (the descale already on device)
        _chain(kw["q_nope"], kw["q_rope"], kw["k_nope"], kw["k_rope"], kw["kv_buffer"], kw["loc"], inv)

    def compiled():  # torch.compile of _chain
        compiled_chain(kw["q_nope"], kw["q_rope"], kw["k_nope"], kw["k_rope"], kw["kv_buffer"], kw["loc"], inv)

    def aten5():  # the seed's fallback: concat, three aten casts, scatter (no descale, torch's own overflow)
        dt = kw["kv_buffer"].dtype
        q = torch.cat((kw["q_nope"], kw["q_rope"]), dim=-1).to(dt)
        kn, kr = kw["k_nope"].to(dt), kw["k_rope"].to(dt)
        buf = kw["kv_buffer"].view(torch.uint8)  # bytes: fp8 index_put is not on every build
        buf[kw["loc"], :DN] = kn.view(torch.uint8)
        buf[kw["loc"], DN:] = kr.view(torch.uint8)
        return q

    return {"fused": fused, "reference": reference, "compiled": compiled, "aten5": aten5}


def _chain(q_nope, q_rope, k_nope, k_rope, kv_buffer, loc, inv):
    """The reference chain (``reference.mla_fp8_prepare.chain``'s concat, casts and scatter), its scatter a
    plain index_put on ``loc``: the benchmark's loc has no padding, so it writes the rows
    ``reference.scatter_kv`` writes, without that function's ``loc >= 0`` mask, whose boolean
    indexing syncs the host and so could not be captured in a CUDA graph (nor by a model's)."""
    from reference.mla_fp8_prepare import chain as r

    q8 = r.cast_fp8(r.concat_q(q_nope, q_rope), kv_buffer.dtype, "saturate")
    kn = r.cast_fp8(k_nope, kv_buffer.dtype, "saturate", inv)
    kr = r.cast_fp8(k_rope, kv_buffer.dtype, "saturate", inv)
    rows = torch.cat((kn.view(torch.uint8), kr.view(torch.uint8)), dim=-1)
    kv_buffer.view(torch.uint8)[loc] = rows  # bytes: fp8 index_put is not on every build
    return q8


def _compiled_chain():
    return perf.compile_static(_chain)


def refused_peers() -> dict[str, str]:
    """{peer: the one line saying what this machine lacks to run it} (``harness.adapters.sglang_jit.missing``);
    the plan prints it, and those peers' columns are NaN with that reason."""
    from harness.adapters import sglang_jit

    lacks = sglang_jit.missing("fp8")
    return {JIT: lacks} if lacks else {}


def jit_call(kw: dict) -> Callable[[], object] | str:
    """SGLang's ``set_mla_kv_concat_q_fp8`` on the shape's tensors, given to the adapter as the op's inputs
    without a k scale (``fp8_bench_call``; its own copy of the pool): a zero-argument callable, or the one-line
    reason it is not measured (a first call that raises is such a reason too, never the bench's error)."""
    from harness.adapters import sglang_jit

    inputs = {**{k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope")}, "kv_buffer": kw["kv_buffer"].clone(),
              "out_cache_loc": kw["loc"], "slot_map": None, "fp8_policy": "saturate", "kv_descale": None,
              "save_kv_cache": True}
    try:
        return sglang_jit.fp8_bench_call(inputs)
    except Exception as exc:  # noqa: BLE001 - a build or launch failure: said in its row, the rest still runs
        return f"the first call raised {type(exc).__name__}: {str(exc)[:200]}"


WIDE_CSV = "bench.csv"


def measurements(shape_list: list[wr.VerifyShape], ctx: perf.Context):
    compiled_chain = _compiled_chain()
    lacks = refused_peers().get(JIT, "")  # said once by the plan
    said = {lacks}
    for s in shape_list:
        kw = _inputs(s.T, s.H, ctx.dev.torch_device, ctx.dev.fp8_dtype)
        impls = _implementations(kw, compiled_chain)
        jit = lacks or jit_call(kw)
        if isinstance(jit, str):
            if jit not in said:
                print(f"  {JIT}: not measured from {s.case} on: {jit}", flush=True)
                said.add(jit)
        else:
            impls[JIT] = jit
        t = perf.measure(impls, ctx.dev, warmup_ms=WARMUP_MS, rep_ms=REP_MS, graph_rep_ms=GRAPH_REP_MS)
        del kw, impls
        yield wr.Measured(s, t, _bytes_moved(s.T, s.H), {"copy_gbps": ctx.copy_gbps,
                                                          "jit_refused": jit if isinstance(jit, str) else ""})


def wide_row(m: wr.Measured, rows: dict[str, PerfRow]) -> tuple[BenchRow, str]:
    s, t, fused = m.shape, m.timings, rows["fused"]
    aten5_over_fused = pr.ratio(t["aten5"].p50_us, t["fused"].p50_us)
    g = {impl: t[impl].graph_us for impl in IMPLS}
    graph_over = {impl: pr.ratio(g[impl], g["fused"]) for impl in IMPLS if impl != "fused"}
    frac = pr.bandwidth(m.bytes_moved, g["fused"], m.extra["copy_gbps"])[1]
    jit = t.get(JIT, pr.NOT_MEASURED)
    jit_cols = {"sglang_jit_us": jit.p50_us, "sglang_jit_graph_us": jit.graph_us,
                "fused_over_sglang_jit": pr.ratio(t["fused"].p50_us, jit.p50_us),
                "fused_over_sglang_jit_graph": pr.ratio(g["fused"], jit.graph_us),
                "sglang_jit_refused": m.extra["jit_refused"]}
    row = BenchRow(B=s.B, L=L, T=s.T, H=s.H, bytes_moved=m.bytes_moved, aten5_us=t["aten5"].p50_us,
                   aten5_over_fused=aten5_over_fused, aten5_launches=t["aten5"].launches,
                   **wr.fused_vs_chain(m, fused),
                   **{f"{impl}_graph_us": g[impl] for impl in IMPLS},
                   **{f"{impl}_over_fused_graph": x for impl, x in graph_over.items()},
                   fused_graph_frac_of_copy=frac, **jit_cols)
    graph = (f"graph: fused {g['fused']:7.2f} us ({frac:5.1%} of copy) | "
             + " | ".join(f"x{x:5.2f} vs {impl}" for impl, x in graph_over.items()))
    if JIT in t:
        graph += (f"\n    {JIT}: graph {jit.graph_us:7.2f} us, eager {jit.p50_us:7.2f} us | fused/it graph "
                  f"{row.fused_over_sglang_jit_graph:5.2f}, eager {row.fused_over_sglang_jit:5.2f}")
    return row, f"{wr.fused_line(m, fused)} | x{aten5_over_fused:5.2f} vs aten5\n    {graph}"


def finish(out: Path, ctx: perf.Context) -> None:
    """meta.json beside bench.csv: the device and versions of the run."""
    (out / "meta.json").write_text(json.dumps({"device": ctx.dev.name, "arch": ctx.dev.arch,
                                               "copy_gbps": ctx.copy_gbps, "torch": ctx.prov.torch,
                                               "triton": ctx.prov.triton, "git_sha": ctx.prov.git_sha}, indent=2))


def main(argv: list[str] | None = None) -> int:
    return perf.main_for(sys.modules[__name__], argv, quick_help=f"B {B_QUICK} x H {H_QUICK} only",
                         options={"--b": f"batch sizes (default {B_FULL})",
                                  "--h": f"local head counts (default {H_FULL})"},
                         pick=lambda args, ap: shapes(args.quick, args.b, args.h))


# ----------------------------------------------------------------------------- wrapper checks

def wrapper_entries(dev, small: bool) -> list:
    """The fused wrappers' entries for ``harness.bench.wrapper_checks`` (host cost of their argument
    checks) on hot-path shapes; ``small``: the CPU's."""
    from cases.mla_fp8_prepare import catalog as c
    from fused.mla_fp8_prepare import wrapper as f
    from harness.bench.wrapper_checks import Entry
    from reference.mla_fp8_prepare import chain as r

    T, H, Dn, R = (8, 4, 64, 16) if small else (256, 64, 512, 64)  # B 64 x L 4
    case = c.MlaFp8PrepareCase(T=T, H=H, Dn=Dn, R=R, kv_descale=0.37, specials=0.0, seed=1)
    step_args = ("out_cache_loc", "slot_map", "decode_kernel_loc", "save_kv_cache", "fused_switch")

    def build_kernel():
        kw = c.build_inputs(case, dev)
        kw["loc"] = kw["decode_kernel_loc"]
        return {k: v for k, v in kw.items() if k not in step_args}

    def step_validate_args(kw):  # validate on the rows the kernel writes (the step resolves decode_kernel_loc)
        return {k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "kv_descale", "fp8_policy")} \
            | {"loc": kw["decode_kernel_loc"]}

    # the step checks the data tensors before it asks covered() about them (a checkout older than
    # validate_tensors has no such call)
    tensors_args = lambda kw: {k: v for k, v in step_validate_args(kw).items() if k != "loc"}  # noqa: E731
    tensors_first = ((r, "validate_tensors", tensors_args),) if hasattr(r, "validate_tensors") else ()
    shape = f"T={T},H={H},Dn={Dn},R={R}"
    return [
        Entry(OP, "fused.mla_fp8_prepare.wrapper", shape, build_kernel, f.mla_fp8_prepare,
              ((r, "validate", lambda kw: kw),)),
        Entry(OP, "fused.mla_fp8_prepare_step", shape, lambda: c.build_inputs(case, dev),
              f.mla_fp8_prepare_step,
              ((r, "validate_pool", lambda kw: {k: kw[k] for k in ("kv_buffer", "out_cache_loc", "slot_map",
                                                                     "decode_kernel_loc")}),
               *tensors_first, (r, "validate", step_validate_args))),
    ]


if __name__ == "__main__":
    sys.exit(main())
