"""Fused fp8 KV/Q prepare for Kimi-K3 absorbed MLA (seed 001): one launch for q8 and the KV rows.

Grid ``(cdiv(T·H, BLOCK_ROWS) + cdiv(T, BLOCK_ROWS),)``. The first programs each take
BLOCK_ROWS flat (token, head) rows of q: load ``q_nope`` and ``q_rope`` through their own
strides (real models hand over strided views: q_nope is a transposed bmm output, q_rope a
slice of the q projection), upcast to fp32, round to fp8 and store ``[q_nope8 | q_rope8]``
into q8. The last programs each take BLOCK_ROWS tokens of k: multiply by ``1/kv_descale`` in
fp32, round to fp8 and store ``[k_nope8 | k_rope8]`` into ``kv_buffer[loc[t]]``; loc < 0
(padding) writes nothing.

fp8 policy: ``saturate``. The kernel clamps to ±max itself (NaN kept) before the conversion,
so the policy does not depend on a backend's conversion instruction (sm90's
``cvt.rn.satfinite`` would saturate anyway; AMD's need not).

The dispatch (``forward_extend``'s fp8 target-verify branch in the seed): ``gate`` decides
fused vs fallback; ``mla_fp8_prepare_step`` holds the one sentinel ``fused_q8`` that both
skips the fallback's KV write and selects the fused q, so every path writes each row exactly
once, at the physical slot attention reads.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fused import device_checks, gates
from fused.compile_specs import variant
from fused.device_checks import (
    DKL_PAST,
    DKL_TWICE,
    MAP_PAST,
    MAP_TWICE,
    OCL_PAST,
    OCL_TWICE,
    SLOT_PAST_KIND,
    SLOT_TWICE_KIND,
    note,
)
from harness.devices import kernel_arch
from reference.mla_fp8_prepare import chain as ref
from reference.checks import UnsupportedError, check_bool, check_inner_contiguous, value_check_mode

KERNEL_FP8_POLICY = "saturate"
# Compile targets per fp8 format. Measured with triton 3.9: compiling for sm90 with fp8e4b8
# (e4m3fnuz) raises "type fp8e4b8 not supported in this architecture. The supported fp8 dtypes
# are ('fp8e4b15', 'fp8e4nv', 'fp8e5')"; e4m3fnuz runs compiled on gfx942 (MI300, whose native
# format it is: devices.fp8_format_for_arch) and interpreted on CPU. Not on gfx950 (MI355): its
# native format is OCP e4m3fn, and triton 3.6 fails to lower fp8e4b8 for it
# ("ConvertTritonAMDGPUToLLVM" pipeline failure, seen on the H200 runner's 3.6; 3.9 compiles it).
FP8_TARGETS = {"e4m3fn": ("sm90", "gfx942", "gfx950"), "e4m3fnuz": ("gfx942",)}


def kernel_fp8_formats(device) -> tuple[str, ...]:
    """fp8 formats the kernel runs in on ``device`` (a ``harness.devices.Device``): both under
    the interpreter; on NVIDIA (any arch: the backend has no fp8e4b8) e4m3fn; on AMD per arch."""
    if device.interpreted:
        return tuple(FP8_TARGETS)
    target = device.arch if device.kind == "rocm" else "sm90"
    return tuple(f for f, targets in FP8_TARGETS.items() if target in targets)
FUSED_SWITCH_ENV = "VP_FUSED_MLA_FP8_PREPARE"


@triton.jit
def _saturate(x, FP8_MAX: tl.constexpr):
    """fp32 -> fp32 within ±FP8_MAX; NaN stays NaN (the ``saturate`` policy, made explicit)."""
    return tl.where(x != x, x, tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX))


@triton.jit
def _check_loc(flag_ptr, loc_ptr, slot, tok, write, T, n_slots, BLOCK_S: tl.constexpr, PAST_KIND: tl.constexpr,
               TWICE_KIND: tl.constexpr):
    """The device-side checks of one k program's tokens (``fused.device_checks``): a row past
    kv_buffer (``PAST_KIND``: ``SLOT_PAST_KIND`` naming loc, or ``DKL_PAST`` naming the step's
    decode_kernel_loc) and a row another token of the call names too (``TWICE_KIND``: an O(T) scan of
    loc). Returns the tokens that may write: neither kind (a repeated row is written by none of its tokens)."""
    past = write & (slot >= n_slots)
    note(flag_ptr, PAST_KIND, tl.max(past.to(tl.int32), axis=0) > 0,
         tl.max(tl.where(past, slot, -1), axis=0), n_slots, 0, 0)
    twice = tl.zeros_like(write)
    for j0 in range(0, T, BLOCK_S):
        offs_j = j0 + tl.arange(0, BLOCK_S)
        other = tl.load(loc_ptr + offs_j, mask=offs_j < T, other=-1).to(tl.int64)
        same = (slot[:, None] == other[None, :]) & (offs_j[None, :] != tok[:, None]) & (other >= 0)[None, :]
        twice = twice | (tl.max(same.to(tl.int32), axis=1) > 0)
    twice = twice & write
    note(flag_ptr, TWICE_KIND, tl.max(twice.to(tl.int32), axis=0) > 0,
         tl.max(tl.where(twice, slot, -1), axis=0), 0, 0, 0)
    return write & ~past & ~twice


@triton.jit(do_not_specialize=["T", "H", "n_slots"])  # one compile per layout, not per batch shape
def mla_fp8_prepare_kernel(
    q8_ptr,  # (T, H, DN + R) fp8 out
    kv_ptr,  # (S, DN + R) fp8 KV buffer: rows loc[t] written, every other row untouched
    q_nope_ptr,  # (T, H, DN) bf16, unit stride on the last axis
    q_rope_ptr,  # (T, H, R) bf16, unit stride on the last axis
    k_nope_ptr,  # (T, DN) bf16, unit stride on the last axis
    k_rope_ptr,  # (T, R) bf16, unit stride on the last axis
    loc_ptr,  # (T,) int32/int64 physical rows; negative = padding, nothing written
    k_mul_ptr,  # (1,) fp32: 1/kv_descale, read when HAS_K_MUL
    T,  # num_tokens
    H,  # num_heads (local)
    DN,  # kv_lora_rank (512 on Kimi-K3)
    R,  # rope dims (64)
    stride_qn_t, stride_qn_h,
    stride_qr_t, stride_qr_h,
    stride_kn_t,
    stride_kr_t,
    stride_q8_t, stride_q8_h,
    stride_kv_s,
    FP8_MAX: tl.constexpr,  # largest finite value of the fp8 format (448 or 240)
    BLOCK_ROWS: tl.constexpr,  # q rows (token, head) or k tokens per program
    BLOCK_DN: tl.constexpr,  # next_power_of_2(DN)
    BLOCK_R: tl.constexpr,  # next_power_of_2(R)
    HAS_K_MUL: tl.constexpr,
    flag_ptr=None,  # (FLAG_WORDS,) int64 error record of fused.device_checks, written when CHECK_VALUES
    n_slots=0,  # rows of kv_buffer (read when CHECK_VALUES)
    CHECK_VALUES: tl.constexpr = False,  # the k programs check loc (fused.device_checks)
    BLOCK_S: tl.constexpr = 256,  # slots compared per step of the duplicate scan
    PAST_KIND: tl.constexpr = 1,  # the kinds a bad loc row is recorded as: SLOT_PAST_KIND / SLOT_TWICE_KIND
    TWICE_KIND: tl.constexpr = 2,  # (loc), or DKL_PAST / DKL_TWICE (the step's decode_kernel_loc)
):
    """The op's one launch (module docstring): q rows to q8, then k rows to ``kv_buffer[loc]``, in fp8."""
    pid = tl.program_id(0).to(tl.int64)  # int64: row offsets can pass 2**31 on large pools
    n_q_blocks = tl.cdiv(T * H, BLOCK_ROWS)
    offs_dn = tl.arange(0, BLOCK_DN)
    offs_r = tl.arange(0, BLOCK_R)
    mask_dn = offs_dn < DN
    mask_r = offs_r < R
    fp8 = q8_ptr.dtype.element_ty
    if pid < n_q_blocks:
        rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # flat t * H + h
        mask_rows = rows < T * H
        t = rows // H
        h = rows % H
        m_n = mask_rows[:, None] & mask_dn[None, :]
        m_r = mask_rows[:, None] & mask_r[None, :]
        xn = tl.load(q_nope_ptr + (t * stride_qn_t + h * stride_qn_h)[:, None] + offs_dn[None, :], mask=m_n,
                     other=0.0).to(tl.float32)
        xr = tl.load(q_rope_ptr + (t * stride_qr_t + h * stride_qr_h)[:, None] + offs_r[None, :], mask=m_r,
                     other=0.0).to(tl.float32)
        out = q8_ptr + (t * stride_q8_t + h * stride_q8_h)[:, None]
        tl.store(out + offs_dn[None, :], _saturate(xn, FP8_MAX).to(fp8), mask=m_n)
        tl.store(out + DN + offs_r[None, :], _saturate(xr, FP8_MAX).to(fp8), mask=m_r)
    else:
        tok = (pid - n_q_blocks) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        mask_tok = tok < T
        slot = tl.load(loc_ptr + tok, mask=mask_tok, other=-1).to(tl.int64)
        write = mask_tok & (slot >= 0)
        if CHECK_VALUES:
            write = _check_loc(flag_ptr, loc_ptr, slot, tok, write, T, n_slots, BLOCK_S=BLOCK_S, PAST_KIND=PAST_KIND,
                               TWICE_KIND=TWICE_KIND)
        m_n = write[:, None] & mask_dn[None, :]
        m_r = write[:, None] & mask_r[None, :]
        kn = tl.load(k_nope_ptr + (tok * stride_kn_t)[:, None] + offs_dn[None, :], mask=m_n, other=0.0).to(tl.float32)
        kr = tl.load(k_rope_ptr + (tok * stride_kr_t)[:, None] + offs_r[None, :], mask=m_r, other=0.0).to(tl.float32)
        if HAS_K_MUL:
            k_mul = tl.load(k_mul_ptr).to(tl.float32)
            kn = kn * k_mul
            kr = kr * k_mul
        dst = kv_ptr + (slot * stride_kv_s)[:, None]
        tl.store(dst + offs_dn[None, :], _saturate(kn, FP8_MAX).to(fp8), mask=m_n)
        tl.store(dst + DN + offs_r[None, :], _saturate(kr, FP8_MAX).to(fp8), mask=m_r)


