"""Registry entry for ``verify_attention`` (seeds 002, 003): its OpSpec and built-in implementations.

  reference         the per-head split-KV chain (torch, fp32, one bf16 rounding)
  reference-batched the same chain over the whole batch at once (one verify width, no tree)
  fused-split-kv    per-head split-KV Triton kernel, grid (B, H, S) + combine
  fused-shared-kv   grouped shared-KV Triton kernel, grid (B, H/BLOCK_H, S) + combine
  fused-shared-kv-bf16p  the same kernel with one bf16(P)·V dot per tile (precision bf16-p)
  fused             the backend: gate, then shared-KV → split-KV → reference by can_handle
  compiled          torch.compile of the reference chain's per-request math (GPU only)
  sdpa              torch SDPA on dense K/V with the explicit verify mask (external)
"""
from __future__ import annotations

import functools

from harness.ops import stem_spec
from harness.registry import Deferred, GpuPlan, Impl, KillPlan, OpSpec, OutputSpec, Registry

# kill matrix: its clean paths, the targeted catalog subset (each per-op proof case) and one short
# timeline of every family (all of them attend through it)
KILL = KillPlan(clean=("reference", "fused", "fused-split-kv", "fused-shared-kv", "sdpa"),
                cases=("qwen35-tp-h4-l2", "dspark-hkv2-h8-noncausal", "k3-mla-h4-l2-e4m3fnuz", "gqa-hkv2-h4-d128",
                       "tile-boundary-pm1", "tile-boundary-split2", "dspark-hkv4-h8-l7-noncausal", "tree-topk2-qwen35",
                       "many-splits-short-prefix"),
                timelines=("dspark-noncausal/accept-0-to-L", "qwen35-gqa/accept-0-to-L", "dsv4-mqa-ring/accept-0-to-L",
                           "k3-mla-fp8/accept-0-to-L"))


def _batched(kw: dict) -> bool:
    """Whether the verify reference takes the whole batch at once (three launches) or loops over
    the requests (three each): ``reference.verify_attention.chain.batchable``."""
    from reference.verify_attention import chain as r

    return kw.get("custom_mask") is None and r.batchable(kw["qo_indptr"].tolist(), kw["kv_indptr"].tolist(),
                                                         kw["q"].shape[1], kw["v"].shape[2])


def _capture(inputs):
    """As a CUDA graph runs it: the backend's host metadata (uniform widths, prefix tokens) that of
    the batch being captured, as SGLang's is; the chain's validation on shapes only (the value
    checks off)."""
    from fused.verify_attention import wrapper as f

    return f.batch_planned(**inputs)


# GPU-only checks (harness.gpu.runners): 2 launches on every path (a prefix kernel plus one combine;
# the backend runs exactly one path); the chain 3 launches, per request unless batchable
GPU = GpuPlan(("gpu-qwen35-b64-h16-p1024", "k3-mla-h64-l3-e4m3fn"), "gpu-k3-b16-h64-p16k", 2,
              ("prefix_split_partials", "draft_partial", "combine",
               "prefix_split_partials_batched", "draft_partial_batched"),
              lambda c, kw: 3 if _batched(kw) else 3 * c.B, "verify_attention",
              reference_not_capturable="the chain loops over requests on host copies of qo_indptr / kv_indptr "
                                       "(.tolist(): a device->host sync, which capture forbids)",
              capture=_capture)


def kernel_can_handle(kind):
    """Impl-level can_handle: the kernel's own shape rule on the case's shape, plus topk == 1
    (neither kernel reads a tree mask; in the backend the gate keeps them away from trees)."""
    def can_handle(case, device):
        import torch

        from cases.verify_attention import catalog as c
        from fused.verify_attention import wrapper as f

        if case.topk != 1:
            return f"topk {case.topk} > 1 needs a tree mask; the {kind} kernel has none"
        from harness.devices import fp8_dtype

        kv = torch.bfloat16 if case.kv_dtype == "bf16" else fp8_dtype(case.kv_dtype)
        return f.shape_can_handle(kind, uniform=len(set(c.widths(case))) == 1, H=case.H, Hkv=case.Hkv, D=case.D,
                                  Dv=case.Dv, kv_dtype=kv)
    return can_handle


def _split_kv(**kw):
    from fused.verify_attention import wrapper as f

    return f.verify_split_kv(**kw)


