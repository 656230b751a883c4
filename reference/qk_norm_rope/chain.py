"""qk RMSNorm + RoPE for DeepSeek-V4-style MQA (seed 000) — the unfused reference chain.

Launches of the unfused chain, in order:
  1. ``q_norm_rope(q)``   per head: RMSNorm (optional weight) then RoPE on the last R dims.
  2. ``kv_norm_rope(kv)`` RMSNorm with ``kv_norm_weight`` then RoPE on the last R dims.
  3. ``ring_store(kv_out, ring, loc)`` — unified KV, decode only (1-source consumer). In
     target-verify the backend stores the chunk itself, causally indexed, so this step is
     skipped here.
  3'. ``swa_paged_store(kv_out, swa_cache, loc, page_size)`` — non-unified KV, every mode: the
     backend's own store of the SWA cache (fp8 quantisation + paged scatter; ``reference.qk_norm_rope.swa``).

Math (fp32, one bf16 rounding at the end of each launch):
  y = x * rsqrt(mean(x²) + eps) * w
  RoPE on y[..., D-R:] with angle table (cos, sin)[position]:
    interleaved (GPT-J pairs (2i, 2i+1)) or neox (halves (i, i + R/2)):
    a' = a·cos − b·sin,  b' = b·cos + a·sin.
  ``bf16_norm`` (the precision class ``bf16-norm``, harness.tolerance): y rounded to bf16 before RoPE
  reads it, as a kernel keeping the unfused model's RMSNorm-then-RoPE rounding does. Which bf16 value a
  y next to a rounding midpoint lands on then turns on a kernel's free fp32 choices, which the chain
  can take too (the spec's ``rounding_variants``): ``rsqrt_ulps`` (an approximate rsqrt, e.g. CUDA's
  rsqrtf, 2 ulps) and ``rope_fma`` (a compiler contracting one product of a·c − b·s into an FMA).

``qk_norm_rope_oracle`` computes the same function in fp64 through a different formulation
(complex rotation), unrounded. The paged store has no fp64 counterpart: its contract is the
decoded row against the oracle's kv row within the fp8 rounding (``swa.swa_decode``), and its bytes
are an exact function of the bf16 row it is given (``swa.swa_encode``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.checks import (
    RangeError,
    ShapeError,
    VerifyParityInputError,
    check_choice,
    check_bool,
    check_contiguous,
    check_dtype,
    check_fp32_scale,
    check_index,
    check_index_values,
    check_inner_contiguous,
    check_int,
    check_rank,
    check_same_device,
    check_shape,
)
from reference.launches import launch
# the paged SWA cache (launch 3'): its model lives in reference.qk_norm_rope.swa
from reference.qk_norm_rope.swa import SwaLayout, swa_paged_store, validate_swa

ROPE_STYLES = ("interleaved", "neox")
# forward modes of the prepare step: only "decode" stores into the ring here (launch 3); in
# "target_verify" (and "extend") the backend stores the chunk itself
FORWARD_MODES = ("extend", "decode", "target_verify")
ACT_DTYPES = (torch.bfloat16,)
WEIGHT_DTYPES = (torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def validate(*, q, kv, kv_norm_weight, q_norm_weight, eps, rope_dim, cos, sin, positions, rope_style,
             ring, loc, q_out, swa_cache=None, swa_page_size=None, check_values: bool = True
             ) -> tuple[int, int, int]:
    """Check every argument; return (T, H, D). Shared by the reference and the fused wrapper.

    T = 0 (and H = 0) is legal: empty outputs, nothing stored. eps: a positive normal fp32 number;
    rope_dim: an int, a positive even divisor of D; positions, loc: contiguous int tensors.
    Store target: ``ring`` (unified KV, bf16 rows) or ``swa_cache`` with ``swa_page_size`` (non-unified,
    the paged fp8 pool, ``validate_swa``), never both; ``loc`` comes with either and indexes its rows
    (ring) or token slots (``num_pages · page_size`` of them); negative entries are padding, the
    others distinct. The values of positions and loc are checked last, in one host sync, and only
    with ``check_values`` (``reference.checks.values_checked``: the fused wrapper's ``checked``).
    """
    check_rank("q", q, 3)
    T, H, D = q.shape
    check_dtype("q", q, ACT_DTYPES)
    check_inner_contiguous("q", q)
    check_shape("kv", kv, (T, D))
    check_dtype("kv", kv, ACT_DTYPES)
    check_inner_contiguous("kv", kv)
    check_shape("kv_norm_weight", kv_norm_weight, (D,))
    check_dtype("kv_norm_weight", kv_norm_weight, WEIGHT_DTYPES)
    check_contiguous("kv_norm_weight", kv_norm_weight)
    if q_norm_weight is not None:
        check_shape("q_norm_weight", q_norm_weight, (D,))
        check_dtype("q_norm_weight", q_norm_weight, WEIGHT_DTYPES)
        check_contiguous("q_norm_weight", q_norm_weight)
    check_fp32_scale("eps", eps)  # added to mean(x²) in fp32
    check_choice("rope_style", rope_style, ROPE_STYLES)
    r = check_int("rope_dim", rope_dim, low=1)
    if r % 2 or r > D or D % r:
        raise RangeError("rope_dim", f"must be a positive even divisor of head_dim {D}, got {rope_dim!r}")
    check_rank("cos", cos, 2)
    check_shape("cos", cos, (None, rope_dim // 2))
    check_shape("sin", sin, tuple(cos.shape))
    check_dtype("cos", cos, (torch.float32,))
    check_dtype("sin", sin, (torch.float32,))
    check_contiguous("cos", cos)
    check_contiguous("sin", sin)
    check_index("positions", positions, (T,), INDEX_DTYPES)
    if swa_cache is not None and ring is not None:
        raise VerifyParityInputError("swa_cache", "one store target: a unified layer's ring or a non-unified "
                                                  "layer's paged swa_cache, not both")
    if (swa_cache is None) != (swa_page_size is None):
        raise VerifyParityInputError("swa_page_size" if swa_cache is not None else "swa_cache",
                                     "swa_cache and swa_page_size must be given together")
    store = ring if swa_cache is None else swa_cache
    if (store is None) != (loc is None):
        raise VerifyParityInputError("loc" if store is not None else "ring", "a store target (ring or swa_cache) "
                                                                             "and loc must be given together")
    slots = 0  # rows of the store target that loc indexes
    if swa_cache is not None:
        lay = validate_swa(swa_cache, swa_page_size, D, int(rope_dim))
        check_index("loc", loc, (T,), INDEX_DTYPES)
        slots = swa_cache.shape[0] * lay.page_size
    if ring is not None:
        check_shape("ring", ring, (None, D))
        check_dtype("ring", ring, ACT_DTYPES)
        check_contiguous("ring", ring)
        check_index("loc", loc, (T,), INDEX_DTYPES)
        slots = ring.shape[0]
    if q_out is not None:
        check_shape("q_out", q_out, (T, H, D))
        check_dtype("q_out", q_out, (q.dtype,))
        check_contiguous("q_out", q_out)
    check_same_device(q=q, kv=kv, kv_norm_weight=kv_norm_weight, q_norm_weight=q_norm_weight, cos=cos, sin=sin,
                      positions=positions, ring=ring, loc=loc, q_out=q_out, swa_cache=swa_cache)
    if check_values:
        check_index_values(("positions", positions, 0, cos.shape[0], False, False),
                           *((("loc", loc, 0, slots, True, True),) if loc is not None else ()))
    return T, H, D


def _fma(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """fp32 x·y + z with one rounding (x·y exact in fp64; the fp64 sum rounded to fp32: a double rounding at worst)."""
    return (x.double() * y.double() + z.double()).float()


def _rotated(a, b, c, s, fma: str):
    """(a·c − b·s, b·c + a·s) in fp32: each product rounded (``fma`` ""), or one product of each fused into
    the subtraction / addition ("first": a·c and a·s; "second": b·s and b·c), as a compiler contracting the
    kernel's expressions may."""
    if fma == "first":
        return _fma(a, c, -(b * s)), _fma(a, s, b * c)
    if fma == "second":
        return _fma(-b, s, a * c), _fma(b, c, a * s)
    return a * c - b * s, b * c + a * s


def rope_fp32(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, rope_style: str,
              fma: str = "") -> torch.Tensor:
    """y (T, ..., D) fp32; cos/sin (T, R/2) fp32, already gathered by position. RoPE on the last R dims
    (``fma``: ``_rotated``)."""
    c = cos.view(cos.shape[0], *([1] * (y.dim() - 2)), cos.shape[-1])  # (T, 1.., R/2); T may be 0
    s = sin.view_as(c)
    head, rot = y[..., : y.shape[-1] - rope_dim], y[..., y.shape[-1] - rope_dim:]
    if rope_style == "interleaved":
        a, b = rot[..., 0::2], rot[..., 1::2]  # (T, .., R/2) each
        rot = torch.stack(_rotated(a, b, c, s, fma), dim=-1).flatten(-2)  # (T, .., R)
    else:
        a, b = rot.chunk(2, dim=-1)
        rot = torch.cat(_rotated(a, b, c, s, fma), dim=-1)  # (T, .., R)
    return torch.cat((head, rot), dim=-1)


def rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm in fp32, unrounded: x (..., D) upcast, times rsqrt(mean(x²) + eps), times ``weight`` when given."""
    x = x.float()  # bf16 -> fp32 upcast
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y if weight is None else y * weight.float()


def _normed(x, weight, eps, bf16_norm: bool, rsqrt_ulps: int) -> torch.Tensor:
    """RMSNorm in fp32 (the factor scaled by 1 + rsqrt_ulps·2^-23: a kernel's approximate rsqrt); with
    ``bf16_norm`` rounded to x's dtype (and read back as fp32) before RoPE."""
    if rsqrt_ulps:
        xf = x.float()
        y = xf * (torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * (1 + rsqrt_ulps * 2.0 ** -23))
        y = y if weight is None else y * weight.float()
    else:
        y = rms_norm_fp32(x, weight, eps)
    return y.to(x.dtype).float() if bf16_norm else y  # fp32 -> bf16 (RNE) -> fp32, exact


@launch
def q_norm_rope(q, q_norm_weight, eps, cos, sin, positions, rope_dim, rope_style, q_out=None, bf16_norm=False,
                rsqrt_ulps=0, rope_fma=""):
    """Launch 1. q (T, H, D) bf16 -> (T, H, D) bf16 (written into ``q_out`` when given)."""
    y = rope_fp32(_normed(q, q_norm_weight, eps, bf16_norm, rsqrt_ulps), cos[positions], sin[positions], rope_dim,
                  rope_style, rope_fma)
    y = y.to(q.dtype)  # fp32 -> bf16, round to nearest even
    if q_out is None:
        return y
    q_out.copy_(y)
    return q_out


@launch
def kv_norm_rope(kv, kv_norm_weight, eps, cos, sin, positions, rope_dim, rope_style, bf16_norm=False, rsqrt_ulps=0,
                 rope_fma=""):
    """Launch 2. kv (T, D) bf16, possibly a strided slice -> new contiguous (T, D) bf16."""
    y = rope_fp32(_normed(kv, kv_norm_weight, eps, bf16_norm, rsqrt_ulps), cos[positions], sin[positions], rope_dim,
                  rope_style, rope_fma)
    return y.to(kv.dtype).contiguous()  # fp32 -> bf16


@launch
def ring_store(kv_out, ring, loc):
    """Launch 3 (decode only). ring (S, D) bf16; ring[loc[t]] = kv_out[t]; loc < 0 is padding."""
    valid = loc >= 0
    ring[loc[valid].long()] = kv_out[valid]


def qk_norm_rope(*, q, kv, kv_norm_weight, q_norm_weight=None, eps, rope_dim, cos, sin, positions,
                 rope_style="interleaved", ring=None, loc=None, q_out=None, swa_cache=None, swa_page_size=None,
                 bf16_norm=False, rsqrt_ulps=0, rope_fma=""):
    """The reference chain. Returns (q_out (T, H, D), kv_out (T, D)); stores into ``ring`` (launch 3)
    or ``swa_cache`` (launch 3') when given. ``bf16_norm``: the normalised rows rounded to bf16 before
    RoPE; ``rsqrt_ulps``, ``rope_fma``: a kernel's free fp32 choices (module docstring)."""
    validate(q=q, kv=kv, kv_norm_weight=kv_norm_weight, q_norm_weight=q_norm_weight, eps=eps, rope_dim=rope_dim,
             cos=cos, sin=sin, positions=positions, rope_style=rope_style, ring=ring, loc=loc, q_out=q_out,
             swa_cache=swa_cache, swa_page_size=swa_page_size)
    eps, rope_dim = float(eps), int(rope_dim)  # numpy scalars: their values
    bf16_norm = check_bool("bf16_norm", bf16_norm)
    check_choice("rope_fma", rope_fma, ("", "first", "second"))
    rsqrt_ulps = check_int("rsqrt_ulps", rsqrt_ulps, low=-64, high=64)
    q_res = q_norm_rope(q, q_norm_weight, eps, cos, sin, positions, rope_dim, rope_style, q_out, bf16_norm,
                        rsqrt_ulps, rope_fma)
    kv_res = kv_norm_rope(kv, kv_norm_weight, eps, cos, sin, positions, rope_dim, rope_style, bf16_norm, rsqrt_ulps,
                          rope_fma)
    if ring is not None:
        ring_store(kv_res, ring, loc)
    if swa_cache is not None:
        swa_paged_store(kv_res, swa_cache, loc, SwaLayout(kv.shape[1], rope_dim, int(swa_page_size)))
    return q_res, kv_res


def _oracle_one(x, w, eps, cos, sin, rope_dim, rope_style):
    """x (T, ..., D) -> fp64. Norm, then rotate pairs as complex numbers by e^{iθ}."""
    x = x.double()
    y = x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps)
    if w is not None:
        y = y * w.double()
    rot = y[..., y.shape[-1] - rope_dim:]
    if rope_style == "interleaved":
        pairs = torch.complex(rot[..., 0::2].contiguous(), rot[..., 1::2].contiguous())
    else:
        half = rope_dim // 2
        pairs = torch.complex(rot[..., :half].contiguous(), rot[..., half:].contiguous())
    e = torch.complex(cos.double(), sin.double()).view(cos.shape[0], *([1] * (y.dim() - 2)), cos.shape[-1])
    turned = pairs * e  # (T, .., R/2) complex128
    if rope_style == "interleaved":
        rot = torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)
    else:
        rot = torch.cat((turned.real, turned.imag), dim=-1)
    return torch.cat((y[..., : y.shape[-1] - rope_dim], rot), dim=-1)


