"""fp8 KV/Q prepare for Kimi-K3 absorbed MLA, no RoPE (seed 001) — the unfused reference chain.

Launches of the unfused chain (SGLang ``mla_quantize_without_rope_for_fp8`` + ``set_mla_kv_buffer``):
  1. ``concat_q``       q = cat([q_nope | q_rope], -1)                     (T, H, Dn + R) bf16
  2. ``cast_fp8(q)``    q8 = fp8(q)                                         (T, H, Dn + R) fp8
  3. ``cast_fp8(k_nope · 1/kv_descale)``                                    (T, Dn) fp8
  4. ``cast_fp8(k_rope · 1/kv_descale)``                                    (T, R) fp8
  5. ``scatter_kv``     kv_buffer[loc[t]] = [k_nope8[t] | k_rope8[t]]; loc < 0 is padding: no write

Math: every value is upcast bf16 -> fp32 exactly; k is multiplied in fp32 by
``inv = fp32(1 / fp32(kv_descale))`` (one fp32 rounding for the reciprocal, one for the
product); the fp32 value is then rounded to fp8 e4m3 (``e4m3fn`` or ``e4m3fnuz``) to nearest,
ties to even, subnormals kept. What happens past the fp8 range is a *named policy*, never
whatever the installed torch does (torch 2.13 saturates e4m3fn but gives NaN for e4m3fnuz;
torch 2.11 gives NaN for e4m3fn at |x| >= 465):
  * ``saturate``: |x| beyond max and ±inf become ±max (the compiled sm90 ``cvt.rn.satfinite``);
  * ``nan``: a value whose rounding would pass max, and ±inf, become NaN (aten in torch 2.11).
NaN stays NaN under both, as the canonical code whatever its sign or payload — 0x7F for
e4m3fn, 0x80 (its only NaN) for e4m3fnuz — which is what ``harness.shim`` says compiled
conversions produce (``tests/test_shim.py`` holds the GPU to it); torch 2.13's own cast keeps
the sign (0xFF), so the codes are set here explicitly. e4m3fnuz has no −0: negative values
that round to zero give 0x00.

Only the in-range rounding is delegated to torch's ``Tensor.to``; ``encode_fp8_oracle``
(``reference.mla_fp8_prepare.encoder``) is an independent fp64 encoder (nearest of the 256
decoded codes, ties to the even code) that the tests hold the chain to. The KV pool model
(logical ``out_cache_loc`` -> physical row) lives here too: it is the truth of where attention
reads a token's row.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import torch

from reference.checks import (
    VerifyParityInputError,
    check_bool,
    check_choice,
    check_dtype,
    check_fp32_scale,
    check_index,
    fp32_value,
    check_index_values,
    check_rank,
    check_same_device,
    check_shape,
)
from reference.launches import launch
from reference.mla_fp8_prepare.encoder import encode_fp8_oracle

FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
FP8_FORMAT_OF = {v: k for k, v in FP8_DTYPES.items()}

POLICIES = ("saturate", "nan")
ACT_DTYPES = (torch.bfloat16,)
INDEX_DTYPES = (torch.int32, torch.int64)


# ----------------------------------------------------------------------------- validation

def validate(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, loc, kv_descale=None, fp8_policy="saturate",
             check_values: bool = True) -> tuple[int, int, int, int]:
    """Check every argument; return (T, H, Dn, R). Shared by the reference and the fused wrapper.

    Shapes: q_nope (T, H, Dn), q_rope (T, H, R), k_nope (T, Dn), k_rope (T, R) bf16, any
    strides; kv_buffer (S, Dn + R) fp8; loc (T,) int32/int64 rows of kv_buffer, contiguous,
    negative = padding, no duplicates. T = 0 (and H = 0) is legal: empty q8, nothing written.
    kv_descale: None or a real number whose fp32 value and fp32 reciprocal (the factor k is
    multiplied by) are both normal fp32 numbers, i.e. about [1.2e-38, 8.5e37]. A kernel's own
    layout limits are its wrapper's to check. loc's values (one host sync) only with
    ``check_values`` (``reference.checks.values_checked``).
    """
    T, H, Dn, R = validate_tensors(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer,
                                   kv_descale=kv_descale, fp8_policy=fp8_policy)
    check_index("loc", loc, (T,), INDEX_DTYPES)
    check_same_device(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer, loc=loc)
    if check_values:
        check_index_values(("loc", loc, 0, kv_buffer.shape[0], True, True))
    return T, H, Dn, R


def validate_tensors(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, kv_descale=None, fp8_policy="saturate"
                     ) -> tuple[int, int, int, int]:
    """``validate`` without ``loc``: the data tensors, the pool's row shape and dtype, the scalars;
    return (T, H, Dn, R). Reads no tensor's values (no device sync), so a dispatcher can run it
    before it asks anything of the tensors (the fused step's ``covered``, which reads strides)."""
    check_rank("q_nope", q_nope, 3)
    T, H, Dn = q_nope.shape
    check_dtype("q_nope", q_nope, ACT_DTYPES)
    check_rank("q_rope", q_rope, 3)
    check_shape("q_rope", q_rope, (T, H, None))
    R = q_rope.shape[2]
    check_dtype("q_rope", q_rope, ACT_DTYPES)
    check_shape("k_nope", k_nope, (T, Dn))
    check_dtype("k_nope", k_nope, ACT_DTYPES)
    check_shape("k_rope", k_rope, (T, R))
    check_dtype("k_rope", k_rope, ACT_DTYPES)
    if Dn == 0 or R == 0:
        raise VerifyParityInputError("q_nope" if Dn == 0 else "q_rope", f"empty head dims: Dn={Dn}, R={R}")
    check_shape("kv_buffer", kv_buffer, (None, Dn + R))
    check_dtype("kv_buffer", kv_buffer, tuple(FP8_DTYPES.values()))
    if kv_descale is not None:
        check_fp32_scale("kv_descale", kv_descale)
        check_fp32_scale("kv_descale", kv_descale, value=inv_descale(kv_descale))
    check_choice("fp8_policy", fp8_policy, POLICIES)
    return T, H, Dn, R


def inv_descale(kv_descale: float | None) -> float | None:
    """``fp32(1 / fp32(kv_descale))`` as a Python float (exactly an fp32 value); None stays None.
    The fp32 division, RNE, computed in float64 and rounded once to fp32: for a quotient of two fp32
    numbers that double rounding is exact (53 >= 2·24 + 2 bits)."""
    if kv_descale is None:
        return None
    return fp32_value(1.0 / fp32_value(float(kv_descale)))


# ----------------------------------------------------------------------------- the fp8 cast

FP8_NAN_CODE = {"e4m3fn": 0x7F, "e4m3fnuz": 0x80}  # canonical NaN, sign dropped


def fp8_overflows(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """|x| whose round-to-nearest-even with unbounded exponent lands past the fp8 max, or ±inf.

    e4m3fn: max 448 = 1.110b·2^8 (even mantissa): the tie 464 stays at 448, so |x| > 464.
    e4m3fnuz: max 240 = 1.111b·2^7 (odd mantissa): the tie 248 goes up to 256, so |x| >= 248.
    """
    a = x.abs()
    return a > 464.0 if fmt == "e4m3fn" else a >= 248.0


@launch
def cast_fp8(x: torch.Tensor, fp8_dtype: torch.dtype, policy: str, scale_mul: float | torch.Tensor | None = None
             ) -> torch.Tensor:
    """Launches 2-4. x bf16 (any shape) -> same shape fp8, under the named overflow ``policy``.

    ``scale_mul`` (an exact fp32 value, or a 0-dim fp32 tensor) multiplies x in fp32 first.
    """
    fmt = FP8_FORMAT_OF[fp8_dtype]
    xf = x.float()  # bf16 -> fp32, exact
    if isinstance(scale_mul, torch.Tensor):
        xf = xf * scale_mul  # one fp32 rounding
    elif scale_mul is not None:
        xf = xf * torch.tensor(scale_mul, dtype=torch.float32, device=xf.device)  # one fp32 rounding
    fmax = torch.finfo(fp8_dtype).max
    nan = torch.isnan(xf)
    # In range after the clamp, so torch only rounds (RNE, subnormals) and never decides overflow.
    clamped = torch.where(nan, torch.zeros_like(xf), xf.clamp(-fmax, fmax))
    codes = clamped.to(fp8_dtype).view(torch.uint8)
    if fmt == "e4m3fnuz":  # no -0 in fnuz; pin it whatever torch does
        codes = torch.where(codes == 0x80, torch.zeros_like(codes), codes)
    special = nan | fp8_overflows(xf, fmt) if policy == "nan" else nan
    codes = torch.where(special, torch.full_like(codes, FP8_NAN_CODE[fmt]), codes)
    return codes.view(fp8_dtype)


@launch
def concat_q(q_nope: torch.Tensor, q_rope: torch.Tensor) -> torch.Tensor:
    """Launch 1. (T, H, Dn) and (T, H, R) bf16, any strides -> (T, H, Dn + R) bf16 contiguous."""
    return torch.cat((q_nope, q_rope), dim=-1)


@launch
def scatter_kv(kv_buffer: torch.Tensor, loc: torch.Tensor, k_nope8: torch.Tensor, k_rope8: torch.Tensor) -> None:
    """Launch 5. kv_buffer (S, Dn + R) fp8; kv_buffer[loc[t]] = [k_nope8[t] | k_rope8[t]]; loc < 0 skipped."""
    valid = loc >= 0
    rows = torch.cat((k_nope8.view(torch.uint8), k_rope8.view(torch.uint8)), dim=-1)  # (T, Dn + R) fp8 bytes
    kv_buffer.view(torch.uint8)[loc[valid].long()] = rows[valid]  # bytes: fp8 index_put is not on every build


def quantize_chain(*, q_nope, q_rope, k_nope, k_rope, fp8_dtype, kv_descale=None, fp8_policy="saturate"):
    """Launches 1-4: returns (q8 (T, H, Dn + R), k_nope8 (T, Dn), k_rope8 (T, R)), all fp8."""
    inv = inv_descale(kv_descale)
    q8 = cast_fp8(concat_q(q_nope, q_rope), fp8_dtype, fp8_policy)
    return q8, cast_fp8(k_nope, fp8_dtype, fp8_policy, inv), cast_fp8(k_rope, fp8_dtype, fp8_policy, inv)


def mla_fp8_prepare(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, loc, kv_descale=None, fp8_policy="saturate"):
    """The five-launch reference chain. Returns q8 (T, H, Dn + R) fp8; writes kv_buffer[loc]."""
    validate(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer, loc=loc,
             kv_descale=kv_descale, fp8_policy=fp8_policy)
    q8, k_nope8, k_rope8 = quantize_chain(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope,
                                          fp8_dtype=kv_buffer.dtype, kv_descale=kv_descale, fp8_policy=fp8_policy)
    scatter_kv(kv_buffer, loc, k_nope8, k_rope8)
    return q8


# ----------------------------------------------------------------------------- the fp64 oracle

def scaled_k_fp32(k: torch.Tensor, kv_descale) -> torch.Tensor:
    """fp32(k · inv) computed through fp64 (a product of two fp32 is exact in fp64), fp64 out."""
    inv = inv_descale(kv_descale)
    k64 = k.double()
    return k64 if inv is None else (k64 * inv).float().double()


def mla_fp8_prepare_oracle(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, kv_descale=None, fp8_policy="saturate",
                           **_unused):
    """Codes the chain must produce, from the fp64 encoder: {"q8": (T, H, Dn+R), "k_row8": (T, Dn+R)} fp8."""
    fmt = FP8_FORMAT_OF[kv_buffer.dtype]
    q = torch.cat((q_nope.double(), q_rope.double()), dim=-1)
    k = torch.cat((scaled_k_fp32(k_nope, kv_descale), scaled_k_fp32(k_rope, kv_descale)), dim=-1)
    enc = lambda t: encode_fp8_oracle(t, fmt, fp8_policy).view(t.shape).view(kv_buffer.dtype)  # noqa: E731
    return {"q8": enc(q.cpu()), "k_row8": enc(k.cpu())}


# ----------------------------------------------------------------------------- the KV pool model

_UNCOUNTED = contextvars.ContextVar("verify_parity_pool_uncounted", default=False)


@contextlib.contextmanager
def writes_uncounted():
    """While the block runs, a new ``KVPool`` counts no writes (``writes`` is None, so is the op's
    ``kv_writes``): the counter selects rows with a boolean mask, a device->host sync that a call made
    as a CUDA graph runs it cannot take (``harness.gpu.runners.capture_safe``); the pool's bytes are
    compared instead."""
    token = _UNCOUNTED.set(True)
    try:
        yield
    finally:
        _UNCOUNTED.reset(token)


@dataclass
class KVPool:
    """The token-to-KV pool as the MLA backend sees it, reduced to what seed 001 depends on.

    ``kv_buffer`` (S, Dn + R) fp8 holds physical rows. ``slot_map`` (S_logical,) int64 maps a
    logical ``out_cache_loc`` to the physical row attention reads (None: identity). Every
    write goes through ``write_rows`` with *physical* rows, and is counted in ``writes`` (S,)
    so a run can prove each row was written exactly once.
    """
    kv_buffer: torch.Tensor
    slot_map: torch.Tensor | None = None
    writes: torch.Tensor | None = field(init=False)

    def __post_init__(self):
        self.writes = None if _UNCOUNTED.get() else torch.zeros(self.kv_buffer.shape[0], dtype=torch.int32,
                                                                 device=self.kv_buffer.device)

    @property
    def num_logical(self) -> int:
        return self.kv_buffer.shape[0] if self.slot_map is None else self.slot_map.shape[0]

    def physical(self, out_cache_loc: torch.Tensor) -> torch.Tensor:
        """(T,) logical slots -> (T,) physical rows, same dtype; negative (padding) stays -1."""
        if self.slot_map is None:
            return out_cache_loc
        valid = out_cache_loc >= 0
        phys = self.slot_map[out_cache_loc.long().clamp(min=0)].to(out_cache_loc.dtype)
        return torch.where(valid, phys, torch.full_like(phys, -1))

    def record(self, phys_loc: torch.Tensor) -> None:
        """Count one write per non-negative physical row (the kernel wrote them itself); nothing inside
        ``writes_uncounted``."""
        if self.writes is None:
            return
        rows = phys_loc[phys_loc >= 0].long()
        self.writes.index_add_(0, rows, torch.ones_like(rows, dtype=torch.int32))

    def write_rows(self, phys_loc: torch.Tensor, k_nope8: torch.Tensor, k_rope8: torch.Tensor) -> None:
        """``set_mla_kv_buffer`` on physical rows: launch 5 of the chain, counted."""
        scatter_kv(self.kv_buffer, phys_loc, k_nope8, k_rope8)
        self.record(phys_loc)


def validate_pool(*, kv_buffer, out_cache_loc, slot_map, decode_kernel_loc, save_kv_cache=True,
                  fused_switch=True, check_values: bool = True) -> None:
    """The step's extra arguments: the logical loc lies in the pool, the maps are well formed
    (contiguous int tensors), the flags are bools (``fused_switch`` None: from the environment).
    The index values (one host sync) only with ``check_values``."""
    check_bool("save_kv_cache", save_kv_cache)
    if fused_switch is not None:
        check_bool("fused_switch", fused_switch)
    check_rank("kv_buffer", kv_buffer, 2)
    check_index("out_cache_loc", out_cache_loc, (None,), INDEX_DTYPES)
    if decode_kernel_loc is not None:
        check_index("decode_kernel_loc", decode_kernel_loc, tuple(out_cache_loc.shape), INDEX_DTYPES)
    if slot_map is not None:
        check_index("slot_map", slot_map, (None,), INDEX_DTYPES)
    # before any value is read: a CPU loc among GPU tensors crashed the chain and the kernel took it
    check_same_device(kv_buffer=kv_buffer, out_cache_loc=out_cache_loc, slot_map=slot_map,
                      decode_kernel_loc=decode_kernel_loc)
    S = kv_buffer.shape[0]
    n_logical = S if slot_map is None else slot_map.shape[0]
    if check_values:
        check_index_values(*((("slot_map", slot_map, 0, S, False, True),) if slot_map is not None else ()),
                           ("out_cache_loc", out_cache_loc, 0, n_logical, True, True),
                           *((("decode_kernel_loc", decode_kernel_loc, 0, S, True, True),)
                             if decode_kernel_loc is not None else ()))


def mla_fp8_prepare_step(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, out_cache_loc, slot_map=None,
                         decode_kernel_loc=None, save_kv_cache=True, fused_switch=True, kv_descale=None,
                         fp8_policy="saturate"):
    """The unfused target-verify prepare as the backend runs it: launches 1-4, then (writes on)
    launch 5 into the physical rows of ``out_cache_loc``. ``decode_kernel_loc`` and
    ``fused_switch`` only steer the fused dispatch; the reference ignores them.

    Returns {"q8": (T, H, Dn + R) fp8, "kv_writes": (S,) int32 writes per physical row}.
    """
    validate_pool(kv_buffer=kv_buffer, out_cache_loc=out_cache_loc, slot_map=slot_map,
                  decode_kernel_loc=decode_kernel_loc, save_kv_cache=save_kv_cache, fused_switch=fused_switch)
    pool = KVPool(kv_buffer, slot_map)
    phys = pool.physical(out_cache_loc)
    validate(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer, loc=phys,
             kv_descale=kv_descale, fp8_policy=fp8_policy)
    q8, k_nope8, k_rope8 = quantize_chain(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope,
                                          fp8_dtype=kv_buffer.dtype, kv_descale=kv_descale, fp8_policy=fp8_policy)
    if save_kv_cache:
        pool.write_rows(phys, k_nope8, k_rope8)
    return {"q8": q8, "kv_writes": pool.writes}
