"""``python -m cases.qk_norm_rope.bench --vs-sglang``: ours against SGLang's own
``fused_qk_norm_rope_swa_store`` (``harness.adapters.sglang.load``) and its JIT-compiled CUDA kernels
``fused_q_norm_rope`` + ``fused_norm_rope_inplace`` (``harness.adapters.sglang_jit.qk_bench_call``: the
adapter's loading, gate and translation), graph-replayed and eager, on DeepSeek-V4 shapes (the flags and the
table: ``cases.qk_norm_rope.bench``'s docstring), each row with the output bytes in which the other configs,
``--before`` and SGLang's Triton kernel differ from ours.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import triton
import triton.language as tl

from harness import usage
from harness.bench import before as before_module
from harness.bench.perf_rows import ratio
from cases.qk_norm_rope.bench_shape import D, EPS, R, ROPE_STYLE, reference_chain

VS_T = (1, 5, 16, 64, 320, 1280, 4096)
VS_H = (8, 16, 32, 128)
VS_MODES = ("verify", "decode")  # decode: the in-kernel bf16 ring store (both kernels)
VS_MAX_POS = 8192
# graph columns that are not the op (their % of copy bandwidth is not printed)
NOT_THE_OP = ("floor",)
JIT = "sglang-jit"  # SGLang's JIT-compiled CUDA kernels (harness.adapters.sglang_jit), verify mode only
PEERS = ("sglang", JIT)  # the columns ours is stated against (ours / peer; < 1: ours faster)


@triton.jit
def _floor_kernel(out_ptr):
    """One word per program: what replaying any launch of that many programs costs (the floor)."""
    tl.store(out_ptr + tl.program_id(1), 0)


def add_arguments(ap) -> None:
    """The ``--vs-sglang`` flags, a group of the benchmark's parser."""
    vs = ap.add_argument_group("--vs-sglang: ours vs SGLang's fused_qk_norm_rope_swa_store, graph and eager")
    vs.add_argument("--vs-sglang", action="store_true", help="print the comparison table (qk_norm_rope_vs_sglang.csv)")
    vs.add_argument("--T", type=usage.positive_int, nargs="+", help=f"token counts (default {VS_T})")
    vs.add_argument("--H", type=usage.positive_int, nargs="+", help=f"local heads (default {VS_H})")
    vs.add_argument("--modes", nargs="+", default=list(VS_MODES), choices=VS_MODES)
    vs.add_argument("--configs", default="default",
                    help="our kernel's (BLOCK_T)x(num_warps) candidates side by side, e.g. 'default,2x4,8x8'")
    vs.add_argument("--rep-ms", type=usage.positive_int, default=10, help="do_bench_cudagraph's rep per timing (ms)")
    vs.add_argument("--no-sglang", action="store_true", help="leave out SGLang's Triton kernel")
    vs.add_argument("--no-sglang-jit", action="store_true",
                    help="leave out SGLang's JIT-compiled CUDA kernels (they need a CUDA GPU, nvcc, ninja and the "
                         "sglang-jit extra; elsewhere their columns are NaN with the reason)")
    vs.add_argument("--before", type=Path, help="another fused/qk_norm_rope/wrapper.py (e.g. the previous commit's): timed "
                                                "beside ours and its output bytes compared")
    vs.add_argument("--no-compiled", action="store_true", help="leave out torch.compile of the chain")


@dataclass(frozen=True)
class VsRow:
    mode: str  # verify (no store) | decode (ring store in the kernel)
    T: int
    H: int
    bytes_moved: int
    copy_gbps: float
    graph_us: dict  # impl -> median us, replayed from a CUDA graph (ours@BTxW, sglang, chain, compiled)
    eager_us: dict  # impl -> us per call of a back-to-back eager loop, the impls' loops interleaved
    # (ours-wrapper, ours-device-checked, ours-unchecked, ours-launch, sglang)
    differ: dict  # impl -> bytes of (q_out, kv_out, ring) that differ from ours (default config): before, ours@..
    refused: dict = field(default_factory=dict)  # peer -> the one-line reason it was not timed here (its columns NaN)


