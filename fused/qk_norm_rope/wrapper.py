"""Fused qk RMSNorm + RoPE (seed 000): one launch for q and kv, optional in-kernel ring store.

Grid ``(cdiv(T, BLOCK_T), H + 1)``: programs ``0..H-1`` along axis 1 normalise and rotate one
q head for BLOCK_T tokens; program ``H`` does the same for kv and, when ``HAS_STORE``, writes
the rotated kv rows into ``ring[loc]`` (decode, 1-source consumer). In target-verify the
gate turns the store off: the backend stores the chunk itself, causally indexed, *before*
attention, and the chunk must also reach attention as k/v (seed 000: fusing the store too
took GSM8K from 0.950 to 0.027).

Per program: the BLOCK_T rows are read once in 16-byte vectors (row starts hinted aligned when
every stride allows, ``VEC``) and normalised; the last R dims are reread (from L1) as their own
tile and rotated there, the partner of each rope dim moved in registers; the nope dims and the
rope tile are stored apart. Every value is the same fp32 expression as in the two-load version
this replaced, so the outputs are bit-identical to it under the interpreter. The kernels live in
``fused/qk_norm_rope/kernels.py``.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import torch

from fused import device_checks, gates
from fused.qk_norm_rope import dispatch
from fused.qk_norm_rope import kernels as kern
from reference.qk_norm_rope import chain as ref
from reference.qk_norm_rope import swa
from reference.checks import check_bool, value_check_mode

VERIFY_SWITCH_ENV = "VP_FUSED_QK_NORM_ROPE_VERIFY"
ROPE_TILE = 64  # the rope tile's width for every rope_dim up to it (wider: the next power of two)
FORWARD_MODES = ref.FORWARD_MODES
# block_config: a launch of at most this many one-row programs takes one row on one warp per program
SMALL_LAUNCH_ROWS = 2048


def _pow2(n: int) -> int:
    """``triton.next_power_of_2`` for n >= 1 in plain Python: the wrapper's host path calls it per launch."""
    return 1 << (n - 1).bit_length()