def qk_norm_rope_oracle(*, q, kv, kv_norm_weight, q_norm_weight=None, eps, rope_dim, cos, sin, positions,
                        rope_style="interleaved", **_unused):
    """fp64 oracle: returns {"q_out": (T, H, D) f64, "kv_out": (T, D) f64}."""
    c, s = cos[positions.long()], sin[positions.long()]  # (T, R/2)
    return {
        "q_out": _oracle_one(q, q_norm_weight, eps, c, s, rope_dim, rope_style),
        "kv_out": _oracle_one(kv, kv_norm_weight, eps, c, s, rope_dim, rope_style),
    }


def validate_forward_mode(forward_mode) -> str:
    """The step's mode, one of ``FORWARD_MODES`` (ChoiceError otherwise). Shared by both steps."""
    return check_choice("forward_mode", forward_mode, FORWARD_MODES)


def qk_norm_rope_step(*, forward_mode, ring, loc, swa_cache=None, swa_page_size=None, **kw):
    """The unfused prepare step. Unified KV (``ring``): decode stores the chunk (launch 3);
    target-verify (and extend) leaves the ring to the backend's causally indexed pre-attention
    store and returns kv. Non-unified KV (``swa_cache``, ``ring`` None): the backend's paged fp8
    store (launch 3') in every mode."""
    validate_forward_mode(forward_mode)
    if swa_cache is not None:
        q_out, kv_out = qk_norm_rope(ring=ring, loc=loc, swa_cache=swa_cache, swa_page_size=swa_page_size, **kw)
    elif forward_mode == "decode":
        q_out, kv_out = qk_norm_rope(ring=ring, loc=loc, **kw)
    else:
        q_out, kv_out = qk_norm_rope(**kw)
    return {"q_out": q_out, "kv_out": kv_out}