def _shared_kv(**kw):
    from fused.verify_attention import wrapper as f

    return f.verify_shared_kv(**kw)


def _shared_kv_bf16p(**kw):
    from fused.verify_attention import wrapper as f

    return f.verify_shared_kv(p_precision="bf16", **kw)


def _dispatch(**kw):
    from fused.verify_attention import wrapper as f

    return f.verify_attention(**kw)


def compiled_prefix(compile_fn):
    """Launch 1 of the chain with each split's partial compiled by ``compile_fn`` and the loop over
    the splits in Python. Compiled whole, launch 1's graph holds every split with symbolic bounds, and
    inductor's fusion pass (sympy comparisons of the splits' tilings) did not finish in 140 s for the 16
    splits of a 32K prefix (gpu-dspark-b32-hkv4-p32k, the H200, docs/nightly.md 2026-12-03)."""
    from reference.verify_attention import chain as r

    return functools.partial(r.prefix_split_partials, split_fn=compile_fn(r.split_partial))


@functools.cache
def _compiled_stages():
    import torch

    from reference.verify_attention import chain as r

    opts = dict(dynamic=True)
    return (compiled_prefix(functools.partial(torch.compile, **opts)), torch.compile(r.draft_partial, **opts),
            torch.compile(r.combine, **opts))


def _compiled(**kw):
    """The reference chain with each launch torch.compile'd (dynamic shapes; launch 1 per split)."""
    from reference.verify_attention import chain as r

    return r.verify_attention(_stages=_compiled_stages(), **kw)


def _batched_can_handle(case, device):
    """The batched chain's entry: one verify width, no tree (topk 1), and its padded scores within the
    memory the reference allows its own batched form (``BATCHED_SCORE_BYTES``)."""
    from cases.verify_attention import catalog as c
    from reference.verify_attention import chain as r

    if case.topk != 1:
        return f"topk {case.topk} > 1 needs a tree mask; the batched chain has none"
    if len(set(c.widths(case))) != 1:
        return "ragged verify widths (the batched chain pads prefixes, not drafts)"
    n_max = max(c.prefix_lengths(case.prefix, case.B, case.seed))
    need = r.score_bytes(case.B, case.H, case.L, n_max, case.Dv)
    if need > r.BATCHED_SCORE_BYTES:
        return f"padded scores {need} bytes > BATCHED_SCORE_BYTES {r.BATCHED_SCORE_BYTES}"
    return True


def _compiled_can_handle(case, device):
    if device.interpreted:
        return "torch.compile on CPU recompiles per shape class (minutes per run); GPU runs only"
    return True


def _drafts_as_stored(inputs: dict) -> dict:
    """The inputs with the drafts k, v replaced by what an fp8 cache stores and gives back for them
    (``Roundings.stored``: fp8(sat(x / scale)), times the scale in fp32): the oracle then attends to what a kernel of the
    ``cache-drafts`` class attends to. bf16 KV: the inputs unchanged."""
    from reference.verify_attention import chain as r

    rnd = r.Roundings.of(inputs["k_buffer"].dtype, bf16_p=False, bf16_partials=False, fp8_q=False, cache_drafts=True)
    if rnd.drafts is None:
        return inputs
    ks, vs = float(inputs["k_scale"]), float(inputs["v_scale"])
    return {**inputs, "k": rnd.stored(inputs["k"], ks) * ks, "v": rnd.stored(inputs["v"], vs) * vs}


