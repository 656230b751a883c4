"""``compile_specs()`` entries derived from the kernels themselves: the signature ``triton.compile``
needs is the kernel's own argument list (order, names, which are constexprs), so a kernel argument
added, removed or renamed changes every entry with it or makes it fail loudly, never leaves one stale.

What the kernel does not say is given by name: the type of each pointer (``*_ptr``, required) and
of each scalar that is not an ``i32`` (``fp32`` scales); the value of every constexpr (all required,
none unknown). An entry is ``(name, kernel, signature, constexprs, num_warps[, targets])``, the tuple
``harness.gpu.compile`` compiles and ``harness.registry.Impl.compile_specs`` documents.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping


def _params(kernel) -> list[inspect.Parameter]:
    """The arguments of a ``triton.jit`` function (compiled or interpreted: both keep the Python
    function as ``.fn``), in order."""
    return list(inspect.signature(getattr(kernel, "fn", kernel)).parameters.values())


def _is_constexpr(p: inspect.Parameter) -> bool:
    """As Triton decides it (``KernelParam.is_constexpr``): the annotation names ``constexpr``."""
    return p.annotation is not inspect.Parameter.empty and "constexpr" in str(p.annotation)


def runtime_args(kernel) -> list[str]:
    """The kernel's runtime (non-constexpr) arguments, in order."""
    return [p.name for p in _params(kernel) if not _is_constexpr(p)]


def constexpr_args(kernel) -> list[str]:
    """The kernel's ``tl.constexpr`` arguments, in order."""
    return [p.name for p in _params(kernel) if _is_constexpr(p)]


def signature(kernel, types: Mapping[str, str], *, scalar: str = "i32") -> dict[str, str]:
    """Every runtime argument of ``kernel`` in order -> its type: ``types[name]``, else ``scalar``
    for a non-pointer. A pointer (``*_ptr``) without a type, or a ``types`` name the kernel does
    not take as a runtime argument, is a ``TypeError`` naming it."""
    args = runtime_args(kernel)
    unknown = sorted(set(types) - set(args))
    if unknown:
        raise TypeError(f"{kernel_name(kernel)}: types given for {unknown}, not runtime arguments of the kernel "
                        f"({args})")
    untyped = [a for a in args if a.endswith("_ptr") and a not in types]
    if untyped:
        raise TypeError(f"{kernel_name(kernel)}: pointer argument(s) {untyped} need a type (e.g. '*bf16')")
    return {a: types.get(a, scalar) for a in args}


def kernel_name(kernel) -> str:
    return getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel))


def variant(label: str, kernel, types: Mapping[str, str], constexprs: Mapping, num_warps: int,
            targets: tuple[str, ...] | None = None) -> tuple:
    """One ``compile_specs()`` entry named ``kernel[label]``: ``signature(kernel, types)`` and
    ``constexprs``, which must give exactly the kernel's constexpr arguments (a ``TypeError`` names
    the missing and the unknown ones); ``targets``: the compile targets it exists on (None: all)."""
    want = constexpr_args(kernel)
    missing, unknown = [c for c in want if c not in constexprs], sorted(set(constexprs) - set(want))
    if missing or unknown:
        raise TypeError(f"{kernel_name(kernel)}[{label}]: constexprs missing {missing}, unknown {unknown}")
    entry = (f"{kernel_name(kernel)}[{label}]", kernel, signature(kernel, types),
             {c: constexprs[c] for c in want}, num_warps)
    return entry if targets is None else (*entry, targets)
