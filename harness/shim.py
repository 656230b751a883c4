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
``range()`` over loaded bounds (the verify_attention prefix loops) raised.

Vendor kernels (vLLM's) meet two more defects, fixed here too:

* bf16 arithmetic inside a kernel: the interpreter hands the uint16 bit patterns to numpy, so
  ``tl.sum(q[None, :] * k, 1)`` on bf16 multiplies and adds bit patterns (and ``<`` orders them
  as unsigned integers). The shim decodes, computes in fp32 and rounds to bf16 per operation, as
  compiled Triton does; reductions and scans of bf16 and fp16 round after every addition
  (``_install_half_arithmetic``). An atomic on bf16 is refused (``InterpreterConstructError``).
* ``and`` / ``or`` / ``not`` on tensors: the interpreter runs them as Python, which asks whether a
  whole block is true (``a >= 0 and a < n`` returns ``a < n``); compiled Triton makes them
  elementwise. The shim's source rewrite makes them elementwise (``_install_boolean_operators``).

* a Python float kernel argument: compiled Triton types it as an fp32 scalar, the interpreter passes the
  Python float on, a weakly typed scalar, so ``qk *= sm_scale`` on a bf16 ``qk`` stays bf16 (one more
  rounding than the GPU's fp32 product; vLLM's MLA decode stage 1, cases/ledgers/vllm.py). The shim hands
  the kernel an fp32 scalar, as the compiler does (``_install_float_arguments``).

And one gap: the interpreter has no libdevice. ``triton.language.extra.libdevice`` is a module of
stubs that the compiler resolves per backend; run as Python each stub returns None (vLLM's
``_resample_kernel`` calls ``libdevice.log1p`` and fails with "'NoneType' object has no attribute
'dtype'"). The shim computes the functions in ``LIBDEVICE`` with numpy in the argument's own type
(fp32 or fp64: libdevice's ``__nv_log1pf`` / ``__nv_log1p`` are accurate to ~1 ulp, numpy's too, so
the values can differ in the last bit), and refuses every other stub (``InterpreterConstructError``,
naming it) instead of letting it return None (``_install_libdevice``). It does so only while an
interpreted launch runs (in the launch's patch scope, as the interpreter patches ``triton.language``):
a kernel compiled in the same process sees the real libdevice, since the compiler refuses a Python
function where a libdevice extern should be.

Kernels that upcast to fp32 right after loading (ours) compute the same with or without these.
The GPU run is the judge: ``tests/test_shim.py`` checks on a GPU that compiled
conversions agree byte for byte with this shim, and that the vendor-style mini kernels give the
same right answers there.

``install()`` is idempotent and is called only by ``harness.devices``; its id, ``harness.devices.SHIM_ID``
(there, so that naming the device imports neither torch nor this module), goes into every row's
provenance: change it with what the shim does.
"""
from __future__ import annotations

import numpy as np
import torch

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
    if src is torch.bfloat16 and dst is torch.float32 and rounding_mode is None:
        # the exact upcast (every bf16 load converted to fp32), in numpy: the same bits as ``convert``'s
        # torch upcast for every one of the 65,536 codes (tests/test_shim.py), without torch's per-call cost
        return (np.asarray(input).astype(np.uint32) << np.uint32(16)).reshape(input.shape)
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
            """Operands exactly in fp32, so that numpy multiplies fp32 by fp32 (BLAS) and accumulates in fp32 as
            the compiled dot does: bf16 by its bits (as ``_convert_float``'s exact upcast), fp16 by numpy's exact
            cast, fp8 through fp16 as the interpreter decodes it (a float16 matmul in numpy is a loop ~8x slower
            than fp32's, with the same result: numpy computes in the fp32 ``dtype`` either way)."""
            sca = h.dtype.scalar
            if sca is tl.bfloat16:
                data = (np.asarray(h.data).astype(np.uint32) << np.uint32(16)).view(np.float32)
            elif sca is tl.float16:
                data = np.asarray(h.data).astype(np.float32)
            elif sca.is_floating() and sca.primitive_bitwidth == 8:
                data = it._convert_float(h.data, sca, tl.float16, None).view(np.float16).astype(np.float32)
            else:
                return h
            return it.TensorHandle(data.reshape(h.data.shape), tl.float32)

        return orig_dot(self, up(a), up(b), d, input_precision, max_num_imprecise_acc)

    it.InterpreterBuilder.create_dot = create_dot
    orig_tensor_patch = it._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        orig_tensor_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))  # as triton 3.9

    it._patch_lang_tensor = patch_lang_tensor
    _install_nested_call_fast_path(it, tl)
    _install_half_arithmetic(it, tl)
    _install_boolean_operators(it, tl)
    _install_type_caches(it)
    _install_libdevice(it, tl)
    _install_float_arguments(it, tl)
    _installed = True


def _install_float_arguments(it, tl) -> None:
    """A Python float argument of an interpreted launch becomes what the compiled kernel receives: an fp32
    scalar (the type ``triton.runtime.jit.mangle_type`` gives a float), its value rounded to fp32 (module
    docstring). Every other argument goes through the interpreter's own conversion."""
    from triton.runtime.jit import mangle_type

    orig = it._implicit_cvt

    def implicit_cvt(arg):
        if isinstance(arg, float):
            ty = tl.str_to_ty(mangle_type(arg), None)
            return tl.tensor(it.TensorHandle(np.array([arg], dtype=np.float32), ty), ty)
        return orig(arg)

    it._implicit_cvt = implicit_cvt


def _install_type_caches(it) -> None:
    """Speed only, no numerics: two pure functions the interpreter calls for every op, remembered per
    argument. ``_get_np_dtype`` builds a 19-entry dict of dtypes (hashing each) on every call, about
    6 % of a ci-profile run's CPU time (pyinstrument, 2026-12-07); its answer depends on the dtype's
    ``name`` only (``tl.dtype.__eq__`` compares names; a block type's name holds its element type and
    shape). ``validate_block_shape`` checks a block's shape (powers of two, a size cap) for every new
    block type: a function of the shape's ints (only shapes of plain ints are remembered); shapes it refuses raise as before (never cached)."""
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
        # remembered for shapes of plain ints only: a key (2.0,) would hit (2,)'s entry (2.0 == 2), and a
        # shape the interpreter refuses for its element types would pass once its int twin had been seen
        if type(shape) in (list, tuple) and all(type(s) is int for s in shape):
            return validate(tuple(shape))
        return orig_validate(shape)

    core.validate_block_shape = validate_block_shape
    _install_shared_types(it, core)


_TYPE_CACHE_MAX = 4096  # entries per cache below; a full cache starts again empty (a miss only costs time)
UNCACHED: dict = {}  # name -> the interpreter's own function that a remembering one replaced (tests compare)


def _int_shape(shape, triton_tuple):
    """``shape`` as a tuple of Python ints when it is a list, tuple or Triton tuple (``triton_tuple``) of
    plain ints (what ``block_type`` then stores unchanged); None for anything else (constexprs, tensors:
    left uncached)."""
    values = shape.values if type(shape) is triton_tuple else shape
    if type(values) not in (list, tuple) or not all(type(s) is int for s in values):
        return None
    return tuple(values)


def _install_shared_types(it, core) -> None:
    """Speed only, no numerics: the interpreter builds a new ``block_type`` for every op's result (its shape
    unwrapped element by element into a Triton tuple, its name formatted), a Triton tuple of constexprs
    for every new tensor's shape, and compares dtypes through ``_unwrap_if_constexpr``; about a quarter of
    a dev-profile run's interpreter CPU time (cProfile, 2026-12-07). Types are values here: nothing in
    Triton's interpreter or language modules assigns to a ``block_type``, a ``pointer_type``, a tensor's
    ``shape`` tuple or a ``constexpr`` after construction (Triton 3.9). So

    * ``block_type(element, shape)`` with a shape of plain ints returns one shared instance per
      (element type object, shape): the element is keyed by identity (``id``, the cache holding the
      object), so ``ty.element_ty is tl.float16`` answers as before; other shapes, and every shape the
      constructor refuses, take the constructor's own path, uncached;
    * the interpreter's ``get_ptr_ty`` returns one shared ``pointer_type`` per (element object, address
      space) instead of a new equal one per call;
    * ``tensor.__init__`` takes ``numel`` and the constexpr shape of a type it has seen from the first
      tensor of that type (same values, shared objects);
    * ``dtype == dtype`` compares names directly (``dtype.__eq__`` does, after unwrapping a constexpr that
      a dtype never is); anything else goes to ``dtype.__eq__`` as before;
    * broadcasting two blocks of the same shape, or two scalars, returns them unchanged without building
      the result shape element by element (what ``broadcast_impl_value`` returns for them);
    * ``computation_type_impl`` (the promoted type of a binary op, a function of the two types and three
      flags) is remembered per (type objects, flags); a refusal raises as before, never remembered.

    Each cache is keyed so that a hit returns exactly what the constructor would build; ``tests/test_shim.py``
    (``test_shared_*``, ``test_kernels_of_several_shapes_*``, ``test_remembered_promotions_*``) checks hits
    against fresh constructions and the interpreter's own answers."""
    import threading

    from triton.language import semantic

    BT, tensor, dtype = core.block_type, core.tensor, core.dtype
    blocks: dict = {}
    hit = threading.local()  # the shared instance __new__ just returned: its __init__ is skipped once
    orig_bt_init = BT.__init__

    def block_key(element_ty, shape):
        ints = _int_shape(shape, core.tuple)
        return None if ints is None else (id(element_ty), ints)

    def bt_new(cls, *args, **kwargs):
        if cls is BT and len(args) == 2 and not kwargs:
            key = block_key(*args)
            got = blocks.get(key) if key is not None else None
            if got is not None:
                hit.obj = got
                return got
        return object.__new__(cls)

    def bt_init(self, *args, **kwargs):
        if getattr(hit, "obj", None) is self:
            hit.obj = None
            return
        orig_bt_init(self, *args, **kwargs)
        if type(self) is BT and len(args) == 2 and not kwargs:
            key = block_key(*args)
            if key is not None:
                if len(blocks) >= _TYPE_CACHE_MAX:
                    blocks.clear()
                blocks[key] = self

    BT.__new__, BT.__init__ = staticmethod(bt_new), bt_init

    pointers: dict = {}
    orig_get_ptr_ty = it.InterpreterBuilder.get_ptr_ty

    def get_ptr_ty(self, elt_ty, addr_space):
        key = (id(elt_ty), addr_space)
        got = pointers.get(key)
        if got is None or got.element_ty is not elt_ty:
            got = orig_get_ptr_ty(self, elt_ty, addr_space)
            if len(pointers) >= _TYPE_CACHE_MAX:
                pointers.clear()
            pointers[key] = got
        return got

    it.InterpreterBuilder.get_ptr_ty = get_ptr_ty

    shapes: dict = {}  # id(type) -> (type, numel, shape) of the first tensor of that type
    orig_tensor_init = tensor.__init__

    def tensor_init(self, handle, type):
        got = shapes.get(id(type))
        if got is None or got[0] is not type:
            orig_tensor_init(self, handle, type)
            if len(shapes) >= _TYPE_CACHE_MAX:
                shapes.clear()
            shapes[id(type)] = (type, self.numel, self.shape)
            return
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self.numel, self.shape = got[1], got[2]

    tensor.__init__ = tensor_init

    orig_eq = dtype.__eq__

    def dtype_eq(self, other):
        if type(other) is dtype:  # the scalar types (their subclasses keep dtype.__eq__'s own path)
            return self.name == other.name
        return orig_eq(self, other)

    dtype.__eq__ = dtype_eq

    orig_broadcast = semantic.TritonSemantic.broadcast_impl_value

    def broadcast_impl_value(self, lhs, rhs):
        lhs_ty, rhs_ty = lhs.type, rhs.type
        lhs_block, rhs_block = lhs_ty.is_block(), rhs_ty.is_block()
        if not lhs_block and not rhs_block:
            return lhs, rhs
        if lhs_block and rhs_block and type(lhs_ty.shape) is type(rhs_ty.shape) is core.tuple:
            left, right = lhs_ty.shape.values, rhs_ty.shape.values
            if left == right and all(type(s) is int for s in left):
                return lhs, rhs
        return orig_broadcast(self, lhs, rhs)

    semantic.TritonSemantic.broadcast_impl_value = broadcast_impl_value

    orig_computation_type = UNCACHED["computation_type_impl"] = semantic.TritonSemantic.computation_type_impl
    promoted: dict = {}  # (id(a), a scalar?, id(b), b scalar?, div/mod?) -> (a, b, the promoted type)

    def computation_type_impl(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod):
        key = (id(a_ty), a_is_scalar, id(b_ty), b_is_scalar, div_or_mod)
        got = promoted.get(key)
        if got is not None and got[0] is a_ty and got[1] is b_ty:
            return got[2]
        out = orig_computation_type(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod)  # a refusal raises
        if len(promoted) >= _TYPE_CACHE_MAX:
            promoted.clear()
        promoted[key] = (a_ty, b_ty, out)
        return out

    semantic.TritonSemantic.computation_type_impl = computation_type_impl


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


LIBDEVICE = {"log1p": np.log1p}  # libdevice functions the shim computes under the interpreter (fp32, fp64)


def _install_libdevice(it, tl) -> None:
    """``triton.language.extra.libdevice`` under the interpreter (module docstring): each function of
    ``LIBDEVICE`` elementwise in its argument's type, every other stub refused by name."""
    from triton.language.extra import libdevice

    def computed(name, fn):
        def call(arg, _semantic=None):
            if not isinstance(arg, tl.tensor) or arg.dtype.scalar not in (tl.float32, tl.float64):
                _refuse(f"libdevice.{name} of {getattr(arg, 'dtype', type(arg).__name__)} (fp32 / fp64 only)")
            with np.errstate(all="ignore"):  # log1p(-inf) is NaN without a word, as on the GPU
                out = fn(arg.handle.data)
            return tl.tensor(it.TensorHandle(out, arg.dtype.scalar), arg.type)
        call.__name__ = name
        return call

    def refused(name):
        def call(*args, _semantic=None):
            _refuse(f"libdevice.{name} (the interpreter has no libdevice; harness.shim.LIBDEVICE computes "
                    f"{', '.join(sorted(LIBDEVICE))})")
        call.__name__ = name
        return call

    stand_ins = {name: computed(name, LIBDEVICE[name]) if name in LIBDEVICE else refused(name)
                 for name, member in vars(libdevice).items()
                 if callable(member) and not name.startswith("_")
                 and getattr(member, "__module__", "") == libdevice.__name__}
    orig_patch_lang = it._patch_lang

    def patch_lang(fn):
        scope = orig_patch_lang(fn)
        for name, stand_in in stand_ins.items():
            if getattr(libdevice, name) is not stand_in:  # a nested helper's call: the launch's scope has them
                scope.set_attr(libdevice, name, stand_in)
        return scope

    it._patch_lang = patch_lang


def installed() -> bool:
    return _installed


class InterpreterConstructError(NotImplementedError):
    """A kernel uses a construct whose compiled result the interpreter cannot reproduce and the shim
    does not fix: the launch is refused on the CPU (one line naming the construct and the kernel)
    rather than let a wrong CPU answer pass or fail a check."""


_LAUNCHED: list[str] = []  # the kernel each active interpreter launch runs (innermost last)


def _refuse(construct: str) -> None:
    kernel = _LAUNCHED[-1] if _LAUNCHED else "?"
    raise InterpreterConstructError(f"kernel {kernel}: {construct} is refused on the CPU: the Triton interpreter "
                                    f"computes it differently from compiled Triton (harness.shim); run it on a GPU")


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Exact decode of bf16 bit patterns (the interpreter's uint16 storage) to fp32."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, nearest even (``convert``, the shim's one definition)."""
    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    return _from_torch(convert(t, torch.bfloat16)).reshape(np.shape(values))


def _round_half(values: np.ndarray, dtype) -> np.ndarray:
    """Round fp32 values to ``dtype`` (bf16 or fp16) and return them as fp32 again."""
    if str(dtype) == "bf16":
        return _bf16_to_f32(_f32_to_bf16(values))
    return np.asarray(values, dtype=np.float32).astype(np.float16).astype(np.float32)


def _decode_half(data: np.ndarray, dtype) -> np.ndarray:
    return _bf16_to_f32(data) if str(dtype) == "bf16" else np.asarray(data).astype(np.float32)


def _encode_half(values: np.ndarray, dtype) -> np.ndarray:
    return _f32_to_bf16(values) if str(dtype) == "bf16" else np.asarray(values, dtype=np.float32).astype(np.float16)


def pairwise_half_sum(values: np.ndarray, axis: int, dtype) -> np.ndarray:
    """Sum fp32 ``values`` (each already a ``dtype`` value) along ``axis`` as a reduction in ``dtype``
    does on the GPU: every addition rounds to ``dtype``, in a tree (neighbours first, then pairs of
    pairs, as lanes combine). The GPU's order depends on the layout, so this agrees with a compiled
    sum to within its rounding, not bit for bit. Returns fp32 values of ``dtype``."""
    x = np.moveaxis(np.asarray(values, dtype=np.float32), axis, -1)
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1], dtype=np.float32)
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:  # an odd one out waits for the next level (adding 0 would be exact anyway)
            x = np.concatenate([x, np.zeros(x.shape[:-1] + (1,), dtype=np.float32)], axis=-1)
        x = _round_half(x[..., 0::2] + x[..., 1::2], dtype)
    return x[..., 0]


def _install_half_arithmetic(it, tl) -> None:
    """bf16 arithmetic inside a kernel, and bf16/fp16 reductions, computed as compiled Triton does.

    The interpreter keeps bf16 as uint16 bit patterns and hands them to numpy as integers: ``q * k``
    on bf16 multiplies the bit patterns, ``tl.sum`` adds them, ``tl.max`` and comparisons order them
    as unsigned integers (negative values above positive ones), ``tl.exp`` exponentiates them.
    Compiled Triton computes each bf16 operation in fp32 and rounds the result to bf16 (nearest
    even); for +, -, *, / and sqrt the fp32 result rounded to bf16 is the correctly rounded bf16
    result (fp32 has more than 2·8+2 bits), so this is exact per operation. An fma rounds from fp64.
    fp16 elementwise arithmetic is numpy's own half type, rounded per operation as on the GPU; only
    its sum and cumulative sum accumulated in fp32 (more accurate than the GPU): both half types now
    round every addition of a reduction or scan (``pairwise_half_sum``). Atomics on bf16 are refused
    (``InterpreterConstructError``)."""
    B = it.InterpreterBuilder
    bf16 = tl.bfloat16

    def is_bf16(h) -> bool:
        return getattr(h, "dtype", None) == bf16

    def up(h):
        return it.TensorHandle(_bf16_to_f32(h.data), tl.float32) if is_bf16(h) else h

    def round_back(out, dtype):
        data = out.data
        if data.dtype == np.float32:  # arithmetic; comparisons stay boolean
            data = _f32_to_bf16(data)
        return it.TensorHandle(data, dtype)

    orig_binary, orig_unary, orig_clamp = B.binary_op, B.unary_op, B.create_clampf
    orig_rsqrt, orig_erf = B.create_rsqrt, B.create_erf

    def binary_op(self, lhs, rhs, op):
        if not (is_bf16(lhs) or is_bf16(rhs)):
            return orig_binary(self, lhs, rhs, op)
        return round_back(orig_binary(self, up(lhs), up(rhs), op), lhs.dtype)

    def unary(orig):
        def call(self, arg, *rest):
            if not is_bf16(arg):
                return orig(self, arg, *rest)
            return round_back(orig(self, up(arg), *rest), arg.dtype)
        return call

    def clampf(self, arg, lo, hi, propagate_nans):
        if not is_bf16(arg):
            return orig_clamp(self, arg, lo, hi, propagate_nans)
        return round_back(orig_clamp(self, up(arg), up(lo), up(hi), propagate_nans), arg.dtype)

    def fma(self, x, y, z, _orig=B.create_fma):
        if not any(is_bf16(h) for h in (x, y, z)):
            return _orig(self, x, y, z)
        exact = np.add(np.multiply(up(x).data, up(y).data, dtype=np.float64), up(z).data, dtype=np.float64)
        return it.TensorHandle(_f32_to_bf16(exact.astype(np.float32)), z.dtype)

    def atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope, _orig=B.create_atomic_rmw):
        if is_bf16(val):
            _refuse("an atomic read-modify-write on bf16")
        return _orig(self, rmwOp, ptr, val, mask, sem, scope)

    B.binary_op, B.unary_op, B.create_clampf, B.create_fma = binary_op, unary(orig_unary), clampf, fma
    B.create_rsqrt, B.create_erf, B.create_atomic_rmw = unary(orig_rsqrt), unary(orig_erf), atomic_rmw

    def half(t) -> bool:
        return t.dtype in (bf16, tl.float16)

    R, S = it.ReduceOps, it.ScanOps
    orig_sum, orig_min_max, orig_cumsum, orig_cumprod = R.sum, R.min_max, S.cumsum, S.cumprod

    def reduce_sum(self, input):
        if not half(input):
            return orig_sum(self, input)
        x, axis = _decode_half(input.handle.data, input.dtype), self.axis
        if axis is None:
            x, axis = x.reshape(-1), 0
        total = pairwise_half_sum(x, axis, input.dtype)
        if self.keep_dims:
            total = np.expand_dims(total, axis) if self.axis is not None else total.reshape((1,) * input.handle.data.ndim)
        elif self.axis is None:
            return self.to_tensor(_encode_half(total, input.dtype).item(), input.dtype)
        return self.to_tensor(_encode_half(total, input.dtype), input.dtype)

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        input = input[0] if isinstance(input, tuple) else input
        if input.dtype != bf16:
            return orig_min_max(self, input, val_reduce_op, idx_reduce_op)
        x, kw = _bf16_to_f32(input.handle.data), {"axis": self.axis, "keepdims": self.keep_dims}
        val = self.to_tensor(_f32_to_bf16(np.asarray(val_reduce_op(x, **kw))), bf16) if val_reduce_op else None
        idx = self.to_tensor(idx_reduce_op(x, **kw), tl.int32) if idx_reduce_op else None
        return (val, idx) if val is not None and idx is not None else (val if val is not None else idx)

    def scan(orig, step):
        def call(self, input):
            if not half(input):
                return orig(self, input)
            x = np.moveaxis(_decode_half(input.handle.data, input.dtype), self.axis, -1).copy()
            for i in range(1, x.shape[-1]):  # a scan combines in order, rounding every step
                x[..., i] = _round_half(step(x[..., i - 1], x[..., i]), input.dtype)
            out = _encode_half(np.moveaxis(x, -1, self.axis), input.dtype)
            return [self.to_tensor(np.ascontiguousarray(out), input.dtype)]
        return call

    R.sum, R.min_max = reduce_sum, min_max
    S.cumsum, S.cumprod = scan(orig_cumsum, np.add), scan(orig_cumprod, np.multiply)

    orig_grid_call = it.GridExecutor.__call__

    def grid_call(self, *args, **kwargs):
        _LAUNCHED.append(getattr(self.fn, "__name__", "?"))
        try:
            return orig_grid_call(self, *args, **kwargs)
        finally:
            _LAUNCHED.pop()

    it.GridExecutor.__call__ = grid_call


BOOL_OP = "_vp_shim_bool_op"  # the names the rewritten kernels call (put into the interpreter's globals)
NOT_OP = "_vp_shim_not"


def bool_op(is_and: bool, *operands):
    """``a and b`` / ``a or b`` as compiled Triton's code generator evaluates it: operands in order;
    a Python value (a constexpr) short-circuits as in Python, a tensor never does; the tensors are
    combined elementwise (``logical_and`` / ``logical_or``) and a result made only of Python values is
    Python's. Each operand comes as a function, so a short-circuit skips the rest. Tensors that are
    not booleans are compared with 0 first (compiled Triton refuses them)."""
    import triton.language as tl

    tensors, value = [], None
    for operand in operands:
        value = operand()
        if isinstance(value, tl.tensor):
            tensors.append(value if value.dtype == tl.int1 else value != 0)
        elif bool(value) is not is_and:
            return value
    if not tensors:
        return value
    result = tensors[-1]
    for t in reversed(tensors[:-1]):
        result = t.logical_and(result) if is_and else t.logical_or(result)
    return result


def not_op(value):
    """``not x``: elementwise for a tensor (compiled Triton's ``__not__``), Python's for a Python value."""
    import triton.language as tl

    if isinstance(value, tl.tensor):
        return (value if value.dtype == tl.int1 else value != 0).__not__()
    return not value


def _install_boolean_operators(it, tl) -> None:
    """``and``, ``or`` and ``not`` on tensors, as compiled Triton computes them.

    The interpreter runs a kernel as Python, so ``a >= 0 and a < n`` asks Python whether the block
    ``a >= 0`` is true; the interpreter answers True for any tensor of more than one element and the
    expression returns ``a < n`` (``or`` returns ``a >= 0``; ``not mask`` returns False). Compiled
    Triton's code generator makes each an elementwise logical operation (vLLM's
    ``load_qq_bias_tile`` masks this way). The shim extends the interpreter's source rewrite (it
    already rewrites chained comparisons) to call ``bool_op`` / ``not_op`` instead."""
    import ast

    def thunk(expr):
        empty = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        return ast.Lambda(args=empty, body=expr)

    class Rewrite(type(it.FunctionRewriter.ast_transformer)):
        def visit_BoolOp(self, node):
            node = self.generic_visit(node)
            if any(isinstance(n, ast.NamedExpr) for v in node.values for n in ast.walk(v)):
                return node  # an assignment expression must bind in the kernel's scope: left to Python
            call = ast.Call(func=ast.Name(id=BOOL_OP, ctx=ast.Load()),
                            args=[ast.Constant(value=isinstance(node.op, ast.And)), *map(thunk, node.values)], keywords=[])
            return ast.copy_location(call, node)

        def visit_UnaryOp(self, node):
            node = self.generic_visit(node)
            if not isinstance(node.op, ast.Not):
                return node
            return ast.copy_location(ast.Call(func=ast.Name(id=NOT_OP, ctx=ast.Load()), args=[node.operand], keywords=[]), node)

    setattr(it, BOOL_OP, bool_op)  # _compile_and_exec copies the interpreter's globals into the kernel's
    setattr(it, NOT_OP, not_op)
    it.FunctionRewriter.ast_transformer = Rewrite()
