"""The interpreter conversion shim: the defects it fixes are re-measured here on every CI
run, its conversions are checked against an independent definition, and on a GPU against the
compiled kernels (the GPU is the judge)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from harness import shim

FP8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]
TL = {torch.bfloat16: tl.bfloat16, torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e4m3fnuz: tl.float8e4b8}


@triton.jit
def _cast_kernel(out_ptr, x_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)


def _kernel_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    _cast_kernel[(triton.cdiv(x.numel(), 1024),)](out, x, x.numel(), BLOCK=1024)
    return out


def _probe_values(device) -> torch.Tensor:
    """Ties, carries, subnormals, overflow, ±inf, NaN, and random values at every scale."""
    g = torch.Generator().manual_seed(0)
    special = [0.0, -0.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 7.9, 7.75, 448.0, 449.0, 464.0, 465.0, 480.0, 500.0, 1e6,
               240.0, 247.0, 248.0, 2 ** -9, 2 ** -10, 3 * 2 ** -10, 1e-3, 1e-7, float("inf"), float("-inf"), float("nan")]
    rnd = torch.randn(20000, generator=g) * torch.exp2(torch.randint(-14, 10, (20000,), generator=g).float())
    x = torch.cat([torch.tensor(special), -torch.tensor(special), rnd])
    return x.to(device)


def _expected(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Independent definition: nearest representable value, ties to even code, satfinite."""
    if dtype == torch.bfloat16:
        return x.cpu().to(torch.bfloat16)  # torch's own fp32 -> bf16 is RNE with inf/NaN kept
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).double()
    finite = torch.isfinite(codes)
    vals, idx = codes[finite], torch.arange(256)[finite]
    fmax = float(vals.max())
    xd = x.cpu().double()
    clamped = torch.where(torch.isnan(xd), xd, xd.clamp(-fmax, fmax))
    d = (clamped[:, None] - vals[None, :]).abs()
    best = d.min(dim=1, keepdim=True).values
    cand = (d == best) & ~(vals[None, :] == 0) | ((d == best) & (vals[None, :] == 0) & (torch.signbit(clamped)[:, None] == torch.signbit(vals)[None, :]))
    cand |= (d == best) & (vals[None, :] == 0) & (dtype == torch.float8_e4m3fnuz)
    even = (idx % 2 == 0)[None, :]
    pick = torch.where((cand & even).any(1), (cand & even).float().argmax(1), cand.float().argmax(1))
    out = idx[pick].to(torch.uint8)
    nan_code = 0x80 if dtype == torch.float8_e4m3fnuz else 0x7F
    out[torch.isnan(xd)] = nan_code
    return out.view(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, *FP8], ids=str)
def test_shim_conversion_matches_definition(dtype):
    x = _probe_values("cpu")
    got = shim.convert(x, dtype).view(torch.uint8 if dtype != torch.bfloat16 else torch.int16)
    want = _expected(x, dtype).view(torch.uint8 if dtype != torch.bfloat16 else torch.int16)
    bad = torch.nonzero(got != want).flatten()
    assert bad.numel() == 0, f"{bad.numel()} differ, e.g. x={x[bad[:5]].tolist()} got={got[bad[:5]].tolist()} want={want[bad[:5]].tolist()}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, *FP8], ids=str)
def test_kernel_cast_matches_shim(device, dtype):
    """Under the interpreter this checks the shim is installed and used by kernels; on a GPU
    it checks that the compiled conversion is what the shim claims (RNE + satfinite)."""
    if not device.interpreted and dtype == torch.float8_e4m3fnuz and device.fp8_format != "e4m3fnuz":
        pytest.skip("e4m3fnuz is not a native format on this GPU (covered under the interpreter)")
    x = _probe_values(device.torch_device)
    got = _kernel_cast(x, dtype).cpu()
    want = shim.convert(x.cpu(), dtype)
    iv = torch.int16 if dtype == torch.bfloat16 else torch.uint8
    differ = got.view(iv) != want.view(iv)
    if dtype == torch.bfloat16:  # NaN payloads are not part of any bf16 contract; NaN-ness is
        differ &= ~(torch.isnan(got.float()) & torch.isnan(want.float()))
    bad = torch.nonzero(differ).flatten()
    assert bad.numel() == 0, f"{bad.numel()} differ, e.g. x={x.cpu()[bad[:5]].tolist()} got={got.view(iv)[bad[:5]].tolist()} want={want.view(iv)[bad[:5]].tolist()}"


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_kernel_decodes_every_fp8_code(device, dtype):
    if not device.interpreted and dtype == torch.float8_e4m3fnuz and device.fp8_format != "e4m3fnuz":
        pytest.skip("e4m3fnuz is not a native format on this GPU")
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).to(device.torch_device)
    got = _kernel_cast(codes, torch.float32).cpu()
    want = codes.cpu().float()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok].view(torch.int32), want[ok].view(torch.int32))


