"""Known failures of vLLM 0.34.0's kernels (``harness.adapters.vllm``): real defects, each with a standalone
repro that fails without the harness, kept as data so that ``nox -s vllm`` fails on anything else, and on
any of these disappearing.

One entry: the MLA decode kernel with one query head per KV head (docs/vllm.md, "One query head").
``decode_attention_fwd`` sends ``kv_group_num == 1`` to its MHA stage 1, which forms q·k as
``tl.sum(q[None, :] * k, 1)`` on bf16 operands: every product of the 576-long dot rounded to bf16, and the
sum kept in bf16 (``tl.sum`` keeps a float input's type), where the grouped stage 1 (``tl.dot``) accumulates
in fp32. Whether that error crosses the bf16-p allowance depends on the data (5 of 7 such cases on the
CPU; 3 of 3 on an H100's nightly, 2.1x-15.7x), so the entry's condition reads the inputs: it runs the
kernel's stage 1 as a torch emulation (``one_head_decode``) on the case's inputs and asks the harness's own
``numeric:o`` check whether that output passes.
Standalone repro: ``python cases/ledgers/repro/vllm_mla_one_head.py`` (torch + vLLM's kernel file, a GPU).
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from harness.ledger import KnownFailureOnInputs

OP = "verify_attention"
IMPL = "vllm-mla-decode"
PRECISION = "bf16-p+cache-drafts"  # what the adapter declares: the allowance the kernel is held to
BLOCK_DMODEL = 1024  # next_power_of_2(576): the kernel's q and k rows, lanes 576.. loaded as 0
BLOCK_N = 64  # _decode_att_m_fwd: keys per tile on CUDA (8 on ROCm)
KEY_CHUNK = 4096  # keys whose products the emulation holds at once (a 200K prefix would need 400 MB)
REPRO = "python cases/ledgers/repro/vllm_mla_one_head.py"


def bf16_tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum the bf16 ``x`` along its last dimension (a power of 2) with every addition rounded to bf16,
    neighbours first, then pairs of pairs: the order of the interpreter shim's half reductions
    (``harness.shim.pairwise_half_sum``), so the CPU run's kernel computes these very values. Compiled
    Triton sums in its layout's order (per-thread chains, lane shuffles, warps; the compiler may fuse a
    product into an FMA), so on a GPU the error has the same source and size, not the same bits."""
    if x.shape[-1] & (x.shape[-1] - 1):
        raise ValueError(f"bf16_tree_sum: the last dimension must be a power of 2, got {x.shape[-1]}")
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]  # bf16 + bf16 in torch: the fp32 sum rounded to nearest even
    return x[..., 0]


