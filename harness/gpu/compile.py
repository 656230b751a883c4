"""Ahead-of-time compile of every Triton kernel for NVIDIA and AMD targets, from any machine.

The interpreter accepts code that a compiler rejects (and vice versa); CI has no GPU, so it
compiles each kernel variant listed by ``fused/<op>/wrapper.py::compile_specs()`` for sm90 (H100/H200)
and gfx942/gfx950 (MI300/MI355) with ``triton.compile`` and an explicit ``GPUTarget``, and those a
plugin's implementations declare (``Impl.compile_specs``, ``python -m harness compile --impl``).
Runs in its own process: kernels must be defined with the interpreter off (``prepare`` before
any kernel module, a plugin's included, is imported).

Each variant is compiled as the JIT compiles a launch on aligned tensors at sizes that are multiples
of 16 (``aligned_attrs``), and for sm90 the result says how its global loads are issued
(``load_widths``): a kernel whose row loads are one element each (an address or mask the compiler
cannot prove aligned, e.g. a size or stride in ``do_not_specialize``) shows it here without a GPU.
"""
from __future__ import annotations

import importlib
import os
import re
import time
from collections import Counter
from dataclasses import dataclass

TARGETS = {"sm90": ("cuda", 90, 32), "gfx942": ("hip", "gfx942", 64), "gfx950": ("hip", "gfx950", 64)}


@dataclass(frozen=True)
class CompileResult:
    op: str
    impl: str  # "fused" (fused/<op>/wrapper.py) or the plugin implementation's name
    kernel: str
    target: str
    ok: bool
    seconds: float
    detail: str
    loads: str = ""  # sm90: the global loads by width (``load_widths``), e.g. "16B x6, 4B x2"


def aligned_attrs(fn, signature: dict) -> dict:
    """``ASTSource.attrs`` of the specialization a launch gets on 16-byte-aligned tensors with every
    integer argument a multiple of 16: Triton marks such pointers and integers divisible by 16, save
    the integers the kernel lists in ``do_not_specialize`` (by name or position)."""
    names = list(signature)
    every = getattr(fn, "arg_names", None) or names  # a position counts the constexprs too
    dns = {every[i] if isinstance(i, int) else i for i in (getattr(fn, "do_not_specialize", None) or ())}
    return {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names)
            if signature[a].startswith("*") or (signature[a] in ("i32", "i64") and a not in dns)}


_LD = re.compile(r"\bld\.global[\w.:]*?(?:\.v(\d))?\.[bsuf](\d+)\b")
_CP = re.compile(r"\bcp\.async\.c[ag]\.shared\.global\s*\[[^]]*\],\s*\[[^]]*\],\s*(0x[0-9a-f]+|\d+)")


def load_widths(ptx: str) -> Counter:
    """Bytes per global load instruction of a PTX text -> how many: ``ld.global`` (its vector width
    times its element size) and ``cp.async`` copies to shared memory (their size operand)."""
    widths: Counter = Counter()
    for vec, bits in _LD.findall(ptx):
        widths[int(vec or 1) * int(bits) // 8] += 1
    for size in _CP.findall(ptx):
        widths[int(size, 0)] += 1
    return widths


def _loads_text(widths: Counter) -> str:
    return ", ".join(f"{b}B x{n}" for b, n in sorted(widths.items(), reverse=True)) or "none"


def prepare() -> None:
    """Kernels imported from here on are real JITFunctions (not interpreted): call before importing any."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile check needs TRITON_INTERPRET unset (run `python -m harness compile`)")
    os.environ["VP_DEVICE"] = "compile"  # harness.devices.prepare_triton leaves the interpreter off


def run(ops: list[str], targets: list[str], impls: tuple = ()) -> list[CompileResult]:
    """Every variant of ``fused/<op>/wrapper.py::compile_specs()`` for each op, then of each of ``impls``'
    ``compile_specs()`` (an Impl declaring none is skipped: the caller says so), for each target."""
    prepare()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = []
    jobs = [(op, "fused", importlib.import_module(f"fused.{op}.wrapper").compile_specs()) for op in ops]
    seen = set()
    for i in impls:
        if i.compile_specs is None or id(i.compile_specs) in seen:  # one list's impls may share their kernels
            continue
        seen.add(id(i.compile_specs))
        try:
            jobs.append((i.op, i.name, list(i.compile_specs())))
        except Exception as exc:  # the plugin's own error, named: the other kernels still compile
            out.append(CompileResult(i.op, i.name, "compile_specs()", "-", False, 0.0, f"{type(exc).__name__}: {exc}"))
    for op, impl, specs in jobs:
        for name, fn, sig, const, warps, *only in specs:
            if not isinstance(fn, triton.runtime.JITFunction):
                out.append(CompileResult(op, impl, name, "-", False, 0.0,
                                         f"{type(fn).__name__} is not a triton.jit function (imported before "
                                         f"compile_check.prepare, under the interpreter?)"))
                continue
            for tname in targets:
                if only and tname not in only[0]:  # optional 6th item: the targets this variant exists on
                    continue
                backend, arch, warp = TARGETS[tname]
                t0 = time.perf_counter()
                loads = ""
                try:
                    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in const}}, constexprs=const,
                                    attrs=aligned_attrs(fn, sig))
                    k = triton.compile(src, target=GPUTarget(backend, arch, warp), options={"num_warps": warps})
                    binary = "cubin" if backend == "cuda" else "hsaco"
                    ok = bool(k.asm.get(binary))
                    detail = f"{binary} {len(k.asm[binary])} bytes" if ok else f"no {binary} produced"
                    loads = _loads_text(load_widths(k.asm["ptx"])) if backend == "cuda" else ""
                except Exception as exc:  # the compiler's own message is the finding
                    ok, detail = False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
                out.append(CompileResult(op, impl, name, tname, ok, time.perf_counter() - t0, detail, loads))
    return out
