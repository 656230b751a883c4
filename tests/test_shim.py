"""The interpreter conversion shim: the defects it fixes are re-measured here on every CI
run, its conversions are checked against an independent definition, and on a GPU against the
compiled kernels (the GPU is the judge)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice  # a module global, as vLLM's kernels have theirs (compiled
# Triton refuses an import statement inside a kernel)

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


@triton.jit
def _dot_kernel(o_ptr, a_ptr, b_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(o_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))


def test_bf16_dot_is_upcast(device):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(16, 16, generator=g).bfloat16().to(device.torch_device)
    b = torch.randn(16, 16, generator=g).bfloat16().to(device.torch_device)
    o = torch.empty(16, 16, device=device.torch_device)
    _dot_kernel[(1,)](o, a, b, N=16)
    want = a.double().cpu() @ b.double().cpu()
    assert ((o.cpu().double() - want).abs() / (want.abs() + 1e-3)).max() < 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_dot_of_each_input_format_is_exact_on_integers(device, dtype):
    """``tl.dot`` of bf16 / fp16 / fp8 operands holding small integers (each exact in the format, every
    product and partial sum exact in fp32) equals the fp64 product bit for bit: an operand decoded wrongly
    on its way to fp32 (the shim's upcast before numpy's fp32 matmul) shows as a wrong integer."""
    g = torch.Generator().manual_seed(2)
    a = torch.randint(-8, 9, (32, 32), generator=g).to(dtype)  # K = 32: compiled fp8 dots need K >= 32
    b = torch.randint(-8, 9, (32, 32), generator=g).to(dtype)
    o = torch.empty(32, 32, device=device.torch_device)
    _dot_kernel[(1,)](o, a.to(device.torch_device), b.to(device.torch_device), N=32)
    want = a.double() @ b.double()
    assert torch.equal(o.cpu().double(), want)


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


# --- Arithmetic and boolean operators of vendor kernels (issue 35, wall 4) -------------------------
# Mini kernels modelled on vLLM 0.34.0's Triton kernels. ``measure`` runs them and returns what they
# computed; the test below runs it once in a subprocess under the raw interpreter (no shim: each
# defect re-measured on the installed triton) and once here (with the shim under the interpreter,
# compiled on a GPU: the GPU is the judge).

BF16_U = 2.0 ** -8  # unit roundoff of bf16 (8 significant bits, nearest even)


@triton.jit
def _mha_decode_tile_kernel(o_ptr, qk_ptr, q_ptr, k_ptr, v_ptr, sm_scale, N, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key tile of vLLM's MHA decode step (``_fwd_kernel_stage1`` in triton_decode_attention.py,
    taken when there is one query head per KV head): q·k as ``tl.sum(q[None, :] * k, 1)`` on bf16
    operands (bf16 products, a bf16 sum), the runtime fp32 ``sm_scale`` promoting the scores to fp32,
    then a softmax and ``tl.sum(p[:, None] * v, 0)``."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    key_ok = offs_n < N
    q = tl.load(q_ptr + offs_d)  # bf16, not upcast
    k = tl.load(k_ptr + offs_n[:, None] * D + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    qk = tl.sum(q[None, :] * k, 1)
    qk *= sm_scale
    qk = tl.where(key_ok, qk, float("-inf"))
    p = tl.exp(qk - tl.max(qk, 0))
    v = tl.load(v_ptr + offs_n[:, None] * D + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    tl.store(qk_ptr + offs_n, qk, mask=key_ok)
    tl.store(o_ptr + offs_d, tl.sum(p[:, None] * v, 0) / tl.sum(p, 0))


@triton.jit
def _bf16_order_kernel(max_ptr, lt_ptr, x_ptr, y_ptr, BLOCK: tl.constexpr):
    """bf16 ordering: ``tl.max`` and ``<`` on bf16 values of both signs."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(max_ptr, tl.max(x, 0))
    tl.store(lt_ptr + offs, (x < y).to(tl.int32))


