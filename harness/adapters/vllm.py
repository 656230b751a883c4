"""vLLM 0.34.0's own Triton kernels behind the plugin API (``--impl harness.adapters.vllm:IMPLS``).

  vllm-rejection-greedy  verify_accept     ``rejection_sample`` (v1/worker/gpu/spec_decode/rejection_sampler_utils.py)
                                           at temperature 0: vLLM's GPU model runner's greedy verify
  vllm-rejection-sampled spec_sampling     the same ``rejection_sample`` at temperature > 0 after vLLM's
                                           ``apply_temperature``: standard speculative sampling, q as the
                                           draft-logits cache (T · log q) or none for one-hot drafts. It draws
                                           its own randomness (module section "speculative sampling"), so the
                                           exact cases are refused and the distributional check judges it
  vllm-unified           verify_attention  ``unified_attention`` (v1/attention/ops/triton_unified_attention.py): the
                                           2D kernel or the split-KV 3D kernel + ``reduce_segments``, as the
                                           Triton backend (v1/attention/backends/triton_attn.py) chooses, after
                                           ``reshape_and_cache_kernel_flash`` stored the step's K/V in the cache
  vllm-mla-decode        verify_attention  ``decode_attention_fwd(is_mla=True)`` as the Triton MLA backend
                                           (v1/attention/backends/mla/triton_mla.py::forward_mqa) runs a verify
                                           block: one decode row per query token, per-row KV extents
  vllm-mla-verify        verify_attention  ``decode_attention_fwd_verify`` (triton_decode_attention.py): the folded
                                           causal MLA verify kernel the ROCm AITER MLA backend launches

How vLLM attends differs from the op's contract in one way that matters: its backends write the step's
K/V into the paged cache (``do_kv_cache_update``) *before* attention and read the drafts back from there,
so with an fp8 cache the drafts are quantized (divided by the k/v scale, saturated, cast) like the prefix.
The adapters do the same: each call builds vLLM's cache (blocks of 16 slots, blocks handed out in reverse
order so the block table is exercised), copies each request's prefix rows into it byte for byte, then
stores the drafts with vLLM's own store kernel (GQA) or the MLA backend's layout (MLA: one latent row,
k_scale only, v_scale is k_scale). Their declared precision says so (``cache-drafts``,
harness.tolerance).

Precision, read from each kernel:
  unified     S = tl.dot(Q, K) with bf16 operands, fp32 accumulation; fp8 K/V dequantized as
              ``(x.to(fp32) * scale).to(bf16)``; P rounded to bf16 before ``tl.dot(P, V)``; one online softmax
              over prefix + drafts with a running max per tile of 16 (3D) or 32 (2D) keys; 3D segment
              partials fp32: ``bf16-p+cache-drafts``
  mla-decode  with several query heads the grouped stage 1 (tl.dot, fp32 accumulation); with one head
              (kv_group_num == 1) the MHA stage 1 forms q·k as ``tl.sum(q[None, :] * k, 1)`` on bf16 operands:
              each product rounded to bf16 before the sum (docs/vllm.md, the one-head MLA finding). P·V as
              ``tl.sum(p[:, None] * v, 0)`` / tl.dot on fp32 p: ``cache-drafts``
  mla-verify  tl.dot on bf16 q / K, P rounded to bf16 before tl.dot(P, V), one online softmax per split
              with a running max per 32-key tile: ``bf16-p+cache-drafts``
  sampled     judged in distribution: the acceptance test in log space (log p > log u + log q), the
              recovered / bonus token by Gumbel-max over max(p - q, 0) computed as log p + log1p(-q/p)
              (libdevice.log1p: the interpreter shim computes it, harness.shim.LIBDEVICE)
  greedy      exact: integer outputs. NaN: the per-block argmax is ``tl.max(..., return_indices=True)``
              and the argmax across vocabulary blocks maps a NaN block maximum to -inf (vLLM's comment: a
              NaN breaks tl.argmax's index bounds), i.e. vLLM's policy is ``ignore``, not torch.argmax's
              ``max``; until an implementation can declare its NaN policy the adapter refuses logits with
              a NaN.

Importing the kernels without vLLM's serving stack: ``pip install --no-deps vllm==0.34.0`` puts the files
on disk, but ``import vllm`` runs ``vllm/__init__.py`` (the engine, config, distributed...). ``load()``
registers the packages on the path to the kernel files as empty packages (their ``__init__`` not run,
``__path__`` the real folders), so the kernel files and the light modules they import (vllm.envs,
vllm.utils.math_utils, the sampler's gumbel / watermark / draft_logits / fly kernels, the watermark PRF)
load unchanged from the installed wheel. The host-side helpers that would pull in the runtime are given
as stand-ins (``SHIMMED``): the platform (which GPU this is: ``current_platform``), the logger, the Triton
import switch, the KV quantization mode enum, and four host functions of the draft-logits cache the
kernels launched here never call (they raise if called). When the real ``vllm`` package is already
imported, it is used as it is.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import importlib.util
import logging
import sys
import types

import torch
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice

from harness.registry import Impl
from reference.checks import UnsupportedError

VERSION = "0.34.0"  # the release the adapters, their refusals and cases/ledgers/vllm.py were checked against
_FILES = ("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
          "vllm.v1.attention.ops.triton_unified_attention",
          "vllm.v1.attention.ops.triton_reshape_and_cache_flash",
          "vllm.v1.attention.ops.triton_decode_attention")
BLOCK_SIZE = 16  # vLLM's default KV cache block (the Triton backends take multiples of 16)


class _Platform:
    """Stand-in for ``vllm.platforms.current_platform``: what the kernel files ask of it (which GPU
    this is), answered from torch. On the CPU (the Triton interpreter) it answers as an NVIDIA part
    without a capability, so every launch takes vLLM's CUDA path."""

    def is_rocm(self) -> bool:
        return torch.version.hip is not None

    def is_cuda(self) -> bool:
        return not self.is_rocm()

    def is_xpu(self) -> bool:
        return False

    def _arch(self) -> str:
        if not torch.cuda.is_available():
            return ""
        props = torch.cuda.get_device_properties(0)
        return props.gcnArchName if self.is_rocm() else f"sm{props.major}{props.minor}"

    def is_fp8_fnuz(self) -> bool:
        return "gfx94" in self._arch()

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fnuz if self.is_fp8_fnuz() else torch.float8_e4m3fn

    def get_device_capability(self):
        return torch.cuda.get_device_capability(0) if torch.cuda.is_available() and self.is_cuda() else None

    def has_device_capability(self, cap) -> bool:
        have = self.get_device_capability()
        want = cap if isinstance(cap, tuple) else divmod(int(cap), 10)
        return have is not None and tuple(have) >= tuple(want)

    def is_device_capability(self, cap) -> bool:
        have = self.get_device_capability()
        want = cap if isinstance(cap, tuple) else divmod(int(cap), 10)
        return have is not None and tuple(have) == tuple(want)

    def is_device_capability_family(self, family: int) -> bool:
        have = self.get_device_capability()
        return have is not None and have[0] * 10 // 100 == family // 100 and have[0] == family // 10

    def num_compute_units(self) -> int:
        """The GPU's SMs / CUs; on the CPU an H200's 132, so the interpreter runs the GPU's launch."""
        return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