def vs_bytes(mode: str, T: int, H: int) -> int:
    """``bytes_moved`` of the verify op, plus in decode the ring rows written and loc read."""
    b = 2 * T * H * D * 2 + 2 * T * D * 2 + T * 8 + 2 * T * (R // 2) * 4 + D * 2
    return b + (T * D * 2 + T * 8 if mode == "decode" else 0)


def vs_inputs(mode: str, T: int, H: int, device: torch.device, seed: int = 0) -> dict:
    """DeepSeek-V4 inputs made on the device: q (T, H, 512), kv a strided slice of qkv_a (as
    ``cases.qk_norm_rope.catalog``), positions in an 8192-row table; decode: a ring of 2T + 3 rows, loc a
    permutation of its slots."""
    from cases.qk_norm_rope import catalog as c

    g = torch.Generator(device=device).manual_seed(seed)
    qkv_a = torch.randn(T, 96 + D, generator=g, device=device).bfloat16()
    cos, sin = c.rope_tables(VS_MAX_POS, R)
    kw = dict(q=torch.randn(T, H, D, generator=g, device=device).bfloat16(), kv=qkv_a[:, 96:],
              kv_norm_weight=(0.5 + torch.rand(D, generator=g, device=device)).bfloat16(), q_norm_weight=None,
              eps=EPS, rope_dim=R, cos=cos.to(device), sin=sin.to(device),
              positions=torch.randint(0, VS_MAX_POS, (T,), generator=g, device=device), rope_style=ROPE_STYLE,
              ring=None, loc=None)
    if mode == "decode":
        S = 2 * T + 3
        kw["ring"] = torch.randn(S, D, generator=g, device=device).bfloat16()
        kw["loc"] = torch.randperm(S, generator=g, device=device)[:T]
    return kw


def parse_configs(text: str) -> list[tuple[int, int]]:
    """'4x4,8x8' -> [(BLOCK_T 4, num_warps 4), (8, 8)]; 'default' (or empty) -> block_config's own."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part == "default":
            out.append(None)
            continue
        bt, w = part.lower().split("x")
        out.append((int(bt), int(w)))
    return out or [None]


def _config_name(cfg) -> str:
    return "ours" if cfg is None else f"ours@{cfg[0]}x{cfg[1]}"


def vs_calls(kw: dict, mode: str, configs: list, sglang_mod, compiled_chain, before=None) -> tuple[dict, dict]:
    """(graph callables, eager callables) on the same inputs. Graph: our kernel per config (outputs
    preallocated), SGLang's ``fused_qk_norm_rope_swa_store`` (q_out preallocated; it normalises kv in
    place), ``floor`` (H + 1 programs storing one word each: the replay cost of a launch), the
    reference chain and its torch.compile (verify only: the chain's ring store indexes
    with a boolean mask, which syncs). Eager: our public wrapper as a caller runs it (value checks
    on, the default; ``checked=False``; and ``launch`` alone, outputs preallocated), SGLang's call as its
    model calls it. ``before``: another
    copy of fused/qk_norm_rope/wrapper.py (a module), timed as ``before`` (graph) beside ours."""
    from fused import device_checks
    from fused.qk_norm_rope import wrapper as f

    q, kv = kw["q"], kw["kv"]
    T, H, _ = q.shape
    q_out, kv_out = torch.empty_like(q), torch.empty(kv.shape, dtype=kv.dtype, device=kv.device)
    launch = {k: kw[k] for k in ("q", "kv", "kv_norm_weight", "q_norm_weight", "eps", "rope_dim", "cos", "sin",
                                 "positions", "rope_style", "ring", "loc")}
    graph = {_config_name(cfg): functools.partial(f.launch, q_out=q_out, kv_out=kv_out, config=cfg, **launch)
             for cfg in configs}
    # the default config with the value checks in the kernel (checked="device"; its record is never raised here)
    graph["device-checked"] = functools.partial(f.launch, q_out=q_out, kv_out=kv_out,
                                                flags=device_checks.record(q.device), **launch)
    if before is not None:
        graph["before"] = functools.partial(before.launch, q_out=q_out, kv_out=kv_out, **launch)
    # the launch floor: as many one-warp programs as ours at T 1 (H q heads + kv), a word each
    words = torch.empty(H + 1, dtype=torch.int32, device=q.device)
    graph["floor"] = lambda: _floor_kernel[(1, H + 1)](words, num_warps=1)
    eager = {"ours-wrapper": functools.partial(f.qk_norm_rope, **launch),
             "ours-device-checked": functools.partial(f.qk_norm_rope, **launch, checked="device"),
             "ours-unchecked": functools.partial(f.qk_norm_rope, **launch, checked=False),
             # the launch alone (arguments validated, outputs allocated once): what Triton's dispatch costs
             "ours-launch": functools.partial(f.launch, q_out=q_out, kv_out=kv_out, **launch)}
    if sglang_mod is not None:
        sg_kv = kv.clone()  # SGLang writes kv in place: its own copy (a strided slice as ours)
        sg_kv = torch.empty(T, 96 + D, dtype=kv.dtype, device=kv.device)[:, 96:].copy_(kv)
        loc32 = kw["loc"].to(torch.int32) if mode == "decode" else None
        sg = dict(q=q.reshape(T, H * D), kv=sg_kv, q_norm_weight=None, kv_norm_weight=kw["kv_norm_weight"],
                  q_rms_eps=EPS, kv_rms_eps=EPS, rope_head_dim=R, cos_cache=kw["cos"], sin_cache=kw["sin"],
                  positions=kw["positions"], swa_cache=kw["ring"] if mode == "decode" else None, swa_loc=loc32,
                  swa_page_size=1, dtype=q.dtype, bf16_store=True)
        graph["sglang"] = functools.partial(sglang_mod.fused_qk_norm_rope_swa_store, q_out=torch.empty_like(q), **sg)
        eager["sglang"] = functools.partial(sglang_mod.fused_qk_norm_rope_swa_store, **sg)
    if mode == "verify":
        args = (q, kv, kw["kv_norm_weight"], kw["cos"], kw["sin"], kw["positions"])
        graph["chain"] = lambda: reference_chain(*args)
        if compiled_chain is not None:
            graph["compiled"] = lambda: compiled_chain(*args)
    return graph, eager


def byte_differences(kw: dict, configs: list, before=None, sglang_mod=None) -> dict:
    """Bytes of q_out, kv_out and the ring (decode) that each other config, and ``before``, write
    differently from ours at the default config, on the same inputs; ``sglang``: the same for
    SGLang's call (its kv normalised in place on a copy, its ring store into a copy)."""
    from fused.qk_norm_rope import wrapper as f

    launch = {k: kw[k] for k in ("q", "kv", "kv_norm_weight", "q_norm_weight", "eps", "rope_dim", "cos", "sin",
                                 "positions", "rope_style", "loc")}

    def run(fn, **extra):
        ring = kw["ring"].clone() if kw["ring"] is not None else None
        q_out, kv_out = torch.empty_like(kw["q"]), torch.empty(kw["kv"].shape, dtype=kw["kv"].dtype,
                                                                device=kw["kv"].device)
        fn(q_out=q_out, kv_out=kv_out, ring=ring, **launch, **extra)
        return [t.contiguous().view(-1).view(torch.uint8) for t in (q_out, kv_out, ring) if t is not None]

    ref = run(f.launch)
    others = {_config_name(c): functools.partial(f.launch, config=c) for c in configs if c is not None}
    if before is not None:
        others["before"] = before.launch
    if sglang_mod is not None:
        def sglang(q_out, kv_out, ring, **_):
            T, H, _d = kw["q"].shape
            kv_out.copy_(kw["kv"])
            sglang_mod.fused_qk_norm_rope_swa_store(
                kw["q"].reshape(T, H * D), kv_out, None, kw["kv_norm_weight"], EPS, EPS, R, kw["cos"], kw["sin"],
                kw["positions"], swa_cache=ring, swa_loc=kw["loc"].to(torch.int32) if ring is not None else None,
                swa_page_size=1, q_out=q_out, dtype=kw["q"].dtype, bf16_store=True)
        others["sglang"] = sglang
    return {name: sum(int((a != b).sum()) for a, b in zip(ref, run(fn))) for name, fn in others.items()}