def one_head_qk(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The MHA stage 1's ``tl.sum(q[None, :] * k, 1)`` for one query row ``q`` (576,) bf16 over ``keys``
    (n, 576) bf16: each product rounded to bf16, the 1024 lanes summed in bf16 -> (n,) fp32."""
    out = []
    for i in range(0, keys.shape[0], KEY_CHUNK):
        prod = q[None, :] * keys[i:i + KEY_CHUNK]  # bf16 x bf16: the exact product rounded to bf16
        prod = torch.nn.functional.pad(prod, (0, BLOCK_DMODEL - prod.shape[1]))
        out.append(bf16_tree_sum(prod).float())
    return torch.cat(out) if out else torch.zeros(0)


def _cache_rows(inputs, b: int) -> torch.Tensor:
    """Request ``b``'s keys as vLLM's cache holds them and the kernel reads them, (n + L, 576) bf16: the
    prefix rows byte for byte, then the drafts as the MLA backend stores them (fp8: x / k_scale,
    saturated), each fp8 row dequantized as the kernel does, ``(x.to(fp32) * k_scale).to(bf16)``."""
    kb, k = inputs["k_buffer"], inputs["k"]
    kvp, qo = inputs["kv_indptr"].tolist(), inputs["qo_indptr"].tolist()
    prefix = kb[inputs["kv_indices"][kvp[b]:kvp[b + 1]].long(), 0]
    drafts = k[qo[b]:qo[b + 1], 0]
    if kb.dtype == torch.bfloat16:
        return torch.cat((prefix, drafts))
    top = torch.finfo(kb.dtype).max
    ks = torch.tensor(float(inputs["k_scale"]), dtype=torch.float32)
    drafts = (drafts.float() / ks).clamp(-top, top).to(kb.dtype)
    return (torch.cat((prefix, drafts)).float() * ks).bfloat16()


def one_head_decode(inputs, splits: int, block_n: int = BLOCK_N) -> torch.Tensor:
    """What ``decode_attention_fwd(is_mla=True)`` outputs for the verify block of ``inputs`` (one query
    head, one latent KV head) when launched as the adapter (and vLLM's Triton MLA backend) launches it:
    one decode row per query token, its extent the prefix plus drafts 0..t (causal) or all drafts;
    ``splits`` splits of cdiv(extent, splits) keys, tiles of ``block_n`` keys with the kernel's running
    maximum (fp32 P, never rounded), q·k by ``one_head_qk``; stage 2 merges the splits in fp32 and the
    store rounds to bf16. -> o (T, 1, 512) bf16.

    ``qk *= sm_scale``: compiled Triton passes the float argument as fp32, so the bf16 sum is extended
    and scaled in fp32 (under the interpreter too: ``harness.shim`` types a float argument as fp32). The
    CPU run's output equals this bit for bit (tests/test_vllm_ledger.py)."""
    q = inputs["q"]
    qo, kvp = inputs["qo_indptr"].tolist(), inputs["kv_indptr"].tolist()
    sm = torch.tensor(float(inputs["sm_scale"]), dtype=torch.float32)
    o = torch.zeros(q.shape[0], 1, 512, dtype=torch.float32)
    for b in range(len(qo) - 1):
        keys = _cache_rows(inputs, b)
        n, L = kvp[b + 1] - kvp[b], qo[b + 1] - qo[b]
        v = keys[:, :512].float()
        for j in range(L):
            extent = n + j + 1 if inputs["is_causal"] else n + L
            qk = one_head_qk(q[qo[b] + j, 0], keys[:extent])
            qk = qk * sm  # `qk *= sm_scale`: the bf16 sum extended to fp32, times the fp32 argument
            per_split = -(-extent // splits)
            acc, e_sum, e_max = torch.zeros(512), torch.zeros(()), torch.tensor(float("-inf"))
            for s in range(splits):
                lo, hi = per_split * s, min(per_split * (s + 1), extent)
                if hi <= lo:
                    continue
                sa, ss, sx = torch.zeros(512), torch.zeros(()), torch.tensor(float("-inf"))
                for t0 in range(lo, hi, block_n):
                    x = qk[t0:min(t0 + block_n, hi)]
                    m = torch.maximum(x.max(), sx)
                    re, p = torch.exp(sx - m), torch.exp(x - m)
                    sa = sa * re + (p[:, None] * v[t0:t0 + x.shape[0]]).sum(0)
                    ss, sx = ss * re + p.sum(), m
                part, lse = sa / ss, sx + torch.log(ss)  # the split's partial output and LSE (stage 1's store)
                m = torch.maximum(lse, e_max)
                old, w = torch.exp(e_max - m), torch.exp(lse - m)
                acc, e_sum, e_max = acc * old + w * part, e_sum * old + w, m
            o[qo[b] + j, 0] = acc / e_sum
    return o.bfloat16()


@functools.cache
def _spec():
    from harness.ops import default_registry

    return default_registry(with_mutants=False, with_plugins=False).ops[OP]


def _host(inputs):
    """The host as a ``Device`` for the emulated run: torch only, no Triton kernel (``devices.select("cpu")``
    would switch this process to the interpreter, in the middle of a GPU run)."""
    from harness.devices import Device

    fnuz = inputs["k_buffer"].dtype == torch.float8_e4m3fnuz
    return Device("cpu", "host (torch emulation)", "torch", "e4m3fnuz" if fnuz else "e4m3fn", "")


def emulated_check(case, inputs):
    """The harness's ``numeric:o`` record of the emulated kernel (``one_head_decode`` with the adapter's
    split count and this platform's tile) on exactly these inputs, held to the adapter's declared
    precision class: the parity run's own check (chain, allowance variants, oracle), computed on the host."""
    from harness.adapters import vllm
    from harness.parity import runners
    from harness.registry import Impl

    qo, kvp = inputs["qo_indptr"].tolist(), inputs["kv_indptr"].tolist()
    seq = max(kvp[b + 1] - kvp[b] + qo[b + 1] - qo[b] for b in range(len(qo) - 1))
    splits = vllm.mla_decode_splits(seq)
    block_n = 8 if vllm.load()["triton_decode_attention"].is_hip_ else BLOCK_N
    host = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    spec = dataclasses.replace(_spec(), build_inputs=lambda c, d: {k: v.clone() if isinstance(v, torch.Tensor)
                                                                    else v for k, v in host.items()})
    emulated = Impl(OP, "vllm-mla-decode-emulated", "external",
                    lambda **kw: {"o": one_head_decode(kw, splits, block_n)}, precision=PRECISION)
    res = runners.run_case(spec, emulated, case, _host(inputs), determinism=False, poisoned=False,
                           poisoned_alloc=False)
    return next(r for r in res.records if r.check == "numeric:o")


def _one_head(case) -> bool:
    """The MLA layout with one query head per KV head: ``decode_attention_fwd`` takes the MHA path."""
    return case.layout == "mla" and case.H == case.Hkv


def _emulated_stage1_fails(case, inputs) -> bool:
    return not emulated_check(case, inputs).passed


LEDGER = (
    KnownFailureOnInputs(
        id="vllm-mla-one-head-bf16-qk", op=OP, impls=(IMPL,), checks=("numeric:o*",),
        when=_one_head, when_inputs=_emulated_stage1_fails,
        pattern="MLA with one query head per KV head (H = Hkv = 1: decode_attention_fwd's MHA stage 1), on inputs "
                "where a torch emulation of that stage 1 (bf16 products, bf16 sum; cases/ledgers/vllm.py::"
                "one_head_decode) fails the same numeric:o check",
        cause="q·k formed as tl.sum(q[None, :] * k, 1) on bf16 operands: each of the 576 products rounded to bf16 "
              "and the sum kept in bf16 (an error of ~2^-9 of the partial sums on every logit), where the "
              "grouped path's tl.dot accumulates in fp32; 2x-55x the bf16-p allowance on an H100/H200. Data-dependent; "
              f"standalone repro: {REPRO}",
        upstream="vllm 0.34.0 vllm/v1/attention/ops/triton_decode_attention.py::_fwd_kernel_stage1 (qk = "
                 "tl.sum(q[None, :] * k, 1)), chosen by decode_attention_fwd when kv_group_num == 1; not filed"),
)