class _Logger(logging.LoggerAdapter):
    """Stand-in for vLLM's logger (``vllm.logger.init_logger``): a standard logger plus the ``*_once`` methods."""

    def __init__(self, name: str):
        super().__init__(logging.getLogger(name), {})

    def debug_once(self, msg, *args, **kw):
        self.debug(msg, *args)

    def info_once(self, msg, *args, **kw):
        self.info(msg, *args)

    def warning_once(self, msg, *args, **kw):
        self.warning(msg, *args)


class KVQuantMode(enum.IntEnum):
    """Stand-in for ``vllm.v1.kv_cache_interface.KVQuantMode``: the members the kernel files read, with
    vLLM 0.34.0's values (the unified kernel's ``KV_QUANT_MODE`` constexpr compares against them)."""
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


def _not_launched(name: str):
    def fn(*args, **kw):
        raise NotImplementedError(f"{name}: a vLLM host helper the verify-parity adapters never call "
                                  f"(harness.adapters.vllm.SHIMMED)")
    fn.__name__ = name
    return fn


def _fp8_min_max() -> tuple[float, float]:
    """vLLM's ``get_fp8_min_max``: ±224 for fnuz (its choice on ROCm), the dtype's range otherwise."""
    if _PLATFORM.is_fp8_fnuz():
        return -224.0, 224.0
    info = torch.finfo(_PLATFORM.fp8_dtype())
    return info.min, info.max


_PLATFORM = _Platform()
SHIMMED = {  # module -> {name: the host-side thing it stands for}
    "vllm.triton_utils": {"triton": triton, "tl": tl, "tldevice": tldevice, "HAS_TRITON": True},
    "vllm.platforms": {"current_platform": _PLATFORM},
    "vllm.logger": {"init_logger": _Logger},
    "vllm.v1.kv_cache_interface": {"KVQuantMode": KVQuantMode,
                                   "is_quantized_kv_cache": _not_launched("is_quantized_kv_cache")},
    "vllm.model_executor.layers.quantization.utils.quant_utils": {"FP8_DTYPE": _PLATFORM.fp8_dtype(),
                                                                  "get_fp8_min_max": _fp8_min_max},
    "vllm.distributed.parallel_state": {"get_tp_group": _not_launched("get_tp_group")},
    "vllm.v1.worker.gpu.input_batch": {"InputBatch": type("InputBatch", (), {})},
    "vllm.v1.worker.gpu.sample.batch_shard": {n: _not_launched(n) for n in
                                              ("shard_owner", "shard_owners", "shard_row", "shard_rows")},
}


class VLLMUnavailable(ImportError):
    """vllm is not installed (``pip install --no-deps vllm==0.34.0``)."""


@functools.cache
def load() -> dict[str, types.ModuleType]:
    """The kernel modules of the installed vllm, keyed by file stem."""
    if "vllm" not in sys.modules:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise VLLMUnavailable(f"vllm is not installed: pip install --no-deps vllm=={VERSION}")
        root = list(spec.submodule_search_locations)[0]
        for mod, names in SHIMMED.items():
            _package_path(mod.rsplit(".", 1)[0], root)
            stub = types.ModuleType(mod, f"verify-parity stand-in for {mod} (harness.adapters.vllm.SHIMMED)")
            stub.__dict__.update(names)
            sys.modules[mod] = stub
        for mod in _FILES:
            _package_path(mod.rsplit(".", 1)[0], root)
        for pkg in ("vllm.utils", "vllm.v1.worker.gpu.sample", "vllm.v1.watermarking.prfs"):
            _package_path(pkg, root)
    return {m.rsplit(".", 1)[1]: importlib.import_module(m) for m in _FILES}


def _package_path(pkg: str, root: str) -> None:
    """Register ``pkg`` and its parents as packages whose ``__init__`` is not run."""
    parts = pkg.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = ["/".join([root, *parts[1:i]])]
            sys.modules[name] = m


def installed_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return ""


# ----------------------------------------------------------------------------- greedy acceptance