def jit_call(kw: dict, mode: str, kernels):
    """SGLang's JIT norm+RoPE kernels (``kernels``, a ``harness.adapters.sglang_jit.Kernels``) on the row's
    inputs through the adapter (``qk_bench_call``): a zero-argument callable, or the one-line reason they do
    not cover this row (a first call that raises is such a reason too, never the bench's error)."""
    from harness.adapters import sglang_jit

    try:
        return sglang_jit.qk_bench_call({**kw, "forward_mode": "target_verify" if mode == "verify" else "decode"},
                                        kernels)
    except Exception as exc:  # noqa: BLE001 - a build or launch failure: said in its row, the rest still runs
        return f"the first call raised {type(exc).__name__}: {str(exc)[:200]}"


def vs_measure(modes, Ts, Hs, configs, *, with_sglang: bool, with_compiled: bool, graph_timer, eager_timer,
               copy_gbps: float, device: torch.device, progress=print, before=None, on_row=None,
               jit_kernels=None) -> list[VsRow]:
    """Every (mode, T, H): each graph callable through ``graph_timer``, the eager ones through
    ``eager_timer`` ({name: callable} -> {name: us}, side by side). A callable that raises is
    reported and left out of its row. ``on_row(rows)`` after each row (the CSV is rewritten: a run
    cut short keeps what it measured). ``jit_kernels``: SGLang's JIT kernels (``sglang_jit.sglang()``, or
    the emulation's) timed as ``sglang-jit`` where the adapter covers the row; what the machine lacks for
    them is said in one line, each other reason once, and kept in the row (``refused``); None: not asked."""
    sglang_mod = None
    if with_sglang:
        from harness.adapters import sglang as sg

        try:
            sglang_mod = sg.load()["fused_qk_norm_rope_store"]
        except sg.SGLangUnavailable as exc:
            progress(f"  sglang: {exc}; its columns are left out")
    lacks = jit_kernels.missing("qk") if jit_kernels is not None else ""
    if lacks:
        progress(f"  {JIT}: refused on this machine: {lacks}")
    said = {lacks}
    compiled_chain = torch.compile(reference_chain, dynamic=True) if with_compiled else None
    rows = []
    for mode in modes:
        for H in Hs:
            for T in Ts:
                kw = vs_inputs(mode, T, H, device, seed=T * 1000 + H)
                differ = byte_differences(kw, configs, before, sglang_mod)
                graph, eager = vs_calls(kw, mode, configs, sglang_mod, compiled_chain, before)
                refused = {}
                if jit_kernels is not None:
                    jit = lacks or jit_call(kw, mode, jit_kernels)
                    if isinstance(jit, str):
                        refused[JIT] = jit
                        if jit not in said:
                            progress(f"  {JIT}: not timed from {mode} T={T} H={H} on: {jit}")
                            said.add(jit)
                    else:
                        graph[JIT] = eager[JIT] = jit
                g, e = {}, {}
                for name, fn in graph.items():
                    try:
                        g[name] = graph_timer(fn)
                    except Exception as exc:  # a config that does not compile: said, not fatal
                        progress(f"  {mode} T={T} H={H} {name}: {type(exc).__name__}: {str(exc)[:200]}")
                runs = {}
                for name, fn in eager.items():  # each called once alone: one that raises is left out
                    try:
                        fn()
                        runs[name] = fn
                    except Exception as exc:
                        progress(f"  {mode} T={T} H={H} {name} (eager): {type(exc).__name__}: {str(exc)[:200]}")
                e = eager_timer(runs) if runs else {}
                row = VsRow(mode, T, H, vs_bytes(mode, T, H), copy_gbps, g, e, differ, refused)
                progress(vs_line(row))
                rows.append(row)
                if on_row is not None:
                    on_row(rows)
                del kw, graph, eager
    return rows