def test_raw_interpreter_defects_still_exist():
    """The reason the shim exists, measured on the installed triton. If this fails, triton's
    interpreter got fixed: re-measure, then retire the corresponding part of the shim."""
    from triton.runtime import interpreter as it

    raw = it._convert_float.keywords["_orig"] if shim.installed() else it._convert_float
    x = np.array([1.0 + 2 ** -8 + 2 ** -12, 7.9], dtype=np.float32)
    bf = raw(x, tl.float32, tl.bfloat16, None).view(np.uint16)
    assert int(bf[0]) == 0x3F80, "fp32 -> bf16 truncation under the raw interpreter"
    f8 = raw(x, tl.float32, tl.float8e4nv, None)
    assert int(f8[1]) != 0x50, "7.9 -> fp8 mantissa carry defect under the raw interpreter"


def test_bf16_dot_is_upcast(device):
    @triton.jit
    def dot_kernel(o_ptr, a_ptr, b_ptr, N: tl.constexpr):
        r = tl.arange(0, N)
        a = tl.load(a_ptr + r[:, None] * N + r[None, :])
        b = tl.load(b_ptr + r[:, None] * N + r[None, :])
        tl.store(o_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))

    g = torch.Generator().manual_seed(1)
    a = torch.randn(16, 16, generator=g).bfloat16().to(device.torch_device)
    b = torch.randn(16, 16, generator=g).bfloat16().to(device.torch_device)
    o = torch.empty(16, 16, device=device.torch_device)
    dot_kernel[(1,)](o, a, b, N=16)
    want = a.double().cpu() @ b.double().cpu()
    assert ((o.cpu().double() - want).abs() / (want.abs() + 1e-3)).max() < 1e-3


@triton.jit
def _count_kernel(o_ptr, bounds_ptr, STEP: tl.constexpr):
    n = 0
    for _ in range(tl.load(bounds_ptr), tl.load(bounds_ptr + 1), STEP):  # bounds loaded from memory
        n += 1
    tl.store(o_ptr, n)


def test_loop_bounds_loaded_from_memory(device):
    """triton 3.6 (the H200 runner's) keeps a scalar loaded through a pointer as a 1-element
    array whose ``__index__`` numpy 2.4 refuses, so ``range()`` over loaded bounds (every
    verify_attention prefix loop) raised under its interpreter. Fails there without the shim's
    ``__index__`` (checked against triton 3.6.0 on CPU); triton 3.9 squeezes by itself."""
    bounds = torch.tensor([3, 40], dtype=torch.int32, device=device.torch_device)
    o = torch.zeros(1, dtype=torch.int32, device=device.torch_device)
    _count_kernel[(1,)](o, bounds, STEP=4)
    assert int(o.item()) == len(range(3, 40, 4))


def test_index_of_a_one_element_interpreter_tensor():
    """The same defect at its root, whatever the device: the interpreter's patched
    ``tl.tensor.__index__`` must read a 1-element handle (what triton 3.6 makes of a loaded scalar)."""
    from triton.runtime import interpreter as it

    shim.install()
    scope = it._LangPatchScope()
    it._patch_lang_tensor(tl.tensor, scope)
    try:
        t = tl.tensor(it.TensorHandle(np.array([5], dtype=np.int32), tl.int32), tl.int32)
        assert list(range(t)) == [0, 1, 2, 3, 4]
    finally:
        scope.restore()