def _greedy_step(logits, drafts, mod=None):
    """vLLM's greedy verify of R scheduled requests as a zero-argument callable -> (sampled (R, L + 1),
    num_sampled (R,)): ``logits`` (R·(L + 1), V) their rows, ``drafts`` (R, L) long. The step's input ids,
    the per-request index tensors and the zero temperatures are built once, as the model runner holds them;
    the call is ``rejection_sample`` alone."""
    mod = mod or load()["rejection_sampler_utils"]
    dev = logits.device
    R, L = drafts.shape
    sampled_in = torch.cat((torch.zeros(R, 1, dtype=torch.long, device=dev), drafts), 1).flatten()  # (R·(L+1),)
    cu = torch.arange(R + 1, device=dev, dtype=torch.int32) * (L + 1)
    local_pos = torch.arange(L + 1, device=dev, dtype=torch.int32).repeat(R)
    req = torch.arange(R, device=dev, dtype=torch.int32)
    expanded, pos = req.repeat_interleave(L + 1), local_pos.long()
    temperature = torch.zeros(R, dtype=torch.float32, device=dev)
    seed = torch.zeros(R, dtype=torch.int64, device=dev)
    return lambda: mod.rejection_sample(logits, None, sampled_in, cu, pos=pos, idx_mapping=req,
                                        expanded_idx_mapping=expanded, expanded_local_pos=local_pos,
                                        temperature=temperature, seed=seed, num_speculative_steps=L)


def greedy_bench_calls(kw: dict) -> dict:
    """{"vllm-rejection-greedy": a zero-argument callable} running vLLM's greedy verify (``_greedy_step``) on
    verify_accept keyword arguments ``kw`` whose requests are all real, for the benchmark
    (cases/verify_accept/bench.py). {} when vllm is not installed."""
    try:
        load()
    except VLLMUnavailable:
        return {}
    B = kw["qo_indptr"].shape[0] - 1
    return {"vllm-rejection-greedy": _greedy_step(kw["target_logits"], kw["draft_tokens"].view(B, -1).long())}


def rejection_greedy(*, target_logits, draft_tokens, qo_indptr):
    """vLLM's batch holds its scheduled requests only: a padding request (0 rows) is left out of the
    call and gets the op's padding row (all -1, accept length 0). Each real request b is one vLLM request
    of ``num_logits = L + 1`` rows; ``draft_sampled`` is the step's input ids (position ``start_b`` the
    request's last token, never read; ``start_b + 1 + i`` draft i), temperature 0, as the runner builds
    them. vLLM returns ``sampled`` (the accepted drafts and the bonus) and ``num_sampled`` = accepted + 1."""
    mod = load()["rejection_sampler_utils"]
    dev = target_logits.device
    qo = qo_indptr.tolist()
    B = len(qo) - 1
    L = draft_tokens.shape[0] // B
    real = [b for b in range(B) if qo[b + 1] > qo[b]]
    out = torch.full((B, L + 1), -1, dtype=torch.int32, device=dev)
    n_out = torch.zeros(B, dtype=torch.int32, device=dev)
    if not real:
        return {"output_ids": out, "accept_length": n_out}
    rows = torch.cat([torch.arange(qo[b], qo[b + 1]) for b in real]).to(dev)
    logits = target_logits[rows]  # (R·(L+1), V): vLLM's logits of the scheduled requests, rows contiguous
    drafts = draft_tokens.view(B, L)[torch.tensor(real, device=dev)].long()  # (R, L)
    sampled, num_sampled = _greedy_step(logits, drafts, mod)()
    n = num_sampled.long()
    keep = torch.arange(L + 1, device=dev)[None, :] < n[:, None]
    idx = torch.tensor(real, device=dev)
    out[idx] = torch.where(keep, sampled, -1).to(torch.int32)
    n_out[idx] = (n - 1).to(torch.int32)
    return {"output_ids": out, "accept_length": n_out}


# ----------------------------------------------------------------------------- speculative sampling (T > 0)
#
# How vLLM draws its randomness, and why the op's ``uniforms`` cannot be given to it: draft i of a request is
# accepted iff log p(x) > log u + log q(x) with u = tl.rand(seed, position of logit i) (Philox keyed by the
# request's seed and the token's position, drawn inside ``_rejection_kernel``); the recovered token after a
# rejection, and the bonus token, is the argmax over the vocabulary of log max(p - q, 0) + Gumbel noise, the
# noise a murmur3 hash of (seed, position, token) (``gumbel_block_argmax``) — V draws, not one inverse-CDF
# uniform. Neither is an input of ``rejection_sample``, so no uniforms of ours can reproduce its outputs:
# only the distribution of its outputs is comparable.

POSITION0 = 4096  # each request's first verify row sits at this position (a prefix of 4,096 tokens)
SEED_BITS = 63  # vLLM draws a request's seed in [-2**63, 2**63) when its sampling params give none


