"""Ahead-of-time compile of every Triton kernel for NVIDIA and AMD targets, from any machine.

The interpreter accepts code that a compiler rejects (and vice versa); CI has no GPU, so it
compiles each kernel variant listed by ``fused/<op>.py::compile_specs()`` for sm90 (H100/H200)
and gfx942/gfx950 (MI300/MI355) with ``triton.compile`` and an explicit ``GPUTarget``.
Runs in its own process: kernels must be defined with the interpreter off.
"""
from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass

TARGETS = {"sm90": ("cuda", 90, 32), "gfx942": ("hip", "gfx942", 64), "gfx950": ("hip", "gfx950", 64)}


@dataclass(frozen=True)
class CompileResult:
    op: str
    kernel: str
    target: str
    ok: bool
    seconds: float
    detail: str


def run(ops: list[str], targets: list[str]) -> list[CompileResult]:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile check needs TRITON_INTERPRET unset (run `python -m harness compile`)")
    os.environ["VP_DEVICE"] = "compile"  # harness.devices.prepare_triton leaves the interpreter off
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = []
    for op in ops:
        mod = importlib.import_module(f"fused.{op}")
        for name, fn, sig, const, warps, *only in mod.compile_specs():
            for tname in targets:
                if only and tname not in only[0]:  # optional 6th item: the targets this variant exists on
                    continue
                backend, arch, warp = TARGETS[tname]
                t0 = time.perf_counter()
                try:
                    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in const}}, constexprs=const)
                    k = triton.compile(src, target=GPUTarget(backend, arch, warp), options={"num_warps": warps})
                    binary = "cubin" if backend == "cuda" else "hsaco"
                    ok = bool(k.asm.get(binary))
                    detail = f"{binary} {len(k.asm[binary])} bytes" if ok else f"no {binary} produced"
                except Exception as exc:  # the compiler's own message is the finding
                    ok, detail = False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
                out.append(CompileResult(op, name, tname, ok, time.perf_counter() - t0, detail))
    return out