@triton.jit(do_not_specialize=["n_map", "T", "S", "n_logical"])
def mla_step_check_kernel(
    flag_ptr,  # (FLAG_WORDS,) int64 error record of fused.device_checks
    seen_ptr,  # (S + n_logical,) int32 zeroed per call: how often a physical / logical row was named so far
    map_ptr,  # (n_map,) int32/int64 slot_map: logical -> physical row (read when n_map > 0)
    ocl_ptr,  # (T,) int32/int64 out_cache_loc: logical slots, negative = padding
    n_map,  # len(slot_map); 0 without one
    T,  # num_tokens
    S,  # rows of kv_buffer
    n_logical,  # logical slots: len(slot_map), or S without one
    BLOCK: tl.constexpr,  # entries per program
):
    """checked="device" of ``mla_fp8_prepare_step``'s fused path: the host check's rules for the two
    index tensors the kernel does not read (``reference.mla_fp8_prepare.chain.validate_pool``). The
    first ``cdiv(n_map, BLOCK)`` programs take slot_map (every entry in [0, S), no row twice), the
    rest out_cache_loc (every non-negative entry in [0, n_logical), no slot twice). A repeat is found
    by counting each row's namings in ``seen`` (``atomic_add`` returns the count before it): one pass,
    O(n_map + T) work and ``4·(S + n_logical)`` bytes zeroed per call. Writes nothing else."""
    pid = tl.program_id(0)
    n_map_blocks = tl.cdiv(n_map, BLOCK)
    offs = tl.arange(0, BLOCK)
    if pid < n_map_blocks:
        i = pid.to(tl.int64) * BLOCK + offs
        m = i < n_map
        v = tl.load(map_ptr + i, mask=m, other=0).to(tl.int64)
        past = m & ((v < 0) | (v >= S))
        first = tl.min(tl.where(past, i, n_map), axis=0)  # the first entry outside (it may be negative)
        note(flag_ptr, MAP_PAST, first < n_map, tl.sum(tl.where(i == first, v, 0), axis=0), S, 0, 0)
        inb = m & ~past
        old = tl.atomic_add(seen_ptr + tl.where(inb, v, 0), tl.full((BLOCK,), 1, tl.int32), mask=inb)
        twice = inb & (old > 0)
        note(flag_ptr, MAP_TWICE, tl.max(twice.to(tl.int32), axis=0) > 0,
             tl.max(tl.where(twice, v, -1), axis=0), 0, 0, 0)
    else:
        i = (pid - n_map_blocks).to(tl.int64) * BLOCK + offs
        m = i < T
        v = tl.load(ocl_ptr + i, mask=m, other=-1).to(tl.int64)
        real = m & (v >= 0)
        past = real & (v >= n_logical)
        note(flag_ptr, OCL_PAST, tl.max(past.to(tl.int32), axis=0) > 0,
             tl.max(tl.where(past, v, -1), axis=0), n_logical, 0, 0)
        inb = real & ~past
        old = tl.atomic_add(seen_ptr + S + tl.where(inb, v, 0), tl.full((BLOCK,), 1, tl.int32), mask=inb)
        twice = inb & (old > 0)
        note(flag_ptr, OCL_TWICE, tl.max(twice.to(tl.int32), axis=0) > 0,
             tl.max(tl.where(twice, v, -1), axis=0), 0, 0, 0)