@triton.jit
def _cast_rtz_kernel(out_ptr, x_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtz"), mask=mask)


def _expected_rtz(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Independent definition of round toward zero: of every finite code, the one of largest
    magnitude not above |x| (found among all 65,536 codes), with x's sign; ±inf and NaN kept."""
    codes = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype).double()
    mags = codes[torch.isfinite(codes) & (codes >= 0)].unique()  # sorted, +0 first
    xd = x.cpu().double()
    i = torch.searchsorted(mags, xd.abs().nan_to_num(posinf=float(mags.max())), right=True) - 1
    out = (mags[i] * torch.where(torch.signbit(xd), -1.0, 1.0)).to(dtype)
    return torch.where(torch.isfinite(xd), out, xd.to(dtype))


RTZ = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", RTZ, ids=str)
def test_shim_round_toward_zero_matches_definition(dtype):
    x = _probe_values("cpu")
    got, want = shim.convert(x, dtype, "rtz"), _expected_rtz(x, dtype)
    differ = (got.view(torch.int16) != want.view(torch.int16)) & ~(torch.isnan(got) & torch.isnan(want))
    bad = torch.nonzero(differ).flatten()
    assert bad.numel() == 0, f"{bad.numel()} differ, e.g. x={x[bad[:5]].tolist()} got={got[bad[:5]].tolist()} want={want[bad[:5]].tolist()}"
    assert (got != shim.convert(x, dtype)).any()  # the probe values tell the two modes apart


@pytest.mark.parametrize("dtype", RTZ, ids=str)
def test_kernel_round_toward_zero_cast_matches_shim(device, dtype):
    """A kernel's ``fp_downcast_rounding="rtz"`` reaches the shim under the interpreter (planted:
    the shim converting every mode to nearest even fails here), and on a GPU the compiled
    ``cvt.rz`` is what the shim claims."""
    x = _probe_values(device.torch_device)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    _cast_rtz_kernel[(triton.cdiv(x.numel(), 1024),)](out, x, x.numel(), BLOCK=1024)
    got, want = out.cpu(), shim.convert(x.cpu(), dtype, "rtz")
    differ = (got.view(torch.int16) != want.view(torch.int16)) & ~(torch.isnan(got) & torch.isnan(want))
    bad = torch.nonzero(differ).flatten()
    assert bad.numel() == 0, f"{bad.numel()} differ, e.g. x={x.cpu()[bad[:5]].tolist()} got={got[bad[:5]].tolist()} want={want[bad[:5]].tolist()}"


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_round_toward_zero_to_fp8_is_refused_not_rounded_to_nearest(device, dtype):
    """Compiled Triton on NVIDIA has no round-toward-zero fp8 conversion: a kernel asking for one
    must fail on the CPU, not pass every check with nearest-even bytes."""
    x = _probe_values("cpu")
    with pytest.raises(shim.ShimRoundingError, match="round-toward-zero"):
        shim.convert(x, dtype, "rtz")
    if not device.interpreted:
        return  # the kernel path below goes through the shim only under the interpreter
    out = torch.empty(x.shape, dtype=dtype)
    with pytest.raises(Exception, match="round-toward-zero") as err:  # the interpreter wraps it
        _cast_rtz_kernel[(triton.cdiv(x.numel(), 1024),)](out, x, x.numel(), BLOCK=1024)
    assert isinstance(err.value, shim.ShimRoundingError) or isinstance(err.value.__cause__, shim.ShimRoundingError)


def test_type_caches_answer_as_the_interpreter_does(device):
    """``shim._install_type_caches`` (speed only): the remembered numpy dtype of a Triton type and the checked
    block shape are the interpreter's own answers, per type and per shape, and a refused shape is refused
    again (never remembered as valid)."""
    if not device.interpreted:
        pytest.skip("the shim is installed under the Triton interpreter only")
    from triton.language import core
    from triton.runtime import interpreter as it

    want = [(tl.float32, np.float32), (tl.bfloat16, np.uint16), (tl.float8e4nv, np.uint8), (tl.int64, np.int64),
            (tl.int1, np.bool_), (tl.pointer_type(tl.bfloat16), np.uint64)]
    for _ in range(2):  # first computed, then remembered: the same answers
        for tt, np_dtype in want:
            assert it._get_np_dtype(tt) == np.dtype(np_dtype), tt
            if not isinstance(tt, tl.pointer_type):  # a block of them: its element's (a block of pointers: uint64)
                assert it._get_np_dtype(tl.block_type(tt, [16, 32])) == np.dtype(np_dtype), tt
        assert it._get_np_dtype(tl.block_type(tl.pointer_type(tl.float32), [8])) == np.dtype(np.uint64)
        assert core.validate_block_shape([16, 32]) == 512 and core.validate_block_shape((1,)) == 1
        with pytest.raises(ValueError, match="power of 2"):
            core.validate_block_shape([16, 3])
        with pytest.raises(TypeError, match="Shape element 0"):
            core.validate_block_shape([2.0])