def block_config(D: int, interpreted: bool, T: int | None = None, H: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, num_warps) per backend. The interpreter pays per program and per op,
    hardly per element, so it takes tall token tiles (a whole verify batch of the end-to-end gate
    in one; the catalog's tile-boundary cases are T = 511 / 513); compiled backends keep ~1K fp32
    elements per tile on 2 warps (4 above D 512). Measured on the H200, graph-replayed, D 512, T 1..4096
    x H 8..128, verify and decode (``python -m cases.qk_norm_rope.bench --vs-sglang --configs
    default,2x2,8x8``; docs/benchmarks.md): 2 tokens x 2 warps was the fastest of the three at 44 of 56
    shapes, 5 % faster than the former 4 x 4 (median) from T 320 up and 1.5 % below. A small launch
    (``T`` x (``H`` + 1) programs of one row at most ``SMALL_LAUNCH_ROWS``, D <= 512) is latency, not
    bandwidth: one row on one warp per program was the fastest config there (T 1 at 0.90-1.03x SGLang's
    one-row program, where 2 rows x 2 warps masked half their lanes and took 1.02-1.25x). T 1 always
    gets a one-row tile."""
    block_d = _pow2(D)
    if interpreted:
        return 512, block_d, 1
    warps = 2 if block_d <= 512 else 4
    if T is not None and H is not None and block_d <= 512 and T * (H + 1) <= SMALL_LAUNCH_ROWS:
        return 1, block_d, 1
    return (1 if T == 1 else max(1, 1024 // block_d)), block_d, warps


def vec_width(D: int, *strides: int) -> int:
    """Elements per aligned vector the kernel may assume (its ``VEC``): 8 (16 bytes of bf16) when D,
    R and every row stride are multiples of 8, else 1. Triton checks the pointers' own alignment."""
    return 8 if all(v % 8 == 0 for v in (D, *strides)) else 1


def launch(*, q_out, kv_out, q, kv, kv_norm_weight, q_norm_weight, eps, rope_dim, cos, sin, positions,
           rope_style, ring=None, loc=None, swa_cache=None, swa_page_size=None, config=None,
           head_launches=None, flags=None) -> list:
    """The one launch. Arguments already validated, outputs allocated (the benchmark calls this
    directly). ``config``: (BLOCK_T, num_warps) instead of ``block_config``'s (the benchmark's
    candidates). ``head_launches``: ((programs along the head axis, the kernel's H), ...) instead of
    the one launch ((H + 1, H),) whose program H is the kv one (a GPU mutant splits it in two).
    ``flags``: the device's error record (``fused.device_checks``): the kv programs check the values.
    Returns [(CompiledKernel or None, grid, the kernel's arguments)] per compiled launch ([] interpreted)."""
    T, H, D = q.shape
    if T == 0:
        return []
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    BLOCK_T, BLOCK_D, num_warps = block_config(D, interpreted, T, H)
    if config is not None:
        BLOCK_T, num_warps = config
    has_store = ring is not None
    paged = swa_cache is not None
    n_t = -(-T // BLOCK_T)  # cdiv (triton.cdiv is a constexpr_function since Triton 3.5: ~5 us a call)
    extra = {} if flags is None else dict(CHECK_VALUES=True)
    extra |= dict(stride_pool_p=swa_cache.stride(0),
                  page_size=int(swa_page_size), PAGED_FP8_STORE=True, FP8_MAX=swa.SWA_FP8_MAX,
                  AMAX_FLOOR=swa.SWA_AMAX_FLOOR) if paged else {}
    strides = (q.stride(0), q.stride(1), kv.stride(0), q_out.stride(0), q_out.stride(1), kv_out.stride(0),
               ring.stride(0) if has_store else 0)
    block_r = max(ROPE_TILE, _pow2(rope_dim))  # one tile width for R <= 64: fewer variants
    launches = []
    for programs, h in head_launches or ((H + 1, H),):
        args = dict(
            dispatch.pointer_args(q_out=q_out, kv_out=kv_out, q=q, kv=kv, kv_norm_weight=kv_norm_weight,
                          q_norm_weight=q_norm_weight, cos=cos, sin=sin, positions=positions, ring=ring, loc=loc,
                          swa_cache=swa_cache, flags=flags),
            T=T, H=h, D=D, R=rope_dim, eps=eps,
            stride_q_t=strides[0], stride_q_h=strides[1], stride_kv_t=strides[2],
            stride_qo_t=strides[3], stride_qo_h=strides[4], stride_kvo_t=strides[5], stride_ring_s=strides[6],
            stride_cs_p=cos.stride(0), n_pos=cos.shape[0],
            n_slots=ring.shape[0] if has_store else swa_cache.shape[0] * int(swa_page_size) if paged else 0,
            BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D,
            HAS_Q_WEIGHT=q_norm_weight is not None, HAS_STORE=has_store, IS_NEOX=rope_style == "neox",
            BLOCK_R=block_r, PARTNER_IN_REGS=rope_style != "neox" or block_r == rope_dim,  # neox: halves of the tile
            VEC=vec_width(D, rope_dim, *strides), **extra,
        )
        if interpreted:
            kern.qk_norm_rope_kernel[(n_t, programs)](**args, num_warps=num_warps)
        else:
            grid = (n_t, programs, 1)
            launches.append((dispatch.compiled_launch(grid, args, num_warps), grid, args))
    return launches


def qk_norm_rope(*, q, kv, kv_norm_weight, q_norm_weight=None, eps, rope_dim, cos, sin, positions,
                 rope_style="interleaved", ring=None, loc=None, q_out=None, swa_cache=None, swa_page_size=None,
                 checked=None):
    """Same contract as ``reference.qk_norm_rope.chain.qk_norm_rope``, in one launch.

    Shapes: q (T, H, D) bf16; kv (T, D) bf16 (rows may be strided); kv_norm_weight (D,);
    q_norm_weight (D,) or None; cos, sin (max_pos, R/2) fp32; positions (T,) int;
    ring (S, D) bf16 and loc (T,) int, both or neither (the unified ring store); or
    swa_cache (num_pages, page_bytes) uint8, swa_page_size and loc (the non-unified paged fp8
    store, ``reference.qk_norm_rope.swa.SwaLayout``); q_out (T, H, D) or None.
    Returns (q_out (T, H, D), kv_out (T, D) contiguous): kv_out holds the bf16 rows the kernel
    stored (the paged store quantises exactly these).

    Checks: every argument's shape, dtype, strides, device and scalars on every call (host only,
    no sync; a call whose arguments' metadata equals an earlier call's reuses that call's checks
    and launch, ``fused.qk_norm_rope.dispatch.call_key``, unless the values are checked on the
    host). The values of positions (in the table) and loc (in the store target, no slot twice) by ``checked`` (None:
    ``VP_CHECK_VALUES``; ``reference.checks.value_check_mode``):

    - True (the default): on the host, one sync, before anything is written; a bad one is a
      RangeError naming it.
    - ``"device"``: by the kernel, no sync (``fused.device_checks``): a token with a bad value is
      not stored, and ``fused.device_checks.raise_pending()`` raises the same RangeError later.
    - False: the caller guarantees them. The kernel still never reads or writes outside its
      tensors (a position outside the table reads row 0, a slot past the store is skipped, a
      repeated slot gets bytes of its tokens), but such tokens' results are not the op's.
    """
    mode = value_check_mode(checked)
    key = None
    if mode != "host" and type(eps) is float and type(rope_dim) is int and type(rope_style) is str and (
            swa_page_size is None or type(swa_page_size) is int) and dispatch.plans_on():
        key = dispatch.call_key(mode, eps, rope_dim, rope_style, swa_page_size, q, kv, kv_norm_weight, q_norm_weight,
                                cos, sin, positions, ring, loc, q_out, swa_cache)
        plan = dispatch.plans.get(key)
        if plan is not None:
            return plan(q, kv, kv_norm_weight, q_norm_weight, cos, sin, positions, ring, loc, q_out, swa_cache)
    T, H, D = ref.validate(q=q, kv=kv, kv_norm_weight=kv_norm_weight, q_norm_weight=q_norm_weight, eps=eps,
                           rope_dim=rope_dim, cos=cos, sin=sin, positions=positions, rope_style=rope_style,
                           ring=ring, loc=loc, q_out=q_out, swa_cache=swa_cache, swa_page_size=swa_page_size,
                           check_values=mode == "host")
    eps, rope_dim = float(eps), int(rope_dim)  # numpy scalars: their values (kernel arguments)
    if q_out is None:
        q_out = torch.empty((T, H, D), dtype=q.dtype, device=q.device)
    kv_out = torch.empty((T, D), dtype=kv.dtype, device=kv.device)
    launches = launch(q_out=q_out, kv_out=kv_out, q=q, kv=kv, kv_norm_weight=kv_norm_weight,
                      q_norm_weight=q_norm_weight, eps=eps, rope_dim=rope_dim, cos=cos, sin=sin, positions=positions,
                      rope_style=rope_style, ring=ring, loc=loc, swa_cache=swa_cache, swa_page_size=swa_page_size,
                      flags=device_checks.record(q.device) if mode == "device" else None)
    if key is not None and len(launches) == 1 and launches[0][0] is not None:
        dispatch.remember(key, dispatch.Plan(*launches[0], device_checked=mode == "device",
                                             q_meta=((T, H, D), q.dtype, q.device),
                                             kv_meta=((T, D), kv.dtype, kv.device)))
    return q_out, kv_out


# ----------------------------------------------------------------------------- the gate

@dataclass(frozen=True)
class QkNormRopeDecision:
    use_fused: bool  # run the one-launch kernel (else the two-launch chain)
    in_kernel_store: bool  # the kernel writes the ring itself
    return_kv: bool  # kv goes back to the caller (attention's k/v + the backend's own store)


def verify_switch_from_env() -> bool:
    """The verify switch (SGLang: SGLANG_OPT_FUSED_QK_NORM_ROPE_VERIFY), default on."""
    return os.environ.get(VERIFY_SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def gate(*, unified: bool, forward_mode: str, verify_switch: bool, fused_non_unified: bool = True
         ) -> QkNormRopeDecision:
    """Pure dispatch decision (seed 000, ``MQALayer._forward_prepare``).

    Unified KV: fused in decode (with the in-kernel store: decode is a 1-source consumer) and
    in target-verify only when the switch is on — and then *without* the store, returning kv.
    Non-unified KV: fused with its own SWA-cache store when the model enables it.
    """
    ref.validate_forward_mode(forward_mode)
    unified, verify_switch = check_bool("unified", unified), check_bool("verify_switch", verify_switch)
    fused_non_unified = check_bool("fused_non_unified", fused_non_unified)
    fuse_verify = verify_switch and forward_mode == "target_verify"
    use = (unified and (forward_mode == "decode" or fuse_verify)) or (not unified and fused_non_unified)
    store_in_kernel = use and not (unified and fuse_verify)
    return QkNormRopeDecision(use_fused=use, in_kernel_store=store_in_kernel, return_kv=not store_in_kernel)


def qk_norm_rope_step(*, forward_mode, ring, loc, swa_cache=None, swa_page_size=None, gate_fn=gate,
                      verify_switch=None, fused_non_unified=True, checked=None, **kw):
    """One prepare step as the model runs it: gate, launch(es), store. The layer is unified
    (``ring``, the bf16 ring) or non-unified (``swa_cache`` + ``swa_page_size``, the paged fp8
    SWA cache; ``ring`` None); ``fused_non_unified`` is the model's switch for the latter.

    Returns {"q_out", "kv_out" (None when the kernel stored and kept kv)}.
    Contract: unified decode: ring[loc] holds the rotated kv afterwards; unified target_verify:
    the ring is untouched here and kv_out is returned for attention and the backend's causal
    store. Non-unified, every mode: swa_cache holds loc's records afterwards (the kernel's own
    store, or the chain's launch 3' when the switch is off) and no kv is handed back. As in the
    model, the backend stores a non-unified chunk exactly when kv comes back (``return_kv``).
    ``checked``: the fused launch's (``qk_norm_rope``); the chain's launches check on the host.
    """
    ref.validate_forward_mode(forward_mode)
    switch = verify_switch_from_env() if verify_switch is None else check_bool("verify_switch", verify_switch)
    unified = swa_cache is None
    d = gates.decide(gate_fn, unified=unified, forward_mode=forward_mode, verify_switch=switch,
                fused_non_unified=check_bool("fused_non_unified", fused_non_unified))
    store = dict(ring=ring, loc=loc) if unified else dict(ring=ring, swa_cache=swa_cache, swa_page_size=swa_page_size,
                                                          loc=loc)  # ring given too: validate names swa_cache
    if d.use_fused:
        q_out, kv_out = qk_norm_rope(**(store if d.in_kernel_store else {}), checked=checked, **kw)
    else:
        q_out, kv_out = ref.qk_norm_rope(**kw)
    if not unified and d.return_kv:  # kv handed back: the backend's own paged store (launch 3') runs
        ref.validate(**kw, **store)  # checked before the first byte of the cache is written
        swa.swa_paged_store(kv_out, swa_cache, loc, swa.SwaLayout(kv_out.shape[1], int(kw["rope_dim"]),
                                                                  int(swa_page_size)))
    elif not d.in_kernel_store and forward_mode == "decode":
        ref.ring_store(kv_out, ring, loc)  # the backend stores before a 1-source decode
    return {"q_out": q_out, "kv_out": kv_out if d.return_kv else None}


def compile_specs():
    """Signatures for the ahead-of-time compile check (``python -m harness compile``): one per
    constexpr variant that the wrapper can launch."""
    sig = {
        "q_out_ptr": "*bf16", "kv_out_ptr": "*bf16", "ring_ptr": "*bf16", "q_ptr": "*bf16", "kv_ptr": "*bf16",
        "q_w_ptr": "*bf16", "kv_w_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64",
        "loc_ptr": "*i64", "T": "i32", "H": "i32", "D": "i32", "R": "i32", "eps": "fp32",
        "stride_q_t": "i32", "stride_q_h": "i32", "stride_kv_t": "i32", "stride_qo_t": "i32", "stride_qo_h": "i32",
        "stride_kvo_t": "i32", "stride_ring_s": "i32", "stride_cs_p": "i32", "n_pos": "i32", "n_slots": "i32",
        "pool_ptr": "*u8", "pool_fp8_ptr": "*fp8e4nv", "stride_pool_p": "i32", "page_size": "i32",
        "flag_ptr": "*i64",
    }
    specs = []
    # the launch shapes of block_config's three tiles: a small launch, T 1 of any H, and the rest
    shapes = ((1, 16), (1, None), (None, None))
    # checked="device" (its value checks in the kv program) on the plain layout of each store
    checks = [(False, False, store, True) for store in ("none", "ring", "paged")]
    for (has_q_w, neox, store, check), (T, H) in itertools.product(
            [(q, n, st, False) for q in (False, True) for st in ("none", "ring", "paged") for n in (False, True)]
            + checks, shapes):
        if check and T == 1 and H is None:
            continue  # the T 1 tile of a huge H: its checks are the small launch's code
        block_t, block_d, warps = block_config(512, interpreted=False, T=T, H=H)
        const = {"BLOCK_T": block_t, "BLOCK_D": block_d, "HAS_Q_WEIGHT": has_q_w,
                 "HAS_STORE": store == "ring", "IS_NEOX": neox, "BLOCK_R": 64, "PARTNER_IN_REGS": True, "VEC": 8,
                 "PAGED_FP8_STORE": store == "paged",
                 "FP8_MAX": swa.SWA_FP8_MAX, "AMAX_FLOOR": swa.SWA_AMAX_FLOOR, "CHECK_VALUES": check, "BLOCK_S": 256}
        specs.append((f"qk_norm_rope_kernel[qw={int(has_q_w)},store={store},neox={int(neox)},block_t={block_t},"
                      f"warps={warps}{',device-checked' if check else ''}]",
                      kern.qk_norm_rope_kernel, sig, const, warps))
    return specs