@triton.jit
def _half_ops_kernel(prod_ptr, sum_ptr, x_ptr, y_ptr, BLOCK: tl.constexpr):
    """fp16 or bf16: elementwise product, and the sum of ``x`` (a reduction in the half type)."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(prod_ptr + offs, x * y)
    tl.store(sum_ptr, tl.sum(x, 0))


@triton.jit
def _qq_bias_tile(qq_bias_row_ptr, seq_offset, context_len, qq_bias_stride_0):
    """vLLM's ``load_qq_bias_tile`` (triton_attention_helpers.py): a key is a query key when its
    position relative to the context is in [0, stride), masked with Python ``and`` on tensors."""
    key_rel_pos = seq_offset - context_len
    is_query_key = key_rel_pos >= 0 and key_rel_pos < qq_bias_stride_0
    return tl.load(qq_bias_row_ptr + key_rel_pos, mask=is_query_key, other=0.0)


@triton.jit
def _float_argument_kernel(out_ptr, x_ptr, scale):
    """A bf16 value times a runtime float argument: compiled Triton passes ``scale`` as an fp32 scalar, so the
    product is fp32 (vLLM's ``qk *= sm_scale`` after a bf16 ``tl.sum``)."""
    tl.store(out_ptr, tl.load(x_ptr) * scale)


@triton.jit
def _boolean_ops_kernel(o_ptr, bias_ptr, context_len, n_query, FLAG: tl.constexpr, BLOCK: tl.constexpr):
    """Row 0: the qq-bias tile (``and``); row 1: keys outside the queries (``or``); row 2: ``not`` of
    row 1; row 3: a constexpr ``and`` a tensor."""
    offs = tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, _qq_bias_tile(bias_ptr, offs, context_len, n_query))
    outside = offs < context_len or offs >= context_len + n_query
    tl.store(o_ptr + BLOCK + offs, outside.to(tl.float32))
    inside = not outside
    tl.store(o_ptr + 2 * BLOCK + offs, inside.to(tl.float32))
    tl.store(o_ptr + 3 * BLOCK + offs, (FLAG and offs >= 3).to(tl.float32))


def measure(torch_device) -> dict:
    """Run the mini kernels on ``torch_device``; return what they computed and what is right (lists)."""
    g = torch.Generator().manual_seed(35)
    dev = torch.device(torch_device)
    out: dict = {}
    # the MHA decode tile: scores against fp64, bounded for any summation order (D roundings of
    # the bf16 sum, one of each product), and the output against fp64 attention over those scores
    N, D = 12, 64
    q = torch.randn(D, generator=g).bfloat16()
    k = torch.randn(16, D, generator=g).bfloat16()
    v = torch.randn(16, D, generator=g).bfloat16()
    o, qk = torch.zeros(D, device=dev), torch.zeros(16, device=dev)
    _mha_decode_tile_kernel[(1,)](o, qk, q.to(dev), k.to(dev), v.to(dev), 0.125, N, D=D, BLOCK_N=16)
    terms = q.double()[None, :] * k.double()[:N]
    exact = terms.sum(1) * 0.125
    bound = (D + 1) * BF16_U * terms.abs().sum(1) * 0.125
    out["qk_err_over_bound"] = float(((qk.cpu()[:N].double() - exact).abs() / bound).max())
    p = torch.softmax(qk.cpu()[:N].double(), 0)
    want_o = p @ v.double()[:N]
    out["o_rel_err"] = float((o.cpu().double() - want_o).abs().max() / want_o.abs().max())
    # bf16 ordering
    x = torch.tensor([-1.0, -2.0, 0.5, -3.0, 0.25, -0.5, 2.0, -8.0]).bfloat16()
    y = torch.tensor([-2.0, -1.0, -0.5, 0.5, 0.25, -0.25, 4.0, -9.0]).bfloat16()
    mx, lt = torch.zeros(1, dtype=torch.bfloat16, device=dev), torch.zeros(8, dtype=torch.int32, device=dev)
    _bf16_order_kernel[(1,)](mx, lt, x.to(dev), y.to(dev), BLOCK=8)
    out["bf16_max"], out["bf16_max_want"] = float(mx.cpu()), float(x.max())
    out["bf16_lt"], out["bf16_lt_want"] = lt.cpu().tolist(), (x < y).int().tolist()
    # half products (exact: one rounding of an exact product) and sums of the half type
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        xs = (torch.randn(32, generator=g) * 4).to(dtype)
        ys = (torch.randn(32, generator=g) * 4).to(dtype)
        prod, tot = torch.zeros(32, dtype=dtype, device=dev), torch.zeros(1, dtype=dtype, device=dev)
        _half_ops_kernel[(1,)](prod, tot, xs.to(dev), ys.to(dev), BLOCK=32)
        out[f"{name}_prod_bits"] = prod.cpu().view(torch.int16).tolist()
        out[f"{name}_prod_want_bits"] = (xs.float() * ys.float()).to(dtype).view(torch.int16).tolist()
        ex = xs.double().sum()
        out[f"{name}_sum_err_over_bound"] = float((tot.cpu().double() - ex).abs().item() / (32 * torch.finfo(dtype).eps / 2 * xs.double().abs().sum()))
    # a sum whose additions all round (fp16): 2048 then ones; accumulating in fp32 keeps every one
    ones = torch.tensor([2048.0] + [1.0] * 7, dtype=torch.float16)
    tot = torch.zeros(1, dtype=torch.float16, device=dev)
    _half_ops_kernel[(1,)](torch.zeros(8, dtype=torch.float16, device=dev), tot, ones.to(dev), torch.ones_like(ones, device=dev), BLOCK=8)
    out["fp16_sum_2048_ones"] = float(tot.cpu())
    # a runtime float argument: 1.0078125 (bf16) x 1.0078125 is 1.01574707 in fp32, 1.015625 once rounded to bf16
    x = torch.tensor([1.0078125], dtype=torch.bfloat16)
    prod = torch.zeros(1, device=dev)
    _float_argument_kernel[(1,)](prod, x.to(dev), 1.0078125)
    out["float_arg"], out["float_arg_want"] = float(prod.cpu()), float(x.float() * 1.0078125)
    # boolean operators: the bias row sits after 16 sentinels that a wrong mask reads
    buf = torch.cat([torch.full((16,), 999.0), torch.arange(1.0, 17.0)]).to(dev)
    o = torch.zeros(4 * 16, device=dev)
    _boolean_ops_kernel[(1,)](o, buf[16:], 5, 4, FLAG=True, BLOCK=16)
    offs = torch.arange(16)
    rel = offs - 5
    want_bias = torch.where((rel >= 0) & (rel < 4), rel.float() + 1, 0.0)
    outside = (offs < 5) | (offs >= 9)
    out["bool"] = o.cpu().view(4, 16).tolist()
    out["bool_want"] = torch.stack([want_bias, outside.float(), (~outside).float(), (offs >= 3).float()]).tolist()
    return out