def _spec() -> OpSpec:
    return stem_spec(
        "verify_attention", case_type="VerifyAttentionCase", reference="verify_attention",
        outputs=(OutputSpec("o", "numeric"),),
        effects=lambda case, inputs, oracle: [],
        writable=(),
        out_args=("o",),
        inputs=("q", "k", "v", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr", "kv_indices", "sm_scale", "is_causal",
                "k_scale", "v_scale", "num_kv_splits", "custom_mask", "o", "topk", "model_family", "splitkv_switch"),
        role="attn",  # the attention of every timeline family and of the end-to-end engine
        kill=KILL,
        gpu=GPU,
        doc="target-verify attention over a paged prefix + drafts (GQA / MLA, fp8 KV); shared-KV vs per-head "
            "split-KV (seeds 002, 003)",
        # the per-head kernel costs 15-25 ms per program under the interpreter (~30 min for 300
        # cases on 2 cores): the CPU run draws 40, the GPU runs the profile's full count
        interpreter_generated=40,
        # the reference chain's flags emulating each rounding a kernel may declare (harness.tolerance)
        roundings={"bf16-p": {"bf16_p": True}, "bf16-partials": {"bf16_partials": True}, "fp8-q": {"fp8_q": True},
                   "cache-drafts": {"cache_drafts": True}},
        # a kernel that stores the drafts in the fp8 cache before attention attends to the stored drafts:
        # its oracle (and its chain's) is exact attention over them, not over the bf16 drafts
        rounding_oracle_inputs={"cache-drafts": _drafts_as_stored},
        # P is rounded relative to a maximum: its split's in the chain, its tile's running one in a kernel,
        # so which weights round (p = 1 is exact) depends on the partition. With the case's 8 splits of
        # 5 keys every p is its split's max and the chain rounds nothing, where SGLang's kernels (one
        # split) round 4 of 5: catalog 'many-splits-short-prefix' was 5.7x the allowance. One split
        # alone fell short where a kernel tiles 32 keys with a running max (H200, 1,043 generated cases:
        # one case, 61 keys, at 1.1x for both fused-shared-kv-bf16p and SGLang's split-KV; on the CPU an
        # online tile-32 emulation errs 75.8, the chain with 1 / 2 splits 34.5 / 76.8): the allowance is
        # the largest over the case's partition, one split and two. Those still fell short of a kernel
        # with one online softmax over prefix + drafts (vLLM's unified attention: 0.925 of the allowance on
        # 'prefix-one'): the chain's one-pass form with a running maximum per tile of 16, 32, 64
        # and 128 keys, and cut into 16 segments of 16-key tiles as vLLM's split-KV (3D) launch does
        # (chain.online_weights), is among the variants, so every such kernel is covered by construction,
        # not by the luck of its partition
        rounding_variants=({}, {"num_kv_splits": 1}, {"num_kv_splits": 2}, {"online_tile": 16},
                           {"online_tile": 32}, {"online_tile": 64}, {"online_tile": 128},
                           {"online_tile": 16, "online_segments": 16}),
        # nightly parity workers relative to the other ops: it runs six implementations per case (the
        # others two or three). Measured on the H200 with 2 workers each, before reference-batched (a torch
        # chain) made the sixth: qk_norm_rope 1,732 cases in 310 s, mla_fp8_prepare 1,744 in 300 s,
        # verify_attention 1,211 of 1,755 when its 390 s ran out
        parity_weight=2,
    )


def register(reg: Registry) -> None:
    reg.add_op(_spec())
    reg.add(Impl("verify_attention", "reference", "reference",
                 Deferred("reference.verify_attention.chain:verify_attention"),
                 doc="per-head split-KV chain: prefix split partials, draft triangle, LSE combine"))
    reg.add(Impl("verify_attention", "reference-batched", "reference",
                 Deferred("reference.verify_attention.batched:verify_attention_batched"),
                 can_handle=_batched_can_handle,
                 doc="the same chain's three launches over the whole batch at once (one verify width, no tree)"))
    reg.add(Impl("verify_attention", "fused-split-kv", "fused", _split_kv, can_handle=kernel_can_handle("split_kv"),
                 doc="per-head split-KV Triton kernel, grid (B, H, S) + combine"))
    reg.add(Impl("verify_attention", "fused-shared-kv", "fused", _shared_kv,
                 can_handle=kernel_can_handle("shared_kv"),
                 doc="grouped shared-KV Triton kernel, grid (B, H/BLOCK_H, S) + combine"))
    reg.add(Impl("verify_attention", "fused-shared-kv-bf16p", "fused", _shared_kv_bf16p,
                 can_handle=kernel_can_handle("shared_kv"), precision="bf16-p",
                 doc="the shared-KV kernel with P·V as one bf16(P) dot per tile (FlashAttention's rounding)"))
    reg.add(Impl("verify_attention", "fused", "fused", _dispatch,
                 doc="backend: gate, then shared-KV -> split-KV -> reference by can_handle"))
    reg.add(Impl("verify_attention", "compiled", "compiled", _compiled, can_handle=_compiled_can_handle,
                 doc="torch.compile(dynamic=True) of the reference chain's three launches; launch 1 per split"))
    reg.add(Impl("verify_attention", "sdpa", "external",
                 Deferred("reference.verify_attention.sdpa:verify_attention_sdpa"),
                 doc="torch SDPA (fp64) on dense K/V with the explicit verify mask"))
