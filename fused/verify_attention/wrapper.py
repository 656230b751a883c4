"""Fused target-verify attention (seeds 002, 003): launch wrappers, ``can_handle``, the backend
gate (a pure function) and the dispatcher shared-KV → split-KV → reference.

Kernels live in ``fused/verify_attention/kernels.py`` (one jit helper holds the math). Both
paths launch the prefix kernel writing per-split partials ``(m, l, v_scale·Σp·v)`` and one
combine kernel that adds the draft triangle and merges by log-sum-exp:
  split-KV   prefix grid (B, H, S) at BLOCK_H 1, combine grid (B, H) — per-head baseline;
  shared-KV  prefix grid (B, H/BLOCK_H, S), combine (B, H/BLOCK_H)   — one KV tile per head block.

Value checks (``checked``, every entry point; None: ``VP_CHECK_VALUES``, ``reference.checks.value_check_mode``)
of qo_indptr (rises from 0 to T, no request without a draft), kv_indptr (rises from 0 to at most
len(kv_indices)) and the slots ``kv_indices[:kv_indptr[-1]]`` (inside the pool):

- True (the default): on the host before any launch, the reference's ``validate`` (host syncs:
  5 per kernel call, 10 through the dispatcher, with the widths' read below).
- ``"device"``: by the kernels, no host sync (``fused.device_checks``): the combine programs check
  qo_indptr, the prefix programs kv_indptr and each slot they read; ``fused.device_checks.raise_pending()``
  raises the host check's error later (its type, naming the same argument). A request whose
  kv_indptr entries do not lie inside kv_indices reads no slot (its prefix is empty), a slot outside
  the pool is no key (never read), and a request whose qo_indptr entries are bad still has rows
  b·L .. b·L + L − 1 (the kernels never index through qo_indptr): its o rows are those rows' attention.
- False: none; the caller guarantees them (a bad slot is then read outside the pool).

The kernels index drafts as b·L + i, so the routing needs to know whether every request has the same
width (``shape_of``): from ``batch_planned``'s plan when one is active (read once when it was made),
else from ``verify_width`` (the caller's word: every request has that many rows, qo_indptr =
arange(B + 1)·verify_width, as an engine builds it for a chain verify of its fixed draft width; B·width
must be T, and the rows are checked against qo_indptr where a kernel runs: on the host by True, in
the combine programs by "device", kind ``ATT_QO_WIDTH``), else by reading qo_indptr on the host
(one sync). ``checked="device"`` reads no value on the host: without a plan or ``verify_width`` it is
an UnsupportedError naming verify_width. A call the gate or ``can_handle`` sends to the reference
chain is checked there, on the host, whatever ``checked`` says (the chain reads the indptrs to loop).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
import triton

from fused import device_checks, gates
from fused.compile_specs import variant
from fused.verify_attention import kernels as kern
# the launch configuration per arch (fused.verify_attention.config; harness.bench.sweep tunes its BLOCK_CONFIG)
from fused.verify_attention.config import arch, block_config, block_h_for, combine_block_h_for, l_pad_for
from reference.verify_attention import chain as ref
from reference.checks import (
    RangeError,
    UnsupportedError,
    check_bool,
    check_choice,
    check_int,
    value_check_mode,
    values_read,
    values_unchecked,
)

KV_DTYPES = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# fp8 flavours a compiled backend converts natively (the interpreter converts both through the shim)
ARCH_KV_DTYPES = {"sm90": (torch.bfloat16, torch.float8_e4m3fn), "gfx942": (torch.bfloat16, torch.float8_e4m3fnuz),
                  "gfx950": (torch.bfloat16, torch.float8_e4m3fn)}


# ----------------------------------------------------------------------------- can_handle

def shape_can_handle(kind: str, *, uniform: bool, H: int, Hkv: int, D: int, Dv: int, kv_dtype: torch.dtype,
                     block_h: int | None = None, arch_name: str | None = None) -> bool | str:
    """True, or why the ``kind`` ("split_kv" | "shared_kv") kernel cannot run this shape. Any
    prefix lengths, 0 included: an empty split stores (m, l, acc) = (−inf, 0, 0) and the combine
    starts from the draft partial, which always has a key (no prefix at all: kv_indices may be
    empty, its pointer is never read)."""
    arch_name = arch_name or arch()
    if not uniform:
        return "ragged verify widths (the kernels index drafts as b·L + i)"
    if Hkv < 1 or H % Hkv:
        return f"num_heads {H} % num_kv_heads {Hkv} != 0"
    if D < Dv:
        return f"head_dim {D} < v_head_dim {Dv}"
    if 0 < D - Dv < 16:
        return f"rope part D - Dv = {D - Dv} < 16 (tl.dot needs K >= 16)"
    if kv_dtype not in ARCH_KV_DTYPES.get(arch_name, KV_DTYPES):
        return f"kv dtype {kv_dtype} unsupported on {arch_name}"
    if kind == "shared_kv":
        group = H // Hkv
        bh = block_h or block_h_for(group, D)
        if group % bh:
            return f"KV_GROUP_NUM {group} % BLOCK_H {bh} != 0"
        if bh == 1 and group > 1:
            return "no head sharing possible (BLOCK_H would be 1)"
    return True


_PLANNED = contextvars.ContextVar("verify_parity_verify_batch_meta", default=None)


@contextlib.contextmanager
def batch_planned(**inputs):
    """While the block runs, ``shape_of`` returns this batch's host metadata, read once here (outside
    any capture), as SGLang's backend reads it before it captures a graph (``init_forward_metadata``):
    the calls of a CUDA graph check (``harness.gpu.runners.capture_safe``). The plan reads qo_indptr
    (unless ``verify_width`` is among ``inputs``), whatever ``checked`` says."""
    token = _PLANNED.set(shape_of(**{k: v for k, v in inputs.items() if k != "checked"}))
    try:
        yield
    finally:
        _PLANNED.reset(token)


def shape_of(q, k_buffer, v_buffer, qo_indptr, verify_width=None, checked=None, **_):
    """What the kernels' shape rule (``shape_can_handle``) reads of a call: uniform widths, heads, head
    dims, the KV dtype. The widths (module docstring): ``batch_planned``'s plan, else ``verify_width``
    (uniform when B·verify_width is T), else qo_indptr read on the host; ``checked="device"`` reads no
    value: without either, an UnsupportedError naming verify_width."""
    planned = _PLANNED.get()
    if planned is not None:
        return planned
    if verify_width is not None:
        uniform = verify_width * (qo_indptr.shape[0] - 1) == q.shape[0]
    elif value_check_mode(checked) == "device":
        raise UnsupportedError("verify_width", "checked='device' reads no value on the host, and the kernels "
                                               "need every request's width: pass verify_width (the draft tokens "
                                               "of every request) or call inside batch_planned(...)")
    else:
        qo = qo_indptr.tolist()
        uniform = len({qo[i + 1] - qo[i] for i in range(len(qo) - 1)}) == 1
    return dict(uniform=uniform, H=q.shape[1], Hkv=k_buffer.shape[1], D=q.shape[2], Dv=v_buffer.shape[2],
                kv_dtype=k_buffer.dtype)


def check_verify_width(verify_width, *, q, qo_indptr, host_values: bool = False) -> None:
    """``verify_width`` (None, or an int >= 1 whose B·verify_width is T: no value read); with
    ``host_values`` also qo_indptr = arange(B + 1)·verify_width, read on the host (one sync; not while
    a CUDA graph is captured, nor inside ``reference.checks.values_unchecked``)."""
    if verify_width is None:
        return
    w, B, T = check_int("verify_width", verify_width, low=1), qo_indptr.shape[0] - 1, q.shape[0]
    if B * w != T:
        raise RangeError("verify_width", f"{B} requests of {w} rows are not the {T} rows of q")
    if not host_values or not values_read() or (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    qo = qo_indptr.tolist()
    for b in range(B):
        if qo[b] != b * w or qo[b + 1] != b * w + w:
            raise RangeError("qo_indptr", f"request {b}'s rows [{qo[b]}, {qo[b + 1]}) are not [{b}·{w}, "
                                          f"({b} + 1)·{w}) of its uniform width {w}")


def can_handle(kind: str, **inputs) -> bool | str:
    """Tensor-level ``can_handle`` of one kernel ("split_kv" | "shared_kv")."""
    return shape_can_handle(kind, **shape_of(**inputs))


# ----------------------------------------------------------------------------- launches

# p_precision -> SINGLE_P_DOT of the kernels: how P meets V in every P·V product
P_PRECISIONS = {
    "bf16x2": False,  # P = P_hi + P_lo, two bf16 dots (~16 mantissa bits): class exact-fp32
    "bf16": True,  # one dot of bf16(P), as FlashAttention: class bf16-p (the shared-KV kernel only)
}


# query heads per program (BLOCK_H·L_PAD rows of one tile): the table's largest is 16; 256 leaves room for
# twice the largest TP-local head count (128), which the KV-head-straddling mutant launches
MAX_BLOCK_H = 256


def _single_p_dot(kind: str, p_precision) -> bool:
    check_choice("p_precision", p_precision, tuple(P_PRECISIONS))
    if kind != "shared_kv" and P_PRECISIONS[p_precision]:
        raise UnsupportedError("p_precision", f"the {kind} kernel computes P·V as bf16x2 only, got {p_precision!r}")
    return P_PRECISIONS[p_precision]


def _check_kernel_knobs(kind: str, *, block_h, combine_block_h, topk, custom_mask) -> None:
    """What the kernels do not cover, and their own knobs (no device values read): tree masks
    (topk > 1: both kernels compute the causal chain, the dispatcher never sends them a tree);
    ``block_h`` / ``combine_block_h`` None or a power of two in [1, MAX_BLOCK_H], and the
    split-KV kernel takes one head per program."""
    if custom_mask is not None or topk != 1:
        raise UnsupportedError("custom_mask" if custom_mask is not None else "topk",
                               f"the {kind} kernel computes the causal chain only (topk 1, no tree mask), got "
                               f"topk={topk!r}, custom_mask {'given' if custom_mask is not None else 'None'}; "
                               f"fused.verify_attention.wrapper sends trees to the reference")
    for arg, val in (("block_h", block_h), ("combine_block_h", combine_block_h)):
        if val is not None and (check_int(arg, val, low=1, high=MAX_BLOCK_H) & (val - 1)):
            raise RangeError(arg, f"must be a power of two in [1, {MAX_BLOCK_H}], got {val!r}")
    if kind == "split_kv" and block_h not in (None, 1):
        raise UnsupportedError("block_h", f"the split_kv kernel runs one query head per program, "
                                          f"got block_h={block_h!r}")


def _dims(D: int, Dv: int) -> dict:
    """The head-dimension constexprs of every kernel: the nope (GQA: all of D) and rope parts of q·k,
    the value width, and their power-of-two tiles."""
    pe_dim = D - Dv
    return dict(NOPE_DIM=D - pe_dim, PE_DIM=pe_dim, DV=Dv, BLOCK_DN=triton.next_power_of_2(D - pe_dim),
                BLOCK_DPE=max(1, triton.next_power_of_2(pe_dim)),  # next_power_of_2(0) == 0 (seed 002)
                BLOCK_DV=triton.next_power_of_2(Dv))


def launch(kind, *, q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale, is_causal=True,
           k_scale=1.0, v_scale=1.0, num_kv_splits=1, o=None, block_h=None, combine_block_h=None, check=True,
           validate=True, stages=("prefix", "combine"), p_precision="bf16x2", prefix_splits=None, checked=None,
           verify_width=None, **_routing):
    """``checked``, ``verify_width``: the value checks and the widths (module docstring). ``check=False`` skips can_handle and ``prefix_splits`` launches the prefix kernel over that
    many splits instead of ``num_kv_splits`` (mutants only); ``validate=False`` skips the
    host-syncing argument checks and ``stages`` leaves a launch out (the benchmark's time breakdown).
    ``p_precision`` (``P_PRECISIONS``): "bf16x2", or "bf16" for the shared-KV kernel's single-dot
    variant (precision class bf16-p: P rounded to bf16 before every P·V, prefix and drafts).
    ``combine_block_h``: query heads per combine program (default: ``combine_block_h_for``; a
    power of two dividing the group). The combine reads per-(token, head, split) partials, so its
    head blocking is free: the sweep's knob for its grid (B × H / BLOCK_H programs: 64 for
    B 64, H 16 at BLOCK_H 16, on a 132-SM GPU)."""
    single_p_dot = _single_p_dot(kind, p_precision)
    mode = value_check_mode(checked)
    if validate:
        every = dict(q=q, k=k, v=v, k_buffer=k_buffer, v_buffer=v_buffer, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                     kv_indices=kv_indices, sm_scale=sm_scale, is_causal=is_causal, k_scale=k_scale, v_scale=v_scale,
                     num_kv_splits=num_kv_splits, o=o, **_routing)
        _validate(mode, every)
        check_verify_width(verify_width, q=q, qo_indptr=qo_indptr, host_values=mode == "host")
    _check_kernel_knobs(kind, block_h=block_h, combine_block_h=combine_block_h, topk=_routing.get("topk", 1),
                        custom_mask=_routing.get("custom_mask"))
    sm_scale, k_scale, v_scale = float(sm_scale), float(k_scale), float(v_scale)  # kernel arguments: their values
    num_kv_splits, is_causal = int(num_kv_splits), bool(is_causal)
    (T, H, D), Hkv, Dv, B = q.shape, k_buffer.shape[1], v_buffer.shape[2], qo_indptr.shape[0] - 1
    group = H // Hkv
    if kind == "shared_kv":
        block_h = block_h or block_h_for(group, D)
    else:
        block_h = 1
    if check:
        shape = shape_of(q=q, k_buffer=k_buffer, v_buffer=v_buffer, qo_indptr=qo_indptr, verify_width=verify_width,
                         checked=checked)
        verdict = shape_can_handle(kind, block_h=block_h, **shape)
        if verdict is not True:  # legal input this kernel does not cover: a typed refusal naming the argument
            arg = ("k_buffer" if verdict.startswith("kv dtype") else "qo_indptr" if verdict.startswith("ragged")
                   else "v" if "v_head_dim" in verdict or "rope part" in verdict else "q")
            raise UnsupportedError(arg, f"{kind} kernel cannot run this input: {verdict}")
    L = T // B
    # the default divides BLOCK_H, which can_handle checked (unless check=False)
    cbh = combine_block_h or combine_block_h_for(L, block_h)
    if combine_block_h is not None and (cbh & (cbh - 1) or (group % cbh and Hkv > 1) or cbh > H):
        raise ValueError(f"combine_block_h {cbh}: must be a power of two <= H {H} dividing KV_GROUP_NUM {group}")
    _, block_n, num_warps, num_stages = block_config(D)
    l_pad = l_pad_for(L, block_h)
    S = num_kv_splits
    if o is None:
        o = torch.empty(T, H, Dv, dtype=q.dtype, device=q.device)
    mid_acc = torch.empty(T, H, S, Dv, dtype=torch.float32, device=q.device)
    mid_ml = torch.empty(T, H, S, 2, dtype=torch.float32, device=q.device)
    dims = _dims(D, Dv)
    common = dict(mid_acc_ptr=mid_acc, mid_ml_ptr=mid_ml, q_ptr=q, k_buffer_ptr=k_buffer, v_buffer_ptr=v_buffer,
                  kv_indptr_ptr=kv_indptr, kv_indices_ptr=kv_indices, L=L, H=H, num_kv_splits=S,
                  scale=sm_scale * k_scale, v_scale=v_scale, stride_q_t=q.stride(0), stride_q_h=q.stride(1),
                  stride_kb_s=k_buffer.stride(0), stride_kb_h=k_buffer.stride(1),
                  stride_vb_s=v_buffer.stride(0), stride_vb_h=v_buffer.stride(1),
                  kv_group_num=group, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages, **dims)
    # the split-KV kernel is the shared-KV one at BLOCK_H 1, reading its KV head per query head
    has_kv_heads = (Hkv > 1) if kind == "shared_kv" else True
    flags = device_checks.record(q.device) if mode == "device" else None
    if "prefix" in stages:
        kern.verify_prefix_kernel[(B, triton.cdiv(H, block_h), prefix_splits or S)](
            HAS_KV_HEADS=has_kv_heads, BLOCK_H=block_h, L_PAD=l_pad, SINGLE_P_DOT=single_p_dot, **common,
            **({"flag_ptr": flags, "n_kv_indices": kv_indices.shape[0], "pool_rows": k_buffer.shape[0],
                "CHECK_VALUES": True} if flags is not None else {}))
    if "combine" not in stages:
        return {"o": o}
    kern.verify_combine_kernel[(B, triton.cdiv(H, cbh))](
        o_ptr=o, mid_acc_ptr=mid_acc, mid_ml_ptr=mid_ml, q_ptr=q, k_ptr=k, v_ptr=v, L=L, H=H, num_kv_splits=S,
        sm_scale=sm_scale, stride_q_t=q.stride(0), stride_q_h=q.stride(1), stride_k_t=k.stride(0),
        stride_k_h=k.stride(1), stride_v_t=v.stride(0), stride_v_h=v.stride(1), kv_group_num=group,
        HAS_KV_HEADS=has_kv_heads, IS_CAUSAL=bool(is_causal), BLOCK_H=cbh,
        L_PAD=l_pad_for(L, cbh), L_KEYS=max(16, triton.next_power_of_2(L)), SINGLE_P_DOT=single_p_dot,
        num_warps=num_warps, **dims,
        **({"flag_ptr": flags, "qo_ptr": qo_indptr, "CHECK_VALUES": True} if flags is not None else {}))
    return {"o": o}


def _validate(mode: str, kw: dict) -> None:
    """The reference's ``validate``: reading the index values on the host in mode "host" (``value_check_mode``),
    else every check that reads no value (the tree-mask rule included)."""
    if mode == "host":
        ref.validate(**kw)
        return
    with values_unchecked():
        ref.validate(**kw)
    ref.check_mask_given(kw.get("custom_mask"), kw.get("topk", 1))


def verify_split_kv(**kw):
    """Per-head split-KV kernel; same contract as ``reference.verify_attention.chain.verify_attention``
    for topk == 1: a tree mask is refused (UnsupportedError; the gate never routes one here)."""
    return launch("split_kv", **kw)


def verify_shared_kv(*, p_precision="bf16x2", **kw):
    """Grouped shared-KV kernel; same contract, topk == 1 only (a tree mask: UnsupportedError).
    ``p_precision="bf16"``: the single-dot variant, one bf16(P)·V product per tile instead of two
    (precision class bf16-p); "bf16x2" (default): exact-fp32."""
    return launch("shared_kv", p_precision=p_precision, **kw)


# ----------------------------------------------------------------------------- the gate

@dataclass(frozen=True)
class VerifyRoute:
    shared_kv: bool  # try the grouped shared-KV kernel first
    split_kv: bool  # then the per-head split-KV kernel (else the reference / extend path)


def local_kv_heads(total_kv_heads: int, tp_size: int) -> int:
    """KV heads on one rank after TP: heads are split, and replicated once tp_size > total."""
    if total_kv_heads < 1 or tp_size < 1:
        raise ValueError(f"total_kv_heads and tp_size must be >= 1, got {total_kv_heads}, {tp_size}")
    return max(1, total_kv_heads // tp_size)


def gate(*, model_family: str, topk: int, use_mla: bool, splitkv_switch: bool, num_local_kv_heads: int
         ) -> VerifyRoute:
    """Pure backend decision (SGLang ``_should_use_verify_shared_kv`` of seeds 002/003).

    Shared-KV only at topk == 1 (the kernel ignores tree masks): MLA only for Kimi-K3; the
    DSpark draft (GQA, non-causal, several KV heads) when the split-KV switch is on; Qwen3.5 /
    MiniMax GQA when the switch is on and exactly one KV head is local. Split-KV whenever the
    switch is on at topk == 1. Everything else takes the generic path (the reference chain).
    """
    check_choice("model_family", model_family, ref.MODEL_FAMILIES)
    use_mla, splitkv_switch = check_bool("use_mla", use_mla), check_bool("splitkv_switch", splitkv_switch)
    chain = topk == 1
    if not chain:
        return VerifyRoute(False, False)
    if use_mla:
        shared = model_family == "kimi-k3"
    elif model_family == "dspark-draft":
        shared = splitkv_switch
    else:
        shared = splitkv_switch and model_family in ("qwen3.5", "minimax") and num_local_kv_heads == 1
    return VerifyRoute(shared_kv=shared, split_kv=splitkv_switch)


def verify_attention(*, gate_fn=gate, checked=None, verify_width=None, **kw):
    """The backend's target-verify step: gate, then shared-KV → split-KV → reference, each
    kernel tried only if its ``can_handle`` accepts. Returns {"o": ...}; same answer on every path.
    ``checked``, ``verify_width``: the module docstring (the reference checks on the host)."""
    _validate(value_check_mode(checked), kw)
    check_verify_width(verify_width, q=kw["q"], qo_indptr=kw["qo_indptr"])
    D, Dv = kw["q"].shape[2], kw["v"].shape[2]
    route = gates.decide(gate_fn, model_family=kw.get("model_family", "generic"), topk=kw.get("topk", 1), use_mla=D != Dv,
                    splitkv_switch=kw.get("splitkv_switch", True), num_local_kv_heads=kw["k_buffer"].shape[1])
    fused_kw = dict(kw, checked=checked, verify_width=verify_width)
    if route.shared_kv and can_handle("shared_kv", **fused_kw) is True:
        return verify_shared_kv(**fused_kw)
    if route.split_kv and can_handle("split_kv", **fused_kw) is True:
        return verify_split_kv(**fused_kw)
    return ref.verify_attention(**kw)


# ----------------------------------------------------------------------------- compile check

def compile_specs():
    """Signatures for ``python -m harness compile``: every constexpr variant the wrappers launch
    on sm90, for GQA D 64/128/256 and MLA 576/512, bf16 and fp8 KV: the prefix kernel at BLOCK_H 1
    (split-KV) and at the shared-KV head block, and the combine, both also with SINGLE_P_DOT
    (``p_precision="bf16"``), and each kernel's ``checked="device"`` variant (CHECK_VALUES): the
    prefix at BLOCK_H 1 and at the head block, the causal combine. Arguments and constexprs are the kernels' own (``fused.compile_specs``)."""
    specs = []
    for (D, Dv, hkv), kv in [((64, 64, 2), "bf16"), ((128, 128, 1), "bf16"), ((256, 256, 1), "bf16"),
                             ((256, 256, 1), "fp8e4nv"), ((576, 512, 1), "bf16"), ((576, 512, 1), "fp8e4nv")]:
        _, block_n, warps, _ = block_config(D, "sm90")
        dims = _dims(D, Dv)
        bh = block_h_for(16 // hkv if hkv > 1 else 16, D, "sm90")
        pre_types = {"mid_acc_ptr": "*fp32", "mid_ml_ptr": "*fp32", "q_ptr": "*bf16", "k_buffer_ptr": f"*{kv}",
                     "v_buffer_ptr": f"*{kv}", "kv_indptr_ptr": "*i32", "kv_indices_ptr": "*i32", "scale": "fp32",
                     "v_scale": "fp32", "flag_ptr": "*i64"}
        tag = f"D={D},Dv={Dv},hkv={hkv},kv={kv}"
        specs += [variant(f"{tag},split_kv{',checked' if chk else ''}", kern.verify_prefix_kernel, pre_types,
                          dict(HAS_KV_HEADS=True, BLOCK_H=1, L_PAD=l_pad_for(4, 1), BLOCK_N=block_n,
                               SINGLE_P_DOT=False, CHECK_VALUES=chk, **dims), warps) for chk in (False, True)]
        for single, chk in ((False, False), (True, False), (False, True)):  # p_precision bf16x2 / bf16; checked
            specs.append(variant(f"{tag}{',single_p_dot' if single else ''}{',checked' if chk else ''}",
                                 kern.verify_prefix_kernel, pre_types,
                                 dict(HAS_KV_HEADS=hkv > 1, BLOCK_H=bh, L_PAD=l_pad_for(4, bh), BLOCK_N=block_n,
                                      SINGLE_P_DOT=single, CHECK_VALUES=chk, **dims), warps))
        comb_types = {"o_ptr": "*bf16", "mid_acc_ptr": "*fp32", "mid_ml_ptr": "*fp32", "q_ptr": "*bf16",
                      "k_ptr": "*bf16", "v_ptr": "*bf16", "sm_scale": "fp32", "flag_ptr": "*i64", "qo_ptr": "*i32"}
        # the single-dot combine causal, and non-causal where its shared-KV user is (DSpark: several KV heads)
        for causal, single, chk in ((True, False, False), (False, False, False), (True, True, False),
                                    (False, True, False), (True, False, True)):
            if single and not causal and hkv == 1:
                continue
            specs.append(variant(f"{tag},causal={int(causal)}{',single_p_dot' if single else ''}"
                                 f"{',checked' if chk else ''}", kern.verify_combine_kernel, comb_types,
                                 dict(HAS_KV_HEADS=hkv > 1, IS_CAUSAL=causal, BLOCK_H=bh, L_PAD=l_pad_for(4, bh),
                                      L_KEYS=16, SINGLE_P_DOT=single, CHECK_VALUES=chk, **dims), warps))
    return specs