STEP_CHECK_BLOCK = 1024


def launch_step_check(*, flags, kv_buffer, out_cache_loc, slot_map) -> None:
    """The step's check launch (``mla_step_check_kernel``); arguments already validated (shapes, dtypes, device)."""
    S, T = kv_buffer.shape[0], out_cache_loc.shape[0]
    n_map = 0 if slot_map is None else slot_map.shape[0]
    n_logical = S if slot_map is None else n_map
    grid = (triton.cdiv(n_map, STEP_CHECK_BLOCK) + triton.cdiv(T, STEP_CHECK_BLOCK),)
    if grid[0] == 0:
        return
    seen = torch.zeros(S + n_logical, dtype=torch.int32, device=kv_buffer.device)
    mla_step_check_kernel[grid](
        flag_ptr=flags, seen_ptr=seen, map_ptr=slot_map if slot_map is not None else out_cache_loc,
        ocl_ptr=out_cache_loc, n_map=n_map, T=T, S=S, n_logical=n_logical, BLOCK=STEP_CHECK_BLOCK, num_warps=4)


def block_config(interpreted: bool) -> tuple[int, int]:
    """(BLOCK_ROWS, num_warps). The interpreter pays per program and per op, hardly per element,
    so it takes tall tiles (the catalog's ``tile-boundary-plus-one`` straddles 512 rows);
    compiled: 4 rows × 512 bf16 over 128 threads = 16 contiguous elements per thread."""
    return (512, 1) if interpreted else (4, 4)