@pytest.fixture(scope="module")
def raw_measurement(device):
    """``measure`` under the raw interpreter of the installed triton, in a fresh process (no shim)."""
    if not device.interpreted:
        pytest.skip("measures the CPU interpreter the shim patches; a GPU runner's kernels never run under it (and "
                    "Triton 3.6's interpreter there has no bf16 builder at all)")
    import json
    import subprocess
    import sys

    from tests.helpers import ROOT, subprocess_env

    code = "import json, tests.test_shim as t; print(json.dumps(t.measure('cpu')))"
    env = subprocess_env(TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_raw_interpreter_arithmetic_and_boolean_defects_still_exist(raw_measurement):
    """The reasons for the shim's arithmetic and boolean parts, re-measured on the installed triton.
    If one of these fails, triton fixed that defect: retire that part of the shim."""
    m = raw_measurement
    assert not m["qk_err_over_bound"] < 1, "bf16 q*k and its sum (bit patterns multiplied and added)"
    assert m["bf16_max"] == m["bf16_max_want"], "tl.max upcast bf16 to fp32 itself (triton.language.standard)"
    assert m["bf16_lt"] != m["bf16_lt_want"], "< on bf16 orders bit patterns as unsigned integers"
    assert m["bf16_prod_bits"] != m["bf16_prod_want_bits"], "bf16 elementwise product"
    assert m["fp16_prod_bits"] == m["fp16_prod_want_bits"], "fp16 products were right (numpy's half type)"
    assert m["fp16_sum_2048_ones"] == 2056.0, "an fp16 sum accumulated in fp32, rounded once (2055 -> 2056)"
    for row, what in enumerate(["`and` (qq-bias mask)", "`or`", "`not`"]):
        assert m["bool"][row] != m["bool_want"][row], f"{what} on tensors"
    assert m["bool"][3] == m["bool_want"][3], "a constexpr `and` a tensor was right"
    assert m["float_arg"] != m["float_arg_want"], "a float argument times bf16 stayed bf16 (a weak Python scalar)"


def test_vendor_style_arithmetic_and_boolean_operators_are_right(device):
    """The same kernels, here: with the shim under the interpreter, compiled on a GPU."""
    m = measure(device.torch_device)
    assert m["qk_err_over_bound"] < 1 and m["o_rel_err"] < 1e-3, m
    assert m["bf16_max"] == m["bf16_max_want"] and m["bf16_lt"] == m["bf16_lt_want"]
    assert m["bf16_prod_bits"] == m["bf16_prod_want_bits"] and m["fp16_prod_bits"] == m["fp16_prod_want_bits"]
    assert m["bf16_sum_err_over_bound"] < 1 and m["fp16_sum_err_over_bound"] < 1, m
    assert m["bool"] == m["bool_want"], m["bool"]
    assert m["float_arg"] == m["float_arg_want"], (m["float_arg"], m["float_arg_want"])  # an fp32 argument


def test_half_sums_round_every_addition(device):
    """Under the interpreter a reduction in fp16 rounds after every addition, as compiled Triton's
    does (in a tree; the GPU's order is its layout's, so on a GPU only the bound above holds):
    2048 then seven ones sums to 2054, not the 2056 of an fp32 accumulator rounded once."""
    if not device.interpreted:
        pytest.skip("the GPU's summation order is its layout's; test_vendor_style_* bounds it")
    assert measure(device.torch_device)["fp16_sum_2048_ones"] == 2054.0


def test_pairwise_half_sum_rounds_per_level():
    x = np.array([[2048.0] + [1.0] * 7], dtype=np.float32)
    assert shim.pairwise_half_sum(x, 1, tl.float16).tolist() == [2054.0]  # (2048+1)->2048, then 2+2+2 exact
    assert shim.pairwise_half_sum(np.zeros((3, 0), np.float32), 1, tl.bfloat16).tolist() == [0.0, 0.0, 0.0]


def test_atomic_add_on_bf16_is_refused_naming_the_kernel(device):
    if not device.interpreted:
        pytest.skip("the refusal is the interpreter's; compiled atomics on bf16 are the GPU's")

    @triton.jit
    def bf16_atomic_kernel(o_ptr, x_ptr):
        tl.atomic_add(o_ptr, tl.load(x_ptr))

    o, x = torch.zeros(1, dtype=torch.bfloat16), torch.ones(1, dtype=torch.bfloat16)
    with pytest.raises(Exception, match="kernel bf16_atomic_kernel: an atomic read-modify-write on bf16 is refused on the CPU"):
        bf16_atomic_kernel[(1,)](o, x)


def test_type_caches_answer_as_the_interpreter_does(device):
    """``shim._install_type_caches`` (speed only): the remembered numpy dtype of a Triton type and the checked
    block shape are the interpreter's own answers, per type and per shape, and a refused shape is refused
    again (never remembered as valid), also after a shape equal to it as a key ([2] and [2.0]) was accepted:
    it failed after tests/test_timelines.py had validated [2] in the same process."""
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
        assert core.validate_block_shape([2]) == 2  # its int twin remembered first: (2.0,) == (2,) as keys
        with pytest.raises(TypeError, match="Shape element 0"):
            core.validate_block_shape([2.0])


def _interpreted_only(device):
    if not device.interpreted:
        pytest.skip("the shim is installed under the Triton interpreter only")


def test_shared_block_types_are_what_the_constructor_builds(device):
    """``shim._install_shared_types`` (speed only): a shared ``block_type`` is, for every (element, shape),
    the one the constructor builds: its element is the very object passed (two equal pointer types stay
    two), its shape, size and name those of that shape, whatever was built before it; a shape of
    constexprs and a refused shape take the constructor's path."""
    _interpreted_only(device)
    import math

    from triton.language import core
    from triton.runtime import interpreter as it

    p1, p2 = tl.pointer_type(tl.float32), tl.pointer_type(tl.float32)  # equal, not the same object
    elements = [tl.float32, tl.bfloat16, tl.int32, tl.int1, p1, p2]
    shapes = [[16], [32], [16, 32], [32, 16], (1, 64), [2, 4, 8]]
    for _ in range(2):  # first built, then shared: the same answers
        for el in elements:
            for shape in shapes:
                for given in (list(shape), tuple(shape), core.tuple(list(shape))):
                    bt = tl.block_type(el, given)
                    assert bt.element_ty is el, (el, shape)
                    assert list(bt.shape) == list(shape) and bt.numel == math.prod(shape), (el, shape, bt)
                    assert bt.name == f"<{core.tuple(list(shape))}, {el}>", bt.name
                    assert bt.with_element_ty(tl.float16) == tl.block_type(tl.float16, list(shape))
        assert tl.block_type(tl.float32, [16]) is tl.block_type(tl.float32, [16])  # shared, as installed
        assert tl.block_type(p1, [8]).element_ty is p1 and tl.block_type(p2, [8]).element_ty is p2
        assert list(tl.block_type(tl.float32, [tl.constexpr(8), 4]).shape) == [8, 4]
        for el in elements:  # the interpreter's pointer types: shared per (element object, address space)
            for space in (1, 3):
                ptr = it.interpreter_builder.get_ptr_ty(el, space)
                assert ptr.element_ty is el and ptr.address_space == space and ptr == tl.pointer_type(el, space)
        with pytest.raises(ValueError, match="power of 2"):
            tl.block_type(tl.float32, [16, 3])
        with pytest.raises(TypeError, match="0d block_type"):
            tl.block_type(tl.float32, [])


def test_shared_tensor_shapes_and_dtype_equality(device):
    """A tensor's ``numel`` and constexpr ``shape`` are its own type's (remembered per type object), and
    ``dtype == x`` answers as ``dtype.__eq__`` does (names; a constexpr unwrapped; a non-dtype unequal)."""
    _interpreted_only(device)
    from triton.language import core

    types = [tl.block_type(tl.float32, [16, 32]), tl.block_type(tl.float32, [32, 16]), tl.block_type(tl.int32, [8]),
             tl.float32, tl.pointer_type(tl.int8)]
    for _ in range(2):
        for ty in types:
            t = core.tensor(None, ty)
            want = list(ty.shape) if ty.is_block() else []
            assert [s.value for s in t.shape] == want and t.numel.value == int(np.prod(want)), ty
            assert t.type is ty and t.dtype == ty.scalar
    scalars = [tl.float32, tl.bfloat16, tl.float16, tl.int32, tl.uint32, tl.int8, tl.int1, tl.float8e4nv, tl.float8e5]
    for a in scalars:
        for b in scalars:
            assert (a == b) is (a.name == b.name) and (a != b) is (a.name != b.name), (a, b)
    assert tl.float32 == tl.float32 and tl.float32 != tl.bfloat16 and tl.float32 == tl.constexpr(tl.float32)
    assert tl.float32 != "fp32" and tl.float32 != tl.pointer_type(tl.float32)
    assert tl.float32 != tl.block_type(tl.float32, [16]) and tl.block_type(tl.float32, [16]) != tl.float32


@triton.jit
def _shapes_kernel(o_ptr, s_ptr, x_ptr, y_ptr, R: tl.constexpr, C: tl.constexpr):
    rows, cols = tl.arange(0, R), tl.arange(0, C)
    x = tl.load(x_ptr + rows)  # (R,) fp32
    y = tl.load(y_ptr + cols).to(tl.float32)  # (C,) bf16 -> fp32
    outer = x[:, None] * y[None, :] + rows[:, None]  # (R, C): broadcast of (R, 1) and (1, C); int + fp32
    same = outer + outer * 2  # two blocks of one shape: no broadcast
    tl.store(o_ptr + rows[:, None] * C + cols[None, :], same + tl.sum(outer, axis=1)[:, None])
    tl.store(s_ptr + tl.arange(0, 4), tl.where(tl.arange(0, 4) < 2, outer.shape[0], same.shape[1]))  # the types' shapes


def test_kernels_of_several_shapes_in_turn_compute_each_its_own(device):
    """One kernel at several (R, C) one after the other, and again: every launch's result is its own shape's
    (a shared type or shape remembered under a wrong key would give a wrong shape or broadcast)."""
    _interpreted_only(device)
    for _ in range(2):
        for R, C in [(4, 8), (8, 4), (16, 16), (4, 16), (1, 8), (8, 1)]:
            x = torch.arange(R, dtype=torch.float32) / 4
            y = (torch.arange(C, dtype=torch.float32) - 3).to(torch.bfloat16)
            o, s = torch.empty(R, C, dtype=torch.float32), torch.empty(4, dtype=torch.int32)
            _shapes_kernel[(1,)](o, s, x, y, R=R, C=C)
            assert s.tolist() == [R, R, C, C], (R, C, s.tolist())  # the result's type has the broadcast shape
            outer = x[:, None] * y.float()[None, :] + torch.arange(R, dtype=torch.float32)[:, None]
            torch.testing.assert_close(o, outer * 3 + outer.sum(1, keepdim=True), rtol=0, atol=1e-6, msg=f"{R}x{C}")


@triton.jit
def _upcast_kernel(o_ptr, x_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.load(x_ptr + offs).to(tl.float32))


def test_bf16_upcast_is_convert_for_every_code(device):
    """A kernel's bf16 -> fp32 upcast (the shim's numpy path under the interpreter: exact, no rounding) gives,
    for each of the 65,536 bf16 codes (NaN payloads and -0 included), the bits of ``convert``'s torch upcast."""
    codes = torch.from_numpy(np.arange(65536, dtype=np.int32).astype(np.int16)).view(torch.bfloat16)
    o = torch.empty(65536, dtype=torch.float32, device=device.torch_device)
    _upcast_kernel[(64,)](o, codes.to(device.torch_device), BLOCK=1024)
    want = shim.convert(codes, torch.float32)
    assert torch.equal(o.cpu().view(torch.int32), want.view(torch.int32))


def test_remembered_promotions_are_the_interpreters(device):
    """The promoted type of a binary op, remembered per (types, flags), is ``computation_type_impl``'s own
    answer for every pair of scalar types and every flag, asked twice; a refused pair is refused again."""
    _interpreted_only(device)
    from triton.runtime import interpreter as it

    sem, uncached = it.interpreter_semantic, shim.UNCACHED["computation_type_impl"]
    scalars = [tl.float64, tl.float32, tl.bfloat16, tl.float16, tl.float8e4nv, tl.float8e5, tl.int64, tl.int32,
               tl.uint32, tl.int16, tl.int8, tl.uint8, tl.int1]

    def answer(fn, *args):
        try:
            return fn(*args)
        except (TypeError, ValueError) as e:
            return type(e)

    for _ in range(2):
        for a in scalars:
            for b in scalars:
                for flags in [(False, False, False), (True, False, False), (False, True, False), (False, False, True),
                              (True, False, True), (False, True, True)]:
                    args = (a, flags[0], b, flags[1], flags[2])
                    assert answer(sem.computation_type_impl, *args) == answer(uncached, sem, *args), args


# ----------------------------------------------------------------------------- libdevice under the interpreter

@triton.jit
def _libdevice_log1p_kernel(out_ptr, x_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(out_ptr + offs, libdevice.log1p(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


@triton.jit
def _libdevice_exp10_kernel(out_ptr, x_ptr):
    tl.store(out_ptr, libdevice.exp10(tl.load(x_ptr)))


def test_libdevice_log1p_matches_its_definition(device):
    """``libdevice.log1p`` (vLLM's resample kernel): the interpreter has no libdevice (each stub returns
    None); the shim computes it with numpy. Compiled on a GPU, the GPU's own log1pf. Both within 2 ulp
    of the fp64 value, -inf at -1, NaN below (vLLM feeds it -ratio with ratio up to inf)."""
    x = torch.tensor([0.0, 1e-8, -1e-8, 0.3, -0.5, -0.999, 3.0, 1e6, -1.0, -2.0, float("inf"), float("-inf")])
    out = torch.empty_like(x, device=device.torch_device)
    _libdevice_log1p_kernel[(1,)](out, x.to(device.torch_device), x.numel(), BLOCK=16)
    got, want = out.cpu(), torch.log1p(x.double())
    ok = torch.isfinite(want)
    ulp = (want[ok].float().nextafter(torch.tensor(float("inf"))) - want[ok].float()).double()
    assert ((got[ok].double() - want[ok]).abs() <= 2 * ulp).all(), (got, want)
    assert got[-4] == float("-inf") and torch.isnan(got[-3]) and got[-2] == float("inf") and torch.isnan(got[-1])


def test_the_shim_leaves_libdevice_alone_outside_an_interpreted_launch():
    """Installed in a process that also compiles kernels (a GPU test worker that ran an interpreter test),
    the shim must leave compiled kernels the real libdevice: on the H100 (2026-12-07) a module-wide stand-in
    made Triton refuse ``libdevice.log1p`` ("Unsupported function referenced"). Its stand-ins live in an
    interpreted launch's patch scope only."""
    shim.install()
    members = {n: m for n, m in vars(libdevice).items() if callable(m) and not n.startswith("_")}
    assert "log1p" in members and all(m.__module__ == libdevice.__name__ for m in members.values()
                                      if hasattr(m, "__module__") and not isinstance(m, type)), members


def test_libdevice_without_a_numpy_form_is_refused_by_name(device):
    if not device.interpreted:
        pytest.skip("the refusal is the interpreter's; compiled libdevice calls are the GPU's")
    x, out = torch.ones(1), torch.zeros(1)
    with pytest.raises(Exception, match="kernel _libdevice_exp10_kernel: libdevice.exp10 .*is refused on the CPU"):
        _libdevice_exp10_kernel[(1,)](out, x)