def vs_line(r: VsRow) -> str:
    """One printed row: graph times with % of copy bandwidth, then eager times, then the ratios
    that the targets are stated in (ours / sglang; < 1: ours faster)."""
    def pct(us):
        return 100 * r.bytes_moved / (us * 1e-6) / 1e9 / r.copy_gbps if r.copy_gbps > 0 and us > 0 else float("nan")

    gs = " ".join(f"{k} {v:7.2f}" + ("" if k in NOT_THE_OP else f" ({pct(v):4.1f}%)") for k, v in r.graph_us.items())
    es = " ".join(f"{k} {v:7.1f}" for k, v in r.eager_us.items())
    ratios = ""
    for peer in PEERS:
        if peer in r.graph_us:
            best = min((v, k) for k, v in r.graph_us.items() if k.startswith("ours"))
            ratios += f" | graph best {best[1]}/{peer} {best[0] / r.graph_us[peer]:.2f}"
        if peer in r.eager_us:
            ratios += " | eager " + " ".join(f"{k}/{peer} {r.eager_us[k] / r.eager_us[peer]:.2f}"
                                            for k in ("ours-wrapper", "ours-device-checked", "ours-unchecked",
                                                      "ours-launch") if k in r.eager_us)
    ratios += "".join(f" | {peer} not timed" for peer in r.refused)
    if r.differ:
        ratios += " | bytes differing from ours: " + " ".join(f"{k} {v}" for k, v in r.differ.items())
    return f"{r.mode:6s} T={r.T:5d} H={r.H:3d} graph us: {gs} | eager us: {es}{ratios}"