_K_MUL: dict = {}  # (1/kv_descale, device) -> its (1,) tensor; never evicted: a captured graph may hold one


def k_mul_tensor(kv_descale, device) -> torch.Tensor | None:
    """(1,) fp32 device tensor holding ``1/kv_descale`` (the reference's fp32 reciprocal), or None.
    Made once per (value, device) and kept: a host-to-device copy from pageable memory waits for
    the stream, which the hot path must not (the kernel only reads it)."""
    inv = ref.inv_descale(kv_descale)
    if inv is None:
        return None
    key = (inv, torch.device(device))
    t = _K_MUL.get(key)
    if t is None:
        t = _K_MUL[key] = torch.tensor([inv], dtype=torch.float32, device=device)
    return t


# the argument a bad row of loc is recorded as naming (checked="device") -> its two kinds
LOC_KINDS = {"loc": (SLOT_PAST_KIND.value, SLOT_TWICE_KIND.value), "decode_kernel_loc": (DKL_PAST.value, DKL_TWICE.value)}


def launch(*, q8, kv_buffer, q_nope, q_rope, k_nope, k_rope, loc, k_mul: torch.Tensor | None,
           flags: torch.Tensor | None = None, loc_name: str = "loc") -> None:
    """The one launch. Arguments already validated; ``k_mul`` a (1,) fp32 tensor on the device, or None;
    ``flags``: the device's error record (``fused.device_checks``): the k programs check loc, recording
    a bad row as naming ``loc_name`` (``LOC_KINDS``)."""
    T, H, DN = q_nope.shape
    R = q_rope.shape[2]
    if T == 0:
        return
    block_rows, num_warps = block_config(os.environ.get("TRITON_INTERPRET") == "1")
    grid = (triton.cdiv(T * H, block_rows) + triton.cdiv(T, block_rows),)
    mla_fp8_prepare_kernel[grid](
        q8_ptr=q8, kv_ptr=kv_buffer, q_nope_ptr=q_nope, q_rope_ptr=q_rope, k_nope_ptr=k_nope, k_rope_ptr=k_rope,
        loc_ptr=loc, k_mul_ptr=k_mul if k_mul is not None else q8,  # q8: never read (HAS_K_MUL off)
        T=T, H=H, DN=DN, R=R,
        stride_qn_t=q_nope.stride(0), stride_qn_h=q_nope.stride(1),
        stride_qr_t=q_rope.stride(0), stride_qr_h=q_rope.stride(1),
        stride_kn_t=k_nope.stride(0), stride_kr_t=k_rope.stride(0),
        stride_q8_t=q8.stride(0), stride_q8_h=q8.stride(1),
        stride_kv_s=kv_buffer.stride(0),
        FP8_MAX=torch.finfo(kv_buffer.dtype).max,
        BLOCK_ROWS=block_rows, BLOCK_DN=triton.next_power_of_2(DN), BLOCK_R=triton.next_power_of_2(R),
        HAS_K_MUL=k_mul is not None,
        **({"flag_ptr": flags, "n_slots": kv_buffer.shape[0], "CHECK_VALUES": True, "PAST_KIND": LOC_KINDS[loc_name][0],
            "TWICE_KIND": LOC_KINDS[loc_name][1]} if flags is not None else {}),
        num_warps=num_warps,
    )


