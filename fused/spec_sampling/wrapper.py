"""Fused chain speculative sampling: the target softmax of every row, the acceptance walk, the
residual and the inverse-CDF sample of every request in one launch.

Grid ``(cdiv(B, BLOCK_B),)``: a program owns BLOCK_B requests (1 at real vocabularies: one program
streams a request's rows; more at small V, where a request is a few hundred bytes). It walks rows
j = 0..L; at each, for the requests still walking, one pass over the row in BLOCK_V chunks gives
the online softmax statistics of ``target_logits / temperature`` (running maximum and rescaled sum)
and the scaled logit at the draft token, so p_j(x_j) = exp(z_x − m) / s; the draft is accepted iff
u_j · q_j(x_j) < p_j(x_j) (``reference.spec_sampling.chain``). A request that stops at row j (a
rejection, or row L after a full chain) takes two more passes over that row: the total of the
residual max(p − q, 0) (q = 0 at row L) and of p, then the inverse CDF of its sample uniform — a
running sum across chunks (``tl.cumsum`` within one), counting the running sums <= u · S, which is
the first index whose sum exceeds it. Rows after a request's stop are never read. Each output
element has one writer, no scratch, no atomics: exact for given uniforms, and deterministic for a
given seed.

Randomness: ``uniforms`` (B, L + 1) when given (``HAS_UNIFORMS``); else ``tl.rand(seed, b·(L + 1) + j)``
(Philox), one stream per (request, column), so the requests of a batch are independent draws.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from fused import device_checks
from fused.compile_specs import variant
from fused.device_checks import (
    DRAFT,
    DRAFT_PROBS,
    LOGITS_NAN,
    LOGITS_ROW,
    TEMPERATURE,
    UNIFORMS,
    note,
)
from reference.checks import value_check_mode
from reference.spec_sampling import chain as ref


# V and the row strides stay specialized (a variant per divisibility by 16): unspecialized, every fp32 element is
# a 4-byte load of its own instead of 16-byte vectors (fused.verify_accept.kernels says more; tests/test_vector_loads.py)
@triton.jit(do_not_specialize=["seed", "B", "L"])
def spec_sampling_kernel(
    out_ptr,  # (B, L + 1) int32 out: accepted drafts, the sampled token, then -1
    len_ptr,  # (B,) int32 out: accepted drafts
    logits_ptr,  # (B, L + 1, V) fp32/bf16 target logits, unit stride on the last axis
    temp_ptr,  # (B,) fp32 temperature > 0
    q_ptr,  # (B, L, V) fp32 draft probabilities, unit stride on the last axis
    draft_ptr,  # (B, L) int32/int64 draft tokens, contiguous
    u_ptr,  # (B, L + 1) fp32 uniforms in [0, 1) (read only with HAS_UNIFORMS)
    seed,  # Philox seed of the kernel's own uniforms (without HAS_UNIFORMS)
    B,  # requests
    V,  # vocabulary
    L,  # drafts per request
    stride_lb, stride_lj,  # target_logits strides of the request and row axes (elements)
    stride_qb, stride_qj,  # draft_probs strides of the request and row axes (elements)
    BLOCK_B: tl.constexpr,  # requests per program
    BLOCK_V: tl.constexpr,  # vocabulary entries per chunk
    HAS_UNIFORMS: tl.constexpr,  # the uniforms are an input (else drawn here from seed)
    CHECK_VALUES: tl.constexpr = False,  # checked="device": a draft outside [0, V) is rejected, never read at
):
    """The op's one launch (module docstring): BLOCK_B requests' walks, residuals and samples."""
    rb = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    live = rb < B
    rb64 = rb.to(tl.int64)
    temp = tl.load(temp_ptr + rb, mask=live, other=1.0)
    offs = tl.arange(0, BLOCK_V)
    n_chunks = tl.cdiv(V, BLOCK_V)
    u_col = rb64 * (L + 1)  # each request's first uniform
    if HAS_UNIFORMS:
        u_sample = tl.load(u_ptr + u_col + L, mask=live, other=0.0)
    else:
        u_sample = tl.rand(seed, (u_col + L).to(tl.int32))
    walking = live
    n = tl.zeros([BLOCK_B], dtype=tl.int32)
    tok = tl.full([BLOCK_B], -1, tl.int32)
    for j in range(0, L + 1):
        is_draft = tl.full([BLOCK_B], j, tl.int32) < L  # a vector: the interpreter's masks need one
        row = logits_ptr + rb64[:, None] * stride_lb + j * stride_lj  # (BLOCK_B, 1)
        qrow = q_ptr + rb64[:, None] * stride_qb + j * stride_qj  # (BLOCK_B, 1)
        x = tl.load(draft_ptr + rb64 * L + j, mask=walking & is_draft, other=0).to(tl.int32)
        if CHECK_VALUES:  # (spec_sampling_check_kernel records it): no q read past the row; the draft is rejected
            x_in = tl.load(draft_ptr + rb64 * L + j, mask=walking & is_draft, other=0).to(tl.int64)
            x_ok = (x_in >= 0) & (x_in < V)
            x = tl.where(x_ok, x, 0)
        else:
            x_ok = walking | ~walking
        # pass 1: online softmax statistics of z = logits / temperature, and z at the draft token
        m = tl.full([BLOCK_B], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_B], dtype=tl.float32)
        zx = tl.zeros([BLOCK_B], dtype=tl.float32)
        any_walking = tl.max(walking.to(tl.int32), axis=0) > 0
        for c in range(0, tl.where(any_walking, n_chunks, 0)):
            idx = c * BLOCK_V + offs
            mask = walking[:, None] & (idx < V)[None, :]
            z = tl.load(row + idx[None, :], mask=mask, other=float("-inf")).to(tl.float32) / temp[:, None]
            m_new = tl.maximum(m, tl.max(z, axis=1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a request not walking: no NaN from -inf - -inf
            s = s * tl.exp(m - m_ref) + tl.sum(tl.exp(z - m_ref[:, None]), axis=1)
            zx += tl.sum(tl.where(idx[None, :] == x[:, None], z, 0.0), axis=1)
            m = m_new
        m_ref = tl.where(m == float("-inf"), 0.0, m)
        s_ref = tl.where(s > 0, s, 1.0)
        px = tl.exp(zx - m_ref) / s_ref
        qx = tl.load(q_ptr + rb64 * stride_qb + j * stride_qj + x, mask=walking & is_draft, other=0.0)
        if HAS_UNIFORMS:
            u = tl.load(u_ptr + u_col + j, mask=walking & is_draft, other=0.0)
        else:
            u = tl.rand(seed, (u_col + j).to(tl.int32))
        accept = walking & is_draft & (u * qx < px) & x_ok
        stop = walking & ~accept
        any_stop = tl.max(stop.to(tl.int32), axis=0) > 0
        # pass 2: totals of the residual max(p - q, 0) (q = 0 at row L) and of p, for the requests stopping here
        w_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
        p_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
        for c in range(0, tl.where(any_stop, n_chunks, 0)):
            idx = c * BLOCK_V + offs
            mask = stop[:, None] & (idx < V)[None, :]
            z = tl.load(row + idx[None, :], mask=mask, other=float("-inf")).to(tl.float32) / temp[:, None]
            p = tl.exp(z - m_ref[:, None]) / s_ref[:, None]
            q = tl.load(qrow + idx[None, :], mask=mask & is_draft[:, None], other=0.0)
            w_sum += tl.sum(tl.maximum(p - q, 0.0), axis=1)
            p_sum += tl.sum(p, axis=1)
        use_p = w_sum <= 0  # the residual vanished (only rounding does that): sample p
        theta = u_sample * tl.where(use_p, p_sum, w_sum)
        # pass 3: inverse CDF — count the running sums <= theta; the last index with weight > 0 caps it
        carry = tl.zeros([BLOCK_B], dtype=tl.float32)
        below = tl.zeros([BLOCK_B], dtype=tl.int32)
        last = tl.full([BLOCK_B], -1, tl.int32)
        for c in range(0, tl.where(any_stop, n_chunks, 0)):
            idx = c * BLOCK_V + offs
            valid = (idx < V)[None, :]
            mask = stop[:, None] & valid
            z = tl.load(row + idx[None, :], mask=mask, other=float("-inf")).to(tl.float32) / temp[:, None]
            p = tl.exp(z - m_ref[:, None]) / s_ref[:, None]
            q = tl.load(qrow + idx[None, :], mask=mask & is_draft[:, None], other=0.0)
            w = tl.where(use_p[:, None], p, tl.maximum(p - q, 0.0))
            w = tl.where(mask, w, 0.0)
            csum = carry[:, None] + tl.cumsum(w, axis=1)
            below += tl.sum((mask & (csum <= theta[:, None])).to(tl.int32), axis=1)
            last = tl.maximum(last, tl.max(tl.where(w > 0, idx[None, :], -1), axis=1))
            carry = tl.max(tl.where(valid, csum, carry[:, None]), axis=1)  # the chunk's last running sum
        tok = tl.where(stop, tl.minimum(below, last), tok)
        n += accept.to(tl.int32)
        walking = accept
    # outputs: drafts before n, the sampled token at n, -1 after
    for j in range(0, L + 1):
        d = tl.load(draft_ptr + rb64 * L + j, mask=live & (n > j), other=-1).to(tl.int32)
        val = tl.where(n > j, d, tl.where(n == j, tok, -1))
        tl.store(out_ptr + rb64 * (L + 1) + j, val, mask=live)
    tl.store(len_ptr + rb, n, mask=live)


@triton.jit(do_not_specialize=["B", "L"])
def spec_sampling_check_kernel(
    flag_ptr,  # (FLAG_WORDS,) int64 error record of fused.device_checks
    logits_ptr, temp_ptr, q_ptr, draft_ptr, u_ptr,  # as spec_sampling_kernel's
    B, V, L,
    stride_lb, stride_lj, stride_qb, stride_qj,
    BLOCK_V: tl.constexpr,
    HAS_UNIFORMS: tl.constexpr,
):
    """checked="device": the host check's rules (``reference.spec_sampling.chain.validate``) over
    row j of request b, program (b, j): its logits (no NaN or +inf, not all −inf), its draft and
    draft probabilities (j < L), its uniform, and the request's temperature (j = 0). Reads every
    row once: the op's own launch reads only the rows up to each request's stop."""
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    if j == 0:
        t = tl.load(temp_ptr + b)
        note(flag_ptr, TEMPERATURE, ~((t > 0) & (t < float("inf"))), b, t.to(tl.int32, bitcast=True), 0, 0)
    if HAS_UNIFORMS:
        u = tl.load(u_ptr + b * (L + 1) + j)
        note(flag_ptr, UNIFORMS, ~((u >= 0) & (u < 1)), b, j, u.to(tl.int32, bitcast=True), 0)
    row = logits_ptr + b * stride_lb + j * stride_lj
    qrow = q_ptr + b * stride_qb + j * stride_qj
    is_draft = j < L
    if is_draft:
        x = tl.load(draft_ptr + b * L + j).to(tl.int64)
        note(flag_ptr, DRAFT, (x < 0) | (x >= V), x, V, 0, 0)
    zero = tl.full((), 0, tl.int32)  # loop-carried scalars: one type from the start (V may be a constexpr 1)
    bad_x = zero + V  # the first bad logit's column, and its value's bits
    bad_xv = zero
    bad_q = zero + V
    bad_qv = zero
    finite = zero
    for c in range(0, tl.cdiv(V, BLOCK_V)):
        idx = c * BLOCK_V + offs
        valid = idx < V
        z = tl.load(row + idx, mask=valid, other=0.0).to(tl.float32)
        bad = valid & ((z != z) | (z == float("inf")))
        first = tl.min(tl.where(bad, idx, V), axis=0)
        bad_xv = tl.where((bad_x == V) & (first < V), tl.max(tl.where(idx == first, z.to(tl.int32, bitcast=True),
                                                                      -(2 ** 31)), axis=0), bad_xv)
        bad_x = tl.minimum(bad_x, first)
        finite += tl.sum((valid & (z > float("-inf")) & (z < float("inf"))).to(tl.int32), axis=0)
        q_in = valid & (tl.full([BLOCK_V], j, tl.int64) < L)  # a vector: the interpreter's masks need one
        q = tl.load(qrow + idx, mask=q_in, other=0.0)
        qbad = q_in & ~((q >= 0) & (q < float("inf")))
        first = tl.min(tl.where(qbad, idx, V), axis=0)
        bad_qv = tl.where((bad_q == V) & (first < V), tl.max(tl.where(idx == first, q.to(tl.int32, bitcast=True),
                                                                      -(2 ** 31)), axis=0), bad_qv)
        bad_q = tl.minimum(bad_q, first)
    note(flag_ptr, DRAFT_PROBS, bad_q < V, b, j, bad_q, bad_qv)
    note(flag_ptr, LOGITS_NAN, bad_x < V, b, j, bad_x, bad_xv)
    note(flag_ptr, LOGITS_ROW, (bad_x == V) & (finite == 0), b, j, 0, 0)


def block_config(B: int, V: int, interpreted: bool) -> tuple[int, int, int]:
    """(BLOCK_B, BLOCK_V, num_warps). Compiled: chunks of up to 4096 entries per request, requests
    packed into a program only while a request's row is smaller than a chunk (small vocabularies).
    The interpreter pays per operation, hardly per element: tiles of up to 2^16 entries, so a
    distributional check's thousands of requests run in a few programs. Not tuned on a GPU yet."""
    bv = min(triton.next_power_of_2(V), 4096)
    budget = (1 << 16) if interpreted else 4096
    bb = max(1, min(triton.next_power_of_2(B), budget // bv, (1 << 16) if interpreted else 256))
    return bb, bv, (1 if interpreted else 4 if bb * bv <= 2048 else 8)


def launch(*, output_ids, accept_length, target_logits, temperature, draft_probs, draft_tokens, uniforms, seed,
           flags: torch.Tensor | None = None) -> None:
    """The one launch. Arguments already validated; ``seed`` an int when ``uniforms`` is None;
    ``flags``: the device's error record (``fused.device_checks``): a check launch first."""
    B, Lp1, V = target_logits.shape
    bb, bv, warps = block_config(B, V, os.environ.get("TRITON_INTERPRET") == "1")
    if flags is not None:
        spec_sampling_check_kernel[(B, Lp1)](
            flag_ptr=flags, logits_ptr=target_logits, temp_ptr=temperature, q_ptr=draft_probs, draft_ptr=draft_tokens,
            u_ptr=uniforms if uniforms is not None else temperature, B=B, V=V, L=Lp1 - 1,
            stride_lb=target_logits.stride(0), stride_lj=target_logits.stride(1),
            stride_qb=draft_probs.stride(0), stride_qj=draft_probs.stride(1),
            BLOCK_V=bv, HAS_UNIFORMS=uniforms is not None, num_warps=4 if bv >= 1024 else 1,
        )
    spec_sampling_kernel[(triton.cdiv(B, bb),)](
        out_ptr=output_ids, len_ptr=accept_length, logits_ptr=target_logits, temp_ptr=temperature,
        q_ptr=draft_probs, draft_ptr=draft_tokens, u_ptr=uniforms if uniforms is not None else temperature,
        seed=0 if seed is None else int(seed), B=B, V=V, L=Lp1 - 1,
        stride_lb=target_logits.stride(0), stride_lj=target_logits.stride(1),
        stride_qb=draft_probs.stride(0), stride_qj=draft_probs.stride(1),
        BLOCK_B=bb, BLOCK_V=bv, HAS_UNIFORMS=uniforms is not None, CHECK_VALUES=flags is not None,
        num_warps=warps,
    )


def spec_sampling(*, target_logits, temperature, draft_probs, draft_tokens, uniforms=None, seed=None, checked=None):
    """Same contract as ``reference.spec_sampling.chain.spec_sampling``, in one launch.

    Shapes: target_logits (B, L + 1, V) fp32/bf16; temperature (B,) fp32; draft_probs (B, L, V) fp32;
    draft_tokens (B, L) int; uniforms (B, L + 1) fp32 or None (then the kernel draws its own from
    ``seed``; None: a seed from torch's global generator). Returns {"output_ids": (B, L + 1) int32,
    "accept_length": (B,) int32}.

    Checks: shapes, dtypes, strides, devices and the seed on every call (no sync). The values
    (``reference.spec_sampling.chain.validate``: drafts in [0, V), temperature finite and > 0,
    draft_probs finite and >= 0, target_logits without NaN or +inf and no row all −inf, uniforms
    in [0, 1)) by ``checked`` (None: ``VP_CHECK_VALUES``; ``reference.checks.value_check_mode``):

    - True (the default): on the host, one sync, before the launch; a RangeError naming the argument.
    - ``"device"``: by a check launch before the op's (``spec_sampling_check_kernel``: it reads every
      row of target_logits and draft_probs once more), no sync (``fused.device_checks``); a draft
      outside [0, V) is rejected without reading its probability, and a request with any bad value
      gets outputs that are not the op's (within its own output row: nothing outside a tensor is
      read or written); ``fused.device_checks.raise_pending()`` raises the host check's RangeError later.
    - False: the caller guarantees them.
    """
    mode = value_check_mode(checked)
    B, L, V = ref.validate(target_logits=target_logits, temperature=temperature, draft_probs=draft_probs,
                           draft_tokens=draft_tokens, uniforms=uniforms, seed=seed,
                           check_values=mode == "host")
    if uniforms is None and seed is None:
        seed = int(torch.randint(0, ref.SEED_MAX, ()))
    dev = target_logits.device
    out = torch.empty((B, L + 1), dtype=ref.OUT_DTYPE, device=dev)
    n = torch.empty((B,), dtype=ref.OUT_DTYPE, device=dev)
    launch(output_ids=out, accept_length=n, target_logits=target_logits, temperature=temperature,
           draft_probs=draft_probs, draft_tokens=draft_tokens, uniforms=uniforms, seed=seed,
           flags=device_checks.record(dev) if mode == "device" else None)
    return {"output_ids": out, "accept_length": n}


def compile_specs():
    """Signatures for the ahead-of-time compile check: both logits dtypes, both draft index dtypes,
    uniforms given or drawn (a real vocabulary's block shape), with and without ``checked="device"``
    (CHECK_VALUES, and its check launch)."""
    bb, bv, warps = block_config(1, 152064, interpreted=False)
    types = {"logits_ptr": None, "temp_ptr": "*fp32", "q_ptr": "*fp32", "draft_ptr": None, "u_ptr": "*fp32"}
    return [variant(f"logits={lg[1:]},draft={dr[1:]},uniforms={hu}{',checked' if chk else ''}", spec_sampling_kernel,
                    {"out_ptr": "*i32", "len_ptr": "*i32", **types, "logits_ptr": lg, "draft_ptr": dr},
                    {"BLOCK_B": bb, "BLOCK_V": bv, "HAS_UNIFORMS": hu, "CHECK_VALUES": chk}, warps)
            for lg in ("*fp32", "*bf16") for dr in ("*i32", "*i64") for hu in (True, False) for chk in (False, True)] + \
        [variant(f"logits={lg[1:]},draft={dr[1:]},uniforms={hu}", spec_sampling_check_kernel,
                 {"flag_ptr": "*i64", **types, "logits_ptr": lg, "draft_ptr": dr}, {"BLOCK_V": bv, "HAS_UNIFORMS": hu}, 4)
         for lg in ("*fp32", "*bf16") for dr in ("*i32", "*i64") for hu in (True, False)]
