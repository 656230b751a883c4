"""The Triton-interpreter conversion shim — the one place where interpreter defects are fixed.

Under ``TRITON_INTERPRET=1`` Triton keeps bf16 and fp8 values as raw integers and converts
them with its own bit manipulation (``triton.runtime.interpreter._convert_float``). Measured
on triton 3.9.0 / torch 2.13 CPU (``tests/test_shim.py`` re-measures them on every CI run):

* fp32 -> bf16 truncates toward zero instead of rounding to nearest even;
* fp32 -> fp8 mishandles ties, mantissa carry (7.9 -> 4.0), subnormals, overflow and NaN;
* fp8 NaN codes decode as ±480 / −0.0;
* ``tl.dot`` on bf16 operands multiplies the uint16 bit patterns;
* the rounding mode a kernel asks for (``fp_downcast_rounding="rtz"``) is passed to this
  conversion, which the shim honours for bf16/fp16 and refuses for fp8 (see ``convert``).

Compiled Triton on sm90 converts with ``cvt.rn`` (round to nearest even) and, for fp8,
``cvt.rn.satfinite`` (|x| > max and ±inf -> ±max, NaN -> NaN). The shim replaces the
interpreter's conversion with exactly that, computed through torch on fp32 values after an
explicit clamp, so the result does not depend on which torch is installed (torch 2.11
returns NaN on fp8 overflow, torch 2.13 saturates). It also upcasts bf16/fp16 operands of
``tl.dot`` to fp32 before the product, and (triton < 3.9 only, e.g. the H200 runner's 3.6)
reads a one-element tensor as a Python int the way 3.9 does: 3.6 keeps a scalar loaded
through a pointer as a 1-element array and its ``__index__`` calls ``int()`` on it, which
numpy 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"), so every
``range()`` over loaded bounds (the verify_attention prefix loops) raised. Nothing else is
changed: bf16 *arithmetic* inside a kernel is still wrong under the interpreter, which is why
kernels upcast to fp32 right after loading. The GPU run is the judge: ``tests/test_shim.py`` checks on a GPU that compiled
conversions agree byte for byte with this shim.

``install()`` is idempotent and is called only by ``harness.devices``; ``SHIM_ID`` goes into
every row's provenance.
"""
from __future__ import annotations

import numpy as np
import torch

SHIM_ID = "vp-interp-shim/2 (bf16 RNE, fp8 RNE+satfinite, bf16 dot upcast, rtz bf16/fp16, rtz fp8 refused)"

_installed = False


def _torch_dtype(tl_dtype):
    import triton.language as tl

    return {
        tl.float32: torch.float32,
        tl.float16: torch.float16,
        tl.bfloat16: torch.bfloat16,
        tl.float8e4nv: torch.float8_e4m3fn,
        tl.float8e4b8: torch.float8_e4m3fnuz,
        tl.float8e5: torch.float8_e5m2,
        tl.float8e5b16: torch.float8_e5m2fnuz,
    }.get(tl_dtype)


_INT_VIEW = {8: (np.int8, torch.int8), 16: (np.int16, torch.int16), 32: (np.int32, torch.int32)}