def mla_fp8_prepare(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, loc, kv_descale=None, fp8_policy="saturate",
                    checked=None, loc_name="loc"):
    """Same contract as ``reference.mla_fp8_prepare.chain.mla_fp8_prepare``, in one launch.

    Shapes: q_nope (T, H, Dn), q_rope (T, H, R), k_nope (T, Dn), k_rope (T, R) bf16 — any
    strides with a unit innermost one (else LayoutError); kv_buffer (S, Dn + R) fp8;
    loc (T,) int physical rows, negative = padding. Returns q8 (T, H, Dn + R) fp8.

    Checks: shapes, dtypes, strides, devices and scalars on every call (no sync). loc's values (in
    kv_buffer, negative = padding, no row twice) by ``checked`` (None: ``VP_CHECK_VALUES``;
    ``reference.checks.value_check_mode``):

    - True (the default): on the host, one sync, before anything is written; a bad one is a
      RangeError naming loc.
    - ``"device"``: by the kernel's k programs, no sync (``fused.device_checks``): a token whose row
      is past kv_buffer or named by another token too writes nothing (no row gets bytes it should
      not; q8 is complete), and ``fused.device_checks.raise_pending()`` raises the same RangeError later.
    - False: the caller guarantees them (a bad row is then written out of bounds) and nothing waits
      on the device.

    ``loc_name``: the argument a device-recorded bad row names, ``"loc"`` or ``"decode_kernel_loc"``
    (``mla_fp8_prepare_step`` passes loc as that).
    """
    mode = value_check_mode(checked)
    if loc_name not in LOC_KINDS:
        raise UnsupportedError("loc_name", f"one of {sorted(LOC_KINDS)}, got {loc_name!r}")
    T, H, Dn, R = ref.validate(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer,
                               loc=loc, kv_descale=kv_descale, fp8_policy=fp8_policy,
                               check_values=mode == "host")
    for name, t in (("q_nope", q_nope), ("q_rope", q_rope), ("k_nope", k_nope), ("k_rope", k_rope),
                    ("kv_buffer", kv_buffer)):
        check_inner_contiguous(name, t)  # the kernel's loads and stores run along a unit stride
    if fp8_policy != KERNEL_FP8_POLICY:
        raise UnsupportedError("fp8_policy", f"the fused kernel implements {KERNEL_FP8_POLICY!r} only, "
                                           f"got {fp8_policy!r}; the dispatch sends it to the chain")
    why = format_not_compiled(kv_buffer)
    if why:
        raise UnsupportedError("kv_buffer", why)
    q8 = torch.empty((T, H, Dn + R), dtype=kv_buffer.dtype, device=kv_buffer.device)
    launch(q8=q8, kv_buffer=kv_buffer, q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, loc=loc,
           k_mul=k_mul_tensor(kv_descale, kv_buffer.device),
           flags=device_checks.record(kv_buffer.device) if mode == "device" else None, loc_name=loc_name)
    return q8


