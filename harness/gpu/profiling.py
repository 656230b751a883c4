"""GPU measurement primitives shared by the benchmarks (``harness.bench``) and the GPU-only
checks (``harness.gpu.checks``): kernel-launch counting with ``torch.profiler``, the measured
device copy bandwidth, and time quantiles with ``triton.testing.do_bench``; and ``eager_us``, the
wall time per call of a back-to-back loop on any device (what a caller pays; ``eager_us_interleaved``:
several callables side by side).

All but those two need a CUDA/HIP device; on a machine without one they raise ``RuntimeError``
naming what is missing (callers print it and measure nothing: timings under the Triton interpreter
mean nothing, and the interpreter launches no kernels to count).
"""
from __future__ import annotations

from typing import Callable

import torch

# device activity that is not a kernel launch of the op under test
_NOT_KERNELS = ("memcpy", "memset")


def _need_gpu(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a GPU: torch.cuda.is_available() is False on this machine")


def count_launches(fn: Callable[[], object], *, warmup: int = 1) -> int:
    """Kernels launched by one call of ``fn`` (memcpy/memset excluded), counted with
    ``torch.profiler`` on the device's activity. ``warmup`` calls first, so that compilation,
    autotuning and lazy allocations are not counted."""
    return len(kernel_names(fn, warmup=warmup))


def kernel_names(fn: Callable[[], object], *, warmup: int = 1) -> list[str]:
    """The names of the kernels one call of ``fn`` launches, in order (memcpy/memset excluded)."""
    _need_gpu("kernel_names")
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.name.lower().startswith(_NOT_KERNELS)]


def time_quantiles_us(fn: Callable[[], object], *, warmup: int = 25, rep: int = 100) -> tuple[float, float, float]:
    """(p20, p50, p80) of one call of ``fn`` in microseconds (``triton.testing.do_bench``, which
    flushes the L2 cache between calls)."""
    _need_gpu("time_quantiles_us")
    from triton.testing import do_bench

    p20, p50, p80 = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.2, 0.5, 0.8])
    return p20 * 1e3, p50 * 1e3, p80 * 1e3


def graph_time_us(fn: Callable[[], object], *, rep: int = 40) -> float:
    """Median microseconds of one call of ``fn`` replayed from a CUDA/HIP graph
    (``triton.testing.do_bench_cudagraph``): the device's time without the host's launch cost.
    An eager time of a launch shorter than its host-side launch path is the host's time (on the
    H200: verify_attention's combine alone, 7 us replayed, timed ~0.14 ms eager)."""
    _need_gpu("graph_time_us")
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3


def copy_bandwidth_gbps(n_bytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy of ``n_bytes`` (read + write both counted): the roof the
    bandwidth-bound kernels are measured against."""
    _need_gpu("copy_bandwidth_gbps")
    src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    _, p50, _ = time_quantiles_us(lambda: dst.copy_(src), warmup=10, rep=100)
    del src, dst
    return 2 * n_bytes / (p50 * 1e-6) / 1e9


def eager_us(fn, *, dev=None, iters: int = 100, repeats: int = 5) -> float:
    """Microseconds per call of ``fn`` called back to back, the device synchronised at the end of
    each loop (what a caller pays: the host's time, or the device's when that is longer); median
    of ``repeats`` loops."""
    return eager_us_interleaved({"fn": fn}, dev=dev, iters=iters, repeats=repeats)["fn"]


def eager_us_interleaved(fns: dict, *, dev=None, iters: int = 100, repeats: int = 5) -> dict:
    """``eager_us`` of several callables side by side: each repeat times one loop of each, in an
    order rotated per repeat, so that a change of the host's speed during the run (clock, another
    process) falls on all of them alike instead of on whichever was timed then. {name: us}."""
    import statistics
    import time

    from harness import devices

    dev = dev or devices.select("auto")
    for fn in fns.values():
        fn()
    devices.synchronize(dev)
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn = fns[name]
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            devices.synchronize(dev)
            times[name].append((time.perf_counter() - t0) / iters * 1e6)
    return {n: statistics.median(t) for n, t in times.items()}