def _to_torch(data: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    bits = torch.finfo(dtype).bits
    np_int, _ = _INT_VIEW[bits]
    return torch.from_numpy(np.ascontiguousarray(data).view(np_int).copy()).view(dtype)


def _from_torch(t: torch.Tensor) -> np.ndarray:
    bits = torch.finfo(t.dtype).bits
    _, t_int = _INT_VIEW[bits]
    return t.contiguous().view(t_int).numpy().view(f"uint{bits}" if bits < 32 else "float32")


class ShimRoundingError(NotImplementedError):
    """A kernel asked for a conversion whose compiled result the shim cannot vouch for."""


def convert(values: torch.Tensor, dst: torch.dtype, rounding: str = "rtne") -> torch.Tensor:
    """Convert like compiled Triton on sm90. ``rtne`` (Triton's default for every downcast): round
    to nearest even; fp8 saturates finite (satfinite). ``rtz`` (``fp_downcast_rounding="rtz"``):
    round toward zero to bf16 or fp16 (``cvt.rz``): the representable value of largest magnitude
    not above ``|x|``, overflow to the largest finite value, ±inf and NaN kept. Compiled Triton
    on NVIDIA has no round-toward-zero conversion to fp8, so ``rtz`` to fp8 raises
    ``ShimRoundingError`` rather than let a kernel pass CPU checks on a conversion no GPU does."""
    x = values.float()
    bits = torch.finfo(dst).bits
    if rounding not in ("rtne", "rtz"):
        raise ShimRoundingError(f"rounding mode {rounding!r}: the shim knows 'rtne' and 'rtz'")
    if rounding == "rtz" and bits == 8:
        raise ShimRoundingError(f"round-toward-zero to {dst}: compiled Triton on NVIDIA converts to fp8 "
                                f"with round-to-nearest-even only")
    if bits == 8:
        fmax = torch.finfo(dst).max
        nan = torch.isnan(x)
        x = torch.where(nan, torch.full_like(x, float("nan")), x.clamp(-fmax, fmax))  # canonical +NaN code
        return x.to(dst)
    y = x.to(dst)
    if rounding == "rtz":  # nearest-even went away from zero: one code toward zero (codes are monotone in |x|)
        away = torch.isfinite(x) & (y.float().abs() > x.abs())
        ints = y.view(_INT_VIEW[bits][1])
        y = torch.where(away, ints - 1, ints).view(dst)
    return y


def _rounding_name(mode) -> str:
    """The interpreter's ``ROUNDING_MODE`` enum (None for upcasts) as ``convert``'s name."""
    from triton._C.libtriton import ir

    if mode is None or mode == ir.ROUNDING_MODE.RTNE:
        return "rtne"
    if mode == ir.ROUNDING_MODE.RTZ:
        return "rtz"
    return str(mode)


def _convert_float(input, input_dtype, output_dtype, rounding_mode, _orig=None):
    src, dst = _torch_dtype(input_dtype), _torch_dtype(output_dtype)
    if src is None or dst is None:
        return _orig(input, input_dtype, output_dtype, rounding_mode)
    out = convert(_to_torch(input, src), dst, _rounding_name(rounding_mode))
    res = _from_torch(out)
    if res.dtype == np.float32:
        res = res.view(np.uint32)
    return res.reshape(input.shape)


def install() -> None:
    """Patch the interpreter's conversions (see module docstring). Safe to call twice."""
    global _installed
    if _installed:
        return
    import functools

    import triton.language as tl
    from triton.runtime import interpreter as it

    orig = it._convert_float
    it._convert_float = functools.partial(_convert_float, _orig=orig)
    orig_dot = it.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def up(h):
            if h.dtype.scalar in (tl.bfloat16, tl.float16):
                data = _to_torch(h.data, _torch_dtype(h.dtype.scalar)).float().numpy()
                return it.TensorHandle(data, tl.float32)
            return h

        return orig_dot(self, up(a), up(b), d, input_precision, max_num_imprecise_acc)

    it.InterpreterBuilder.create_dot = create_dot
    orig_tensor_patch = it._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        orig_tensor_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))  # as triton 3.9

    it._patch_lang_tensor = patch_lang_tensor
    _install_nested_call_fast_path(it, tl)
    _install_type_caches(it)
    _installed = True


def _install_type_caches(it) -> None:
    """Speed only, no numerics: two pure functions the interpreter calls for every op, remembered per
    argument. ``_get_np_dtype`` builds a 19-entry dict of dtypes (hashing each) on every call, about
    6 % of a ci-profile run's CPU time (pyinstrument, 2026-12-07); its answer depends on the dtype's
    ``name`` only (``tl.dtype.__eq__`` compares names; a block type's name holds its element type and
    shape). ``validate_block_shape`` checks a block's shape (powers of two, a size cap) for every new
    block type: a function of the shape's ints; shapes it refuses raise as before (never cached)."""
    import functools

    from triton.language import core

    orig_np_dtype = it._get_np_dtype
    np_dtypes: dict = {}

    def get_np_dtype(tt_dtype):
        name = getattr(tt_dtype, "name", None)
        got = np_dtypes.get(name) if isinstance(name, str) else None
        if got is None:
            got = orig_np_dtype(tt_dtype)
            if isinstance(name, str):
                np_dtypes[name] = got
        return got

    it._get_np_dtype = get_np_dtype
    orig_validate = core.validate_block_shape
    validate = functools.lru_cache(maxsize=4096)(orig_validate)

    def validate_block_shape(shape):
        try:
            return validate(tuple(shape))
        except TypeError:  # an unhashable element: as before, uncached
            return orig_validate(shape)

    core.validate_block_shape = validate_block_shape


def _install_nested_call_fast_path(it, tl) -> None:
    """Speed only, no numerics: the interpreter re-patches ``triton.language`` (an
    ``inspect.getmembers`` walk) on every call of a nested ``@triton.jit`` helper, although the
    launch already patched the same modules and nested scopes are never restored. Skip the
    walk when the helper sees no language module the launch has not patched (about 2x faster
    for kernels built from helpers; outputs are bitwise identical)."""
    orig_patch_lang, orig_grid_call = it._patch_lang, it.GridExecutor.__call__
    stack: list = []  # per active launch: ids of the language modules it patched (None: not yet)

    def langs(fn):
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)

    def patch_lang(fn):
        seen = langs(fn)
        if stack and stack[-1] is not None and seen <= stack[-1]:
            return it._LangPatchScope()
        scope = orig_patch_lang(fn)
        if stack:  # nested scopes are never restored: these modules stay patched for the launch
            stack[-1] = seen if stack[-1] is None else stack[-1] | seen
        return scope

    def grid_call(self, *args, **kwargs):
        stack.append(None)
        try:
            return orig_grid_call(self, *args, **kwargs)
        finally:
            stack.pop()

    it._patch_lang = patch_lang
    it.GridExecutor.__call__ = grid_call


def installed() -> bool:
    return _installed