def vs_frame(rows: list[VsRow]):
    import pandas as pd

    out = []
    for r in rows:
        d = dict(mode=r.mode, T=r.T, H=r.H, bytes_moved=r.bytes_moved, copy_gbps=r.copy_gbps)
        for k, v in r.graph_us.items():
            d[f"graph_{k}_us"] = v
            if k not in NOT_THE_OP:
                d[f"graph_{k}_frac_of_copy"] = (r.bytes_moved / (v * 1e-6) / 1e9 / r.copy_gbps if r.copy_gbps
                                                else math.nan)
        d.update({f"eager_{k}_us": v for k, v in r.eager_us.items()})
        for peer in r.refused:  # asked and not timed: NaN, never a made-up number, and why
            d[f"graph_{peer}_us"] = d[f"eager_{peer}_us"] = math.nan
        for peer in PEERS:  # ours (default config; the public wrapper eager) over the peer's; < 1: ours faster
            if f"graph_{peer}_us" in d:
                d[f"graph_ours_over_{peer}"] = ratio(r.graph_us.get("ours", math.nan), d[f"graph_{peer}_us"])
            if f"eager_{peer}_us" in d:
                d[f"eager_ours-wrapper_over_{peer}"] = ratio(r.eager_us.get("ours-wrapper", math.nan),
                                                             d[f"eager_{peer}_us"])
        if JIT in r.graph_us or JIT in r.eager_us or JIT in r.refused:
            d[f"{JIT}_refused"] = r.refused.get(JIT, "")
        d.update({f"bytes_differing_{k}": v for k, v in r.differ.items()})
        out.append(d)
    return pd.DataFrame(out)


def vs_main(args) -> int:
    """``--vs-sglang``: the comparison table on this GPU (without one: a tiny run under the interpreter
    with wall-clock timers, which only shows the tool works)."""
    from harness import devices
    from harness.adapters import sglang_jit
    from harness.gpu import profiling

    gpu = devices.gpu_present()
    Ts, Hs = args.T or VS_T, args.H or VS_H
    configs = parse_configs(args.configs)
    if gpu:
        dev = devices.select("auto")
        copy = profiling.copy_bandwidth_gbps()
        graph_timer = functools.partial(profiling.graph_time_us, rep=args.rep_ms)
        eager_timer = functools.partial(profiling.eager_us_interleaved, dev=dev)
        print(f"qk_norm_rope vs SGLang on {dev.name}: copy bandwidth {copy:.0f} GB/s; T {Ts} H {Hs} "
              f"modes {args.modes}; ours configs {[_config_name(c) for c in configs]}", flush=True)
    else:
        dev = devices.select("cpu")
        copy = 0.0
        graph_timer = functools.partial(profiling.eager_us, dev=dev, iters=1, repeats=1)
        eager_timer = functools.partial(profiling.eager_us_interleaved, dev=dev, iters=1, repeats=1)
        print("qk_norm_rope vs SGLang: no GPU, a smoke run under the interpreter (times mean nothing)", flush=True)
    t0 = __import__("time").monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "qk_norm_rope_vs_sglang.csv"
    rows = vs_measure(args.modes, Ts, Hs, configs, with_sglang=not args.no_sglang, with_compiled=gpu and not
                      args.no_compiled, graph_timer=graph_timer, eager_timer=eager_timer, copy_gbps=copy,
                      device=dev.torch_device, progress=lambda s: print(s, flush=True),
                      before=before_module.load_module(args.before) if args.before else None,
                      on_row=lambda rows: vs_frame(rows).to_csv(path, index=False),
                      jit_kernels=None if args.no_sglang_jit else sglang_jit.sglang())
    print(f"{len(rows)} rows -> {path} ({__import__('time').monotonic() - t0:.0f} s)")
    return 0