def request_seeds(seed: int, B: int) -> torch.Tensor:
    """(B,) int64: one seed per request, drawn from ``seed`` as vLLM's sampling states draw an unseeded
    request's (``np.random.randint`` over int64): the requests of a call are independent streams."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.randint(-(1 << SEED_BITS), (1 << SEED_BITS) - 1, (B,), generator=g, dtype=torch.int64)


def one_hot_drafts(draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> bool:
    """Whether every row of q is one-hot at its draft (q(x) = 1): a drafter without logits, which vLLM
    verifies without a draft-logits cache."""
    return bool((draft_probs.gather(-1, draft_tokens.long()[..., None]) == 1).all()
                and ((draft_probs > 0).sum(-1) == 1).all())


def draft_logits_cache(draft_probs: torch.Tensor, temperature: torch.Tensor) -> types.SimpleNamespace:
    """vLLM's ``DraftLogitsCache`` for q: ``values`` (B, L, V) fp32 the *pre-temperature* draft logits
    T · log q (vLLM divides by T on load: softmax(log q) = q for a normalised q; q = 0 is -inf), the
    cache replicated (``row_mapping`` None: request state b at row b)."""
    return types.SimpleNamespace(values=temperature[:, None, None] * torch.log(draft_probs), row_mapping=None)


def _sampled_can_handle(case, device) -> bool | str:
    if case.mode == "exact":
        return ("uniforms given: vLLM draws its own randomness (the acceptance uniform from (seed, position), the "
                "recovered and bonus tokens by Gumbel-max over the vocabulary); the distributional cases judge it")
    return True


def _sampled_step(*, target_logits, temperature, draft_probs, draft_tokens, seed: int, kernels=None,
                  cache_fn=draft_logits_cache):
    """vLLM's verify step at temperature > 0 on the op's inputs, as a zero-argument callable doing the
    device work only (what ``RejectionSampler._verify`` launches): the logits copied to fp32 and divided by
    each request's temperature by vLLM's ``apply_temperature`` (``sample/gumbel.py``), then
    ``rejection_sample`` in its standard mode (Leviathan et al.; not block verification, not synthetic
    rates, no watermark) -> (sampled (B, L + 1) int64, num_sampled (B,) int32 = accepted + 1). Built here
    once, as the model runner holds them: request b is vLLM request state b with L + 1 logits at positions
    POSITION0 + j and its own seed (``request_seeds``); q the draft-logits cache (``cache_fn``), none
    for one-hot drafts (``one_hot_drafts``)."""
    mod = kernels or load()["rejection_sampler_utils"]
    gumbel = importlib.import_module("vllm.v1.worker.gpu.sample.gumbel")
    B, Lp1, V = target_logits.shape
    dev = target_logits.device
    req = torch.arange(B, dtype=torch.int32, device=dev)
    expanded = req.repeat_interleave(Lp1)  # (B·(L + 1),) the request state of each logit
    local_pos = torch.arange(Lp1, dtype=torch.int32, device=dev).repeat(B)  # (B·(L + 1),)
    pos = POSITION0 + local_pos.long()
    cu = torch.arange(B + 1, dtype=torch.int32, device=dev) * Lp1
    seeds = request_seeds(seed, B).to(dev)
    cache = None if one_hot_drafts(draft_probs, draft_tokens) else cache_fn(draft_probs, temperature)
    # the step's input ids: position start_b is the request's last token (never read), then its drafts
    draft_sampled = torch.cat((torch.zeros(B, 1, dtype=torch.long, device=dev), draft_tokens.long()), 1).flatten()
    rows = target_logits.reshape(B * Lp1, V)
    masked = bool(torch.isneginf(rows).any())  # vLLM skips all -inf vocabulary blocks for such requests

    def step():
        logits = torch.empty((B * Lp1, V), dtype=torch.float32, device=dev).copy_(rows)
        gumbel.apply_temperature(logits, expanded, temperature)
        return mod.rejection_sample(logits, cache, draft_sampled, cu, pos=pos, idx_mapping=req,
                                    expanded_idx_mapping=expanded, expanded_local_pos=local_pos,
                                    temperature=temperature, seed=seeds, num_speculative_steps=Lp1 - 1,
                                    skip_masked_vocab_blocks=masked)
    return step


def rejection_sampled(*, target_logits, temperature, draft_probs, draft_tokens, uniforms=None, seed=None,
                      kernels=None, cache_fn=draft_logits_cache):
    """The op through vLLM's verify at temperature > 0 (``_sampled_step``): the accepted drafts, then the
    recovered or bonus token, -1 after. vLLM's randomness cannot be given: ``uniforms`` must be None;
    ``seed`` (None: one from torch's generator) seeds the requests' seeds. ``kernels``: another module of
    vLLM's ``rejection_sampler_utils`` (default the installed one; tests plant bugs in a copy);
    ``cache_fn``: how q becomes the draft-logits cache (tests plant a wrong one)."""
    if uniforms is not None:
        raise UnsupportedError("uniforms", "vLLM's rejection_sample draws its own randomness from per-request seeds")
    if seed is None:
        seed = int(torch.randint(0, 2 ** 31 - 1, ()))
    sampled, num_sampled = _sampled_step(target_logits=target_logits, temperature=temperature,
                                         draft_probs=draft_probs, draft_tokens=draft_tokens, seed=seed,
                                         kernels=kernels, cache_fn=cache_fn)()
    n = num_sampled.long()  # accepted + 1: the drafts kept, then the recovered or bonus token
    keep = torch.arange(sampled.shape[1], device=n.device)[None, :] < n[:, None]
    return {"output_ids": torch.where(keep, sampled, -1).to(torch.int32), "accept_length": (n - 1).to(torch.int32)}


def sampled_bench_calls(kw: dict) -> dict:
    """{"vllm-rejection-sampled": a zero-argument callable} running vLLM's verify step at temperature > 0
    (``_sampled_step``: fp32 copy, temperature, ``rejection_sample``) on spec_sampling keyword arguments
    ``kw``, for the benchmark (cases/spec_sampling/bench.py); the draft-logits cache, seeds and index
    tensors built once beforehand, as the model runner holds them. {} when vllm is not installed."""
    try:
        load()
    except VLLMUnavailable:
        return {}
    args = {k: kw[k] for k in ("target_logits", "temperature", "draft_probs", "draft_tokens")}
    return {"vllm-rejection-sampled": _sampled_step(**args, seed=1)}


# ----------------------------------------------------------------------------- the paged cache

def _widths(qo_indptr: torch.Tensor) -> list[int]:
    qo = qo_indptr.tolist()
    return [b - a for a, b in zip(qo, qo[1:])]


def _prefix_lengths(kv_indptr: torch.Tensor) -> list[int]:
    kv = kv_indptr.tolist()
    return [b - a for a, b in zip(kv, kv[1:])]


def _block_table(seq_lens: list[int], dev) -> tuple[torch.Tensor, int]:
    """(B, max_blocks) int32 block table giving request b the blocks its ``seq_lens[b]`` slots need,
    handed out in reverse order (request 0 owns the last blocks), and the number of blocks."""
    need = [-(-n // BLOCK_SIZE) for n in seq_lens]
    total = max(sum(need), 1)
    table = torch.zeros(len(seq_lens), max(max(need), 1), dtype=torch.int32)
    nxt = total
    for b, k in enumerate(need):
        table[b, :k] = torch.arange(nxt - 1, nxt - 1 - k, -1, dtype=torch.int32)
        nxt -= k
    return table.to(dev), total


def _slots(table: torch.Tensor, b: int, start: int, stop: int) -> torch.Tensor:
    """Cache slots (block · 16 + offset) of positions [start, stop) of request b."""
    pos = torch.arange(start, stop, device=table.device)
    return table[b, pos // BLOCK_SIZE].long() * BLOCK_SIZE + pos % BLOCK_SIZE


def _copy_prefix(cache: torch.Tensor, buf: torch.Tensor, kv_indices, kv_indptr, table) -> None:
    """Each request's prefix rows ``buf[kv_indices[...]]`` (bytes as stored) into positions [0, n_b) of its
    blocks of ``cache`` (num_blocks, 16, Hkv, X), a strided view of vLLM's cache."""
    kv = kv_indptr.tolist()
    for b in range(len(kv) - 1):
        n = kv[b + 1] - kv[b]
        if n:
            slots = _slots(table, b, 0, n)
            cache[slots // BLOCK_SIZE, slots % BLOCK_SIZE] = buf[kv_indices[kv[b]: kv[b + 1]].long()]


def _scale(x: float, dev) -> torch.Tensor:
    return torch.tensor(float(x), dtype=torch.float32, device=dev)


def _store_drafts(mod, k, v, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> None:
    """The Triton backend's ``do_kv_cache_update``: vLLM's ``reshape_and_cache_kernel_flash`` launched with
    the arguments its host wrapper ``triton_reshape_and_cache_flash`` passes for the flash layout
    (the wrapper itself asks ``torch.cuda`` for the capability, which the CPU has not): fp8 caches get
    ``x / scale`` cast by the store (saturating, round to nearest even), bf16 caches the bytes."""
    num_heads, head_size = k.shape[1], k.shape[2]
    n = num_heads * head_size
    tile = min(2048, triton.next_power_of_2(n))
    mod.reshape_and_cache_kernel_flash[(slot_mapping.shape[0], triton.cdiv(n, tile))](
        key_ptr=k, value_ptr=v, key_cache_ptr=key_cache, value_cache_ptr=value_cache, slot_mapping_ptr=slot_mapping,
        k_scale=k_scale, v_scale=v_scale, key_stride=k.stride(0), value_stride=v.stride(0),
        block_stride=key_cache.stride(0), head_stride=key_cache.stride(2), dim_stride_k=0, dim_stride_v=0,
        page_stride=key_cache.stride(1), num_heads=num_heads, head_size=head_size, block_size=key_cache.shape[1],
        x=1, USE_HEAD_MAJOR_LAYOUT=False, INTERLEAVED_V_PACK_FACTOR=0,
        FP8_KV_CACHE=key_cache.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz), TILE_SIZE=tile)


# ----------------------------------------------------------------------------- interpreter probes

@triton.jit
def _probe_and_kernel(out_ptr, N: tl.constexpr):
    a = tl.arange(0, N) - 2
    tl.store(out_ptr + tl.arange(0, N), (a >= 0 and a < 3).to(tl.int32))


@triton.jit
def _probe_bf16_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
    a = tl.load(a_ptr + tl.arange(0, N))
    b = tl.load(b_ptr + tl.arange(0, N))
    tl.store(out_ptr + tl.arange(0, N), (a * b).to(tl.float32))


@functools.cache
def interpreter_defects() -> tuple[str, ...]:
    """The vendor-kernel constructs this process's Triton interpreter (with the harness's shim)
    computes wrongly, probed once: ``and`` on tensors (compiled Triton: elementwise) and bf16
    elementwise products (compiled: each product rounded to bf16). Empty when the interpreter gets both
    right, or when kernels are compiled."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        return ()
    found = []
    out = torch.zeros(8, dtype=torch.int32)
    _probe_and_kernel[(1,)](out, N=8)
    a = torch.arange(8) - 2
    if not torch.equal(out, ((a >= 0) & (a < 3)).to(torch.int32)):
        found.append("`and` on tensors (evaluated as its second operand)")
    x = torch.tensor([1.5, -3.25, 0.1, 7.0, 1e-3, 2.5, -0.7, 100.0]).bfloat16()
    y = torch.tensor([2.0, 0.3, -0.2, 1.1, 5.0, -1.5, 0.9, 0.01]).bfloat16()
    got = torch.zeros(8)
    _probe_bf16_kernel[(1,)](x, y, got, N=8)
    if not torch.equal(got, (x * y).float()):
        found.append("bf16 elementwise products (computed on the raw bits)")
    return tuple(found)


def _interpreter_refusal(device, construct: str, where: str) -> str:
    if not device.interpreted:
        return ""
    bad = [d for d in interpreter_defects() if d.startswith(construct)]
    return f"the CPU interpreter gets {bad[0]} wrong ({where}); the GPU run judges it" if bad else ""


# ----------------------------------------------------------------------------- unified attention (GQA)

FP8_KV = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
MIN_LAUNCH_GRID_SIZE_2D = 128  # triton_attn.py: seq_threshold_3D = this // num_kv_heads (eager; no graph sizes)
NUM_PAR_SOFTMAX_SEGMENTS = 16  # triton_attn.py's split-KV segments per request


def _cache_dtype_refusal(inputs, device) -> str:
    """What vLLM's per-tensor-scaled caches cannot hold: an fp8 flavour other than its platform's, and
    scales on a bf16 cache (vLLM applies k/v scales to an fp8 cache only)."""
    kb = inputs["k_buffer"]
    scales = (float(inputs["k_scale"]), float(inputs["v_scale"]))
    if kb.dtype == torch.bfloat16:
        return "" if scales == (1.0, 1.0) else f"k/v scales {scales} on a bf16 cache (vLLM scales an fp8 cache only)"
    plat = device.fp8_dtype if device.interpreted else _PLATFORM.fp8_dtype()
    return "" if kb.dtype == plat else f"{kb.dtype}: vLLM's fp8 cache on this platform is {plat}"


def _tree_bias(inputs) -> torch.Tensor | None | str:
    """The (L, L) fp32 ``qq_bias`` (0 where draft i sees draft j, -inf elsewhere) that, with the causal
    mask, expresses the batch's tree; a string saying why it cannot (vLLM has one bias for the batch)."""
    mask = inputs["custom_mask"]
    if mask is None:
        return None
    w = _widths(inputs["qo_indptr"])
    if len(set(w)) > 1:
        return "tree with ragged widths: qq_bias is one (L, L) bias for the whole batch"
    L = w[0]
    trees = mask.view(len(w), L, L)
    if not bool((trees == trees[0]).all()):
        return "trees differ across requests: qq_bias is one (L, L) bias for the whole batch"
    if bool(trees[0].triu(1).any()):
        return "a tree mask that lets a draft see a later one (qq_bias is added to the causal mask)"
    zero = torch.zeros(L, L, dtype=torch.float32, device=mask.device)
    return zero.masked_fill(~trees[0], float("-inf"))


def _unified_can_handle(case, device, inputs) -> bool | str:
    q, v = inputs["q"], inputs["v"]
    if q.shape[2] != v.shape[2]:
        return "MLA layout (head_dim != v_head_dim): vLLM runs MLA through its MLA backends (vllm-mla-*)"
    refusal = _cache_dtype_refusal(inputs, device)
    if refusal:
        return refusal
    bias = _tree_bias(inputs)
    if isinstance(bias, str):
        return bias
    if bias is not None:
        refusal = _interpreter_refusal(device, "`and`", "load_qq_bias_tile's `a >= 0 and a < n` mask")
        if refusal:
            return refusal
        if not inputs["is_causal"]:
            return "a tree on non-causal drafts"
    return True


@dataclasses.dataclass
class PagedStep:
    """One verify step in vLLM's paged cache (``paged_step``): the cache views the Triton backend reads
    (``key_cache``, ``value_cache``: (num_blocks, 16, Hkv, D) strided views of one (num_blocks, Hkv, 16, 2·D)
    buffer), the block table (B, max_blocks) int32, each request's KV length (prefix + drafts) and the
    draft tokens' cache slots (T,) int64, in token order."""
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    table: torch.Tensor
    seq_lens: list[int]
    slot_mapping: torch.Tensor


def paged_step(inputs) -> PagedStep:
    """vLLM's cache for the op's inputs, each request's prefix rows copied in (bytes as stored); the draft
    slots left for ``store_drafts``."""
    k, kb = inputs["k"], inputs["k_buffer"]
    dev = k.device
    Hkv, D = k.shape[1], k.shape[2]
    w, pre = _widths(inputs["qo_indptr"]), _prefix_lengths(inputs["kv_indptr"])
    seq = [n + l for n, l in zip(pre, w)]
    table, blocks = _block_table(seq, dev)
    raw = torch.empty(blocks, Hkv, BLOCK_SIZE, 2 * D, dtype=kb.dtype, device=dev)  # vLLM's (blocks, Hkv, 16, 2·D)
    key_cache, value_cache = raw.transpose(1, 2).split(D, dim=-1)  # (blocks, 16, Hkv, D) each, as forward() views
    _copy_prefix(key_cache, kb, inputs["kv_indices"], inputs["kv_indptr"], table)
    _copy_prefix(value_cache, inputs["v_buffer"], inputs["kv_indices"], inputs["kv_indptr"], table)
    slot_mapping = torch.cat([_slots(table, b, pre[b], seq[b]) for b in range(len(w))])
    return PagedStep(key_cache, value_cache, table, seq, slot_mapping)


def store_drafts(step: PagedStep, k: torch.Tensor, v: torch.Tensor, k_scale: float, v_scale: float,
                 slot_mapping: torch.Tensor | None = None) -> None:
    """The backend's ``do_kv_cache_update``: ``k``, ``v`` (T, Hkv, D) bf16 into ``step``'s cache at its
    draft slots (or ``slot_mapping``) by vLLM's store kernel (``_store_drafts``)."""
    dev = k.device
    _store_drafts(load()["triton_reshape_and_cache_flash"], k, v, step.key_cache, step.value_cache,
                  step.slot_mapping if slot_mapping is None else slot_mapping, _scale(k_scale, dev),
                  _scale(v_scale, dev))


def attend(step: PagedStep, inputs) -> torch.Tensor:
    """``unified_attention`` with the Triton backend's arguments over ``step``'s cache (its 2D / 3D choice,
    16 segments, scratch rows for ``seq_threshold_3D`` requests of this width) -> o (T, H, D) bf16."""
    mod = load()["triton_unified_attention"]
    q, kb = inputs["q"], inputs["k_buffer"]
    dev = q.device
    T, H, D = q.shape
    Hkv = inputs["k"].shape[1]
    w = _widths(inputs["qo_indptr"])
    o = inputs["o"]
    if o is None:
        o = torch.empty(T, H, D, dtype=q.dtype, device=dev)
    ks, vs = _scale(inputs["k_scale"], dev), _scale(inputs["v_scale"], dev)
    threshold = MIN_LAUNCH_GRID_SIZE_2D // Hkv
    rows = threshold * min(max(w), mod.MAX_3D_QUERY_LEN)
    segs = NUM_PAR_SOFTMAX_SEGMENTS
    pad = triton.next_power_of_2(D)
    B = len(w)
    mod.unified_attention(
        q=q, k=step.key_cache, v=step.value_cache, out=o, cu_seqlens_q=inputs["qo_indptr"].to(torch.int32),
        max_seqlen_q=max(w), seqused_k=torch.tensor(step.seq_lens, dtype=torch.int32, device=dev),
        max_seqlen_k=max(step.seq_lens), softmax_scale=float(inputs["sm_scale"]), causal=bool(inputs["is_causal"]),
        window_size=(-1, -1), block_table=step.table, softcap=0, q_descale=None, k_descale=ks.expand(B, Hkv),
        v_descale=vs.expand(B, Hkv), seq_threshold_3D=threshold, num_par_softmax_segments=segs,
        softmax_segm_output=torch.empty(rows, H, segs, pad, dtype=torch.float32, device=dev),
        softmax_segm_max=torch.empty(rows, H, segs, dtype=torch.float32, device=dev),
        softmax_segm_expsum=torch.empty(rows, H, segs, dtype=torch.float32, device=dev),
        qq_bias=_tree_bias(inputs), kv_quant_mode=KVQuantMode.FP8_PER_TENSOR if kb.dtype in FP8_KV else KVQuantMode.NONE)
    return o


def _unified(**inputs):
    """vLLM's Triton backend on one verify step: the prefix copied into vLLM's cache (``paged_step``), the
    drafts stored by ``do_kv_cache_update``'s kernel (``store_drafts``), then ``attend``."""
    step = paged_step(inputs)
    store_drafts(step, inputs["k"], inputs["v"], inputs["k_scale"], inputs["v_scale"])
    return {"o": attend(step, inputs)}


# ----------------------------------------------------------------------------- MLA (one latent KV head)

MIN_WORK_PER_SPLIT = 512  # triton_mla.py: _compute_num_kv_splits
SPLIT_OCCUPANCY_MULTIPLIER = 2


def mla_decode_splits(max_seq_len: int) -> int:
    """The Triton MLA backend's ``_compute_num_kv_splits`` (triton_mla.py; that module imports the
    serving stack, so its two lines are restated): next_power_of_2(max(1, L // 512)), at most 2 per SM."""
    ideal = triton.next_power_of_2(max(1, max_seq_len // MIN_WORK_PER_SPLIT))
    return min(ideal, _PLATFORM.num_compute_units() * SPLIT_OCCUPANCY_MULTIPLIER)


def _mla_cache(inputs) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """vLLM's MLA cache (num_blocks, 16, 576): each request's prefix rows copied in, then its drafts stored
    as the MLA backend's ``concat_and_cache_mla`` stores them (a CUDA op, not Triton: the adapter stores
    with torch what it computes, the bytes for a bf16 cache, fp8(sat(x / k_scale)) for an fp8 one, one
    scale for the latent and its rope part) -> (cache, block table, prefix lengths, widths)."""
    k, kb = inputs["k"], inputs["k_buffer"]
    dev = k.device
    w, pre = _widths(inputs["qo_indptr"]), _prefix_lengths(inputs["kv_indptr"])
    seq = [n + l for n, l in zip(pre, w)]
    table, blocks = _block_table(seq, dev)
    cache = torch.empty(blocks, BLOCK_SIZE, 1, kb.shape[2], dtype=kb.dtype, device=dev)
    _copy_prefix(cache, kb, inputs["kv_indices"], inputs["kv_indptr"], table)
    drafts = k
    if kb.dtype in FP8_KV:
        top = torch.finfo(kb.dtype).max
        drafts = (k.float() / float(inputs["k_scale"])).clamp(-top, top).to(kb.dtype)
    qo = inputs["qo_indptr"].tolist()
    for b in range(len(w)):
        slots = _slots(table, b, pre[b], seq[b])
        cache[slots // BLOCK_SIZE, slots % BLOCK_SIZE] = drafts[qo[b]: qo[b + 1]]
    return cache.squeeze(2), table, pre, w


def _mla_common_refusal(inputs, device) -> str:
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    if k.shape[1] != 1 or q.shape[2] != 576 or v.shape[2] != 512:
        return "not the MLA layout (one latent KV head, head_dim 576, v_head_dim 512)"
    if inputs["custom_mask"] is not None:
        return f"topk {inputs['topk']}: the MLA kernels take no tree mask"
    if len(set(_widths(inputs["qo_indptr"]))) > 1:
        return "ragged verify widths (the MLA backends take a uniform verify block)"
    kb = inputs["k_buffer"]
    if kb.dtype in FP8_KV and float(inputs["v_scale"]) != float(inputs["k_scale"]):
        return (f"v_scale {inputs['v_scale']} != k_scale {inputs['k_scale']}: vLLM's MLA cache is one latent "
                f"with one scale (the backend passes v_scale=layer._k_scale)")
    return _cache_dtype_refusal(inputs, device)


def _mla_decode_can_handle(case, device, inputs) -> bool | str:
    refusal = _mla_common_refusal(inputs, device)
    if refusal:
        return refusal
    if inputs["q"].shape[1] == 1:
        refusal = _interpreter_refusal(device, "bf16 elementwise", "_fwd_kernel_stage1's tl.sum(q[None, :] * k, 1) "
                                                                   "with one query head")
        if refusal:
            return refusal
    return True


def _mla_decode(**inputs):
    """``TritonMLAImpl.forward_mqa`` on a verify block: the block flattened to one decode row per query
    token, the block table repeated per row, each row's KV extent its prefix plus drafts 0..t (causal) or
    all drafts (non-causal), then ``decode_attention_fwd(is_mla=True)`` with the backend's split count."""
    mod = load()["triton_decode_attention"]
    q = inputs["q"]
    dev = q.device
    cache, table, pre, w = _mla_cache(inputs)
    L = w[0]
    T, H, _ = q.shape
    seq = torch.tensor([n + L for n in pre], dtype=torch.int32, device=dev)
    if inputs["is_causal"]:
        rows = (seq[:, None] + torch.arange(1 - L, 1, device=dev, dtype=torch.int32)).flatten().clamp(min=0)
    else:
        rows = seq.repeat_interleave(L)
    splits = mla_decode_splits(int(seq.max()))
    kv = cache.unsqueeze(2)  # (blocks, 16, 1, 576)
    o = torch.zeros(T, H, 512, dtype=q.dtype, device=dev)
    lse = torch.zeros(T, H, dtype=q.dtype, device=dev)
    ks = _scale(inputs["k_scale"], dev)
    mod.decode_attention_fwd(q, kv, kv[..., :512], o, lse, table.repeat_interleave(L, dim=0), rows,
                             torch.empty(T, H, splits, 513, dtype=torch.float32, device=dev), splits,
                             float(inputs["sm_scale"]), BLOCK_SIZE, k_scale=ks, v_scale=ks, is_mla=True,
                             sliding_window=None)
    return {"o": _into(o, inputs["o"])}


def _into(o: torch.Tensor, given: torch.Tensor | None) -> torch.Tensor:
    if given is None:
        return o
    given.copy_(o)
    return given


def _mla_verify_can_handle(case, device, inputs) -> bool | str:
    refusal = _mla_common_refusal(inputs, device)
    if refusal:
        return refusal
    if not inputs["is_causal"]:
        return "non-causal drafts: decode_attention_fwd_verify is the causal verify kernel"
    return True


def _mla_verify(**inputs):
    """``decode_attention_fwd_verify`` as the AITER MLA backend launches it (rocm_aiter_mla.py): seq_lens
    the prefix plus the block, no separate real lengths, the split cap from ``verify_num_kv_splits``."""
    mod = load()["triton_decode_attention"]
    q = inputs["q"]
    dev = q.device
    cache, table, pre, w = _mla_cache(inputs)
    L = w[0]
    T, H, _ = q.shape
    seq = [n + L for n in pre]
    splits = mod.verify_num_kv_splits(max(seq), len(seq), L, H, _PLATFORM.num_compute_units())
    kv = cache.unsqueeze(2)
    o = torch.empty(T, H, 512, dtype=q.dtype, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    logits = None if splits == 1 else torch.empty(T, H, splits, 513, dtype=torch.float32, device=dev)
    mod.decode_attention_fwd_verify(q, kv, kv[..., :512], o, lse, table, torch.tensor(seq, dtype=torch.int32,
                                                                                      device=dev),
                                    None, L, logits, splits, float(inputs["sm_scale"]), BLOCK_SIZE,
                                    k_scale=_scale(inputs["k_scale"], dev))
    return {"o": _into(o, inputs["o"])}


def IMPLS() -> list[Impl]:
    """The five adapters (a zero-argument callable: ``--impl`` imports no vllm until it runs)."""
    load()
    doc = f"vLLM {installed_version() or '?'} (checked against {VERSION}) "
    return [
        # vLLM's greedy verify ignores NaN on purpose (its argmax across vocabulary blocks maps a NaN maximum to
        # -inf): NaN policy 'ignore', checked exactly against the chain under that policy
        Impl("verify_accept", "vllm-rejection-greedy", "external", rejection_greedy, nan_policy="ignore",
             doc=doc + "rejection_sample at temperature 0 (greedy verify of the GPU model runner)"),
        # vLLM draws its own randomness (the acceptance uniform from (seed, position), the recovered and bonus
        # tokens by Gumbel-max): exact cases refused, judged by the distributional check
        Impl("spec_sampling", "vllm-rejection-sampled", "external", rejection_sampled, can_handle=_sampled_can_handle,
             doc=doc + "rejection_sample at temperature > 0 (standard speculative sampling, draft-logits cache)"),
        Impl("verify_attention", "vllm-unified", "external", _unified, can_handle=_unified_can_handle,
             precision="bf16-p+cache-drafts",
             doc=doc + "unified_attention (2D, or 3D + reduce_segments) over vLLM's paged cache, drafts stored first"),
        Impl("verify_attention", "vllm-mla-decode", "external", _mla_decode, can_handle=_mla_decode_can_handle,
             precision="bf16-p+cache-drafts",
             doc=doc + "decode_attention_fwd(is_mla=True) as the Triton MLA backend runs a verify block"),
        Impl("verify_attention", "vllm-mla-verify", "external", _mla_verify, can_handle=_mla_verify_can_handle,
             precision="bf16-p+cache-drafts", doc=doc + "decode_attention_fwd_verify (folded causal MLA verify)"),
    ]