# ----------------------------------------------------------------------------- the dispatch

@dataclass(frozen=True)
class PrepareDecision:
    use_fused: bool  # one launch writes the rows and produces q8; else chain + scatter
    reason: str  # the branch that decided


def gate(*, save_kv_cache: bool, fused_switch: bool, write_loc_resolved: bool, layout_covered: bool
         ) -> PrepareDecision:
    """Pure dispatch decision (seed 001, ``TRTLLMMLABackend.forward_extend``, fp8 target-verify,
    no RoPE): fused only when writes are on, the static switch is on, a write location
    resolves, and the kernel covers the inputs. Checked in the seed's order."""
    for arg, val in (("save_kv_cache", save_kv_cache), ("fused_switch", fused_switch),
                     ("write_loc_resolved", write_loc_resolved), ("layout_covered", layout_covered)):
        check_bool(arg, val)
    if not save_kv_cache:
        return PrepareDecision(False, "writes off")
    if not fused_switch:
        return PrepareDecision(False, "static switch off")
    if not write_loc_resolved:
        return PrepareDecision(False, "no resolvable write location")
    if not layout_covered:
        return PrepareDecision(False, "layout not covered")
    return PrepareDecision(True, "fused")


def fused_switch_from_env() -> bool:
    """The static switch (SGLang: ``_fused_set_kv_concat_q_fp8``), default on."""
    return os.environ.get(FUSED_SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def format_not_compiled(kv_buffer) -> str:
    """Why the kernel cannot run ``kv_buffer``'s fp8 format on this process's GPU ("" when it can): on a
    GPU it compiles for the formats its arch converts (``FP8_TARGETS``); the interpreter runs both."""
    target = kernel_arch()
    if target == "interpreter":
        return ""
    fmt, arch_key = ref.FP8_FORMAT_OF[kv_buffer.dtype], target if target.startswith("gfx") else "sm90"
    if arch_key in FP8_TARGETS[fmt]:
        return ""
    runs = [f for f, targets in FP8_TARGETS.items() if arch_key in targets]
    return (f"{fmt} does not compile for {target} (Triton has no such fp8 conversion there; the kernel runs "
            f"{', '.join(runs)})")


def covered(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, fp8_policy) -> str:
    """Why the kernel cannot take these inputs ("" when it can): the seed's ``covered_fp8``.
    The kernel needs unit innermost strides, implements the ``saturate`` policy only, and runs the
    fp8 formats this GPU converts (an e4m3fnuz pool on NVIDIA takes the chain, which aten casts)."""
    for name, t in (("q_nope", q_nope), ("q_rope", q_rope), ("k_nope", k_nope), ("k_rope", k_rope),
                    ("kv_buffer", kv_buffer)):
        if t.numel() and t.stride(-1) != 1:
            return f"{name} innermost stride {t.stride(-1)}"
    if fp8_policy != KERNEL_FP8_POLICY:
        return f"fp8 policy {fp8_policy!r} (kernel: {KERNEL_FP8_POLICY!r})"
    return format_not_compiled(kv_buffer)


def resolve_fused_write_loc(*, out_cache_loc, decode_kernel_loc):
    """The seed's ``_resolve_fused_write_loc``: the capture-stable physical write location the
    backend filled for target-verify (unified pool), or None. Never the logical out_cache_loc."""
    return decode_kernel_loc


def record_written(pool, loc) -> None:
    """``pool.record(loc)`` without a sync (no boolean mask), for the rows a device-checked kernel wrote:
    a row of kv_buffer named by exactly one token counts 1; padding, a row outside the pool and a row
    named twice (written by none of its tokens) count nothing. On valid loc, what ``record`` counts."""
    if pool.writes is None:
        return
    S, v = pool.writes.shape[0], loc.long()
    rows = torch.where((v >= 0) & (v < S), v, S)  # S: the bin of the rows not written
    named = torch.zeros(S + 1, dtype=torch.int32, device=pool.writes.device).index_add_(
        0, rows, torch.ones_like(rows, dtype=torch.int32))
    pool.writes += (named[:S] == 1).to(torch.int32)


def mla_fp8_prepare_step(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, out_cache_loc, slot_map=None,
                         decode_kernel_loc=None, save_kv_cache=True, fused_switch=None, kv_descale=None,
                         fp8_policy="saturate", gate_fn=gate, resolve_fn=resolve_fused_write_loc,
                         kernel_fn=None, checked=None):
    """One fp8 target-verify prepare on an MLA layer as the backend runs it.

    Shapes: as ``mla_fp8_prepare``; out_cache_loc (T,) logical slots; slot_map (S_logical,)
    logical -> physical row or None (identity); decode_kernel_loc (T,) physical rows or None.
    Returns {"q8": (T, H, Dn + R) fp8, "kv_writes": (S,) int32 writes per physical row}.
    ``gate_fn``, ``resolve_fn`` and ``kernel_fn`` (default ``mla_fp8_prepare``) exist so tests
    and mutants can swap one piece.

    Checks: shapes, dtypes, devices and flags on every call (no sync). The index values (slot_map
    an injective map into kv_buffer's rows; out_cache_loc in the logical pool, decode_kernel_loc in
    kv_buffer, negative = padding, no slot twice) by ``checked`` (None: ``VP_CHECK_VALUES``;
    ``reference.checks.value_check_mode``):

    - True (the default): on the host, before anything is written: one sync for the three, a
      second for the kernel's loc (and one to count the written rows in ``kv_writes``); a bad one
      is a RangeError naming it.
    - ``"device"``, on the fused path: no sync (``fused.device_checks``). A check launch reads
      slot_map and out_cache_loc (``mla_step_check_kernel``: the kernel reads neither, so a bad
      entry there changes no output), the kernel's k programs read decode_kernel_loc (a token whose
      row is past kv_buffer or named by another token too writes nothing; q8 is complete; no row
      gets bytes it should not), ``kv_writes`` counts the rows written (once each: a repeated row 0),
      and ``fused.device_checks.raise_pending()`` raises the host check's RangeError later, naming
      the same argument, slot_map's first, then out_cache_loc's, then decode_kernel_loc's.
    - False, on the fused path: the caller guarantees them (a bad decode_kernel_loc row is written out
      of bounds) and nothing waits on the device (``kv_writes`` counted as in ``"device"``).

    The fallback (the chain: writes off, the switch off, no decode_kernel_loc, a layout the kernel does
    not take) indexes slot_map by out_cache_loc on the host's word: it checks the values on the host
    whatever ``checked`` says.
    """
    kernel_fn = kernel_fn or mla_fp8_prepare
    mode = value_check_mode(checked)
    ref.validate_pool(kv_buffer=kv_buffer, out_cache_loc=out_cache_loc, slot_map=slot_map,
                      decode_kernel_loc=decode_kernel_loc, save_kv_cache=save_kv_cache, fused_switch=fused_switch,
                      check_values=mode == "host")
    # before ``covered`` reads their strides (each path checks its write rows itself, below)
    ref.validate_tensors(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer,
                         kv_descale=kv_descale, fp8_policy=fp8_policy)
    pool = ref.KVPool(kv_buffer, slot_map)
    switch = fused_switch_from_env() if fused_switch is None else fused_switch
    fused_q8 = None  # the sentinel: not None <=> the kernel wrote the rows and produced q8
    loc = resolve_fn(out_cache_loc=out_cache_loc, decode_kernel_loc=decode_kernel_loc) \
        if save_kv_cache and switch else None
    d = gates.decide(gate_fn, save_kv_cache=save_kv_cache, fused_switch=switch, write_loc_resolved=loc is not None,
                layout_covered=not covered(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope,
                                           kv_buffer=kv_buffer, fp8_policy=fp8_policy))
    if d.use_fused and mode == "host":
        fused_q8 = kernel_fn(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer,
                             loc=loc, kv_descale=kv_descale, fp8_policy=fp8_policy)
        pool.record(loc)
    elif d.use_fused:
        if mode == "device":
            launch_step_check(flags=device_checks.record(kv_buffer.device), kv_buffer=kv_buffer,
                              out_cache_loc=out_cache_loc, slot_map=slot_map)
        fused_q8 = kernel_fn(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer,
                             loc=loc, kv_descale=kv_descale, fp8_policy=fp8_policy, checked=checked,
                             loc_name="decode_kernel_loc")
        record_written(pool, loc)
    if fused_q8 is None and mode != "host":  # the chain reads the values on the host: checked there
        ref.validate_pool(kv_buffer=kv_buffer, out_cache_loc=out_cache_loc, slot_map=slot_map,
                          decode_kernel_loc=decode_kernel_loc, save_kv_cache=save_kv_cache, fused_switch=fused_switch)
    if fused_q8 is None:  # fallback: launches 1-4 of the chain, on inputs checked as the kernel's wrapper would
        phys = decode_kernel_loc if save_kv_cache and decode_kernel_loc is not None else pool.physical(out_cache_loc)
        ref.validate(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer, loc=phys,
                     kv_descale=kv_descale, fp8_policy=fp8_policy)
        q8, k_nope8, k_rope8 = ref.quantize_chain(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope,
                                                  fp8_dtype=kv_buffer.dtype, kv_descale=kv_descale,
                                                  fp8_policy=fp8_policy)
    if save_kv_cache and fused_q8 is None:  # launch 5, only when the kernel did not write
        pool.write_rows(phys, k_nope8, k_rope8)
    return {"q8": fused_q8 if fused_q8 is not None else q8, "kv_writes": pool.writes}


def compile_specs():
    """Signatures for the ahead-of-time compile check (``python -m harness compile``): one per
    constexpr variant and fp8 format the wrapper can launch: unchecked with and without kv_descale,
    ``checked="device"`` recording loc's kinds (``mla_fp8_prepare``) and decode_kernel_loc's (the
    step), and the step's check launch for both index dtypes."""
    specs = []
    block_rows, warps = block_config(interpreted=False)
    for fmt, fp8_sig in (("e4m3fn", "*fp8e4nv"), ("e4m3fnuz", "*fp8e4b8")):
        types = {"q8_ptr": fp8_sig, "kv_ptr": fp8_sig, "q_nope_ptr": "*bf16", "q_rope_ptr": "*bf16",
                 "k_nope_ptr": "*bf16", "k_rope_ptr": "*bf16", "loc_ptr": "*i64", "k_mul_ptr": "*fp32",
                 "flag_ptr": "*i64"}
        for has_k_mul, chk in ((False, None), (True, None), (False, "loc"), (False, "decode_kernel_loc")):
            past, twice = LOC_KINDS[chk or "loc"]
            const = {"FP8_MAX": torch.finfo(ref.FP8_DTYPES[fmt]).max, "BLOCK_ROWS": block_rows, "BLOCK_DN": 512,
                     "BLOCK_R": 64, "HAS_K_MUL": has_k_mul, "CHECK_VALUES": chk is not None, "BLOCK_S": 256,
                     "PAST_KIND": past, "TWICE_KIND": twice}
            label = f"{fmt},k_mul={int(has_k_mul)}" + (f",checked={chk}" if chk else "")
            specs.append(variant(label, mla_fp8_prepare_kernel, types, const, warps, FP8_TARGETS[fmt]))
    for idx in ("*i64", "*i32"):
        specs.append(variant(f"index={idx[1:]}", mla_step_check_kernel,
                             {"flag_ptr": "*i64", "seen_ptr": "*i32", "map_ptr": idx, "ocl_ptr": idx},
                             {"BLOCK": STEP_CHECK_BLOCK}, 4))
    return specs
