"""Registry entry for ``qk_norm_rope``: its OpSpec and built-in implementations."""
from __future__ import annotations

import functools

from harness.ops import stem_spec
from harness.registry import Deferred, Effect, GpuPlan, Impl, KillPlan, OpSpec, OutputSpec, Registry
from harness.tolerance import Tolerance

# overrides of the bf16 floor (harness.tolerance), each with its reason
TOLERANCES = {
    "q_out": Tolerance(
        atol=1e-5, rtol=2.0 ** -8, floor=1.02, factor=1.0,
        rationale="norm+rope round once to bf16 in both the chain and the kernel: no excess over the chain "
                  "is honest (factor 1); outputs are normalised, so atol only guards rope cancellation"),
    "kv_out": Tolerance(
        atol=1e-5, rtol=2.0 ** -8, floor=1.02, factor=1.0, rationale="as q_out: kv rows round once to bf16 in both paths"),
    "ring": Tolerance(
        atol=1e-5, rtol=2.0 ** -8, floor=1.02, factor=1.0, rationale="ring rows are kv_out rows stored as bf16"),
    "swa_cache": Tolerance(
        atol=2.0 ** -16, rtol=2.0 ** -4, floor=1.25, factor=1.0,
        rationale="decoded paged-cache rows: the bf16 kv row (half a bf16 ulp) rounded again to e4m3 under a "
                  "power-of-two tile scale (half an fp8 ulp, 2^-4 relative; atol = half the fp8 subnormal step "
                  "at the tile scales of normalised rows, 2^-10 · 2^-6); floor 1.25 = one more bf16 ulp (fp32 "
                  "noise flipping the row's rounding next to an fp8 midpoint: at most 1 + 1.5·2^-7/2^-4 = 1.19); "
                  "an fp8 cast that truncates costs up to a whole fp8 ulp (e ≈ 2) and fails"),
}

# kill matrix: the targeted catalog subset (the same for every implementation, clean or not: it
# contains each per-op proof case) and the timelines of the families using the op, one short
# named timeline each plus the one that makes a value-dependent bug reachable
KILL = KillPlan(clean=("reference", "fused"),
                cases=("dsv4-verify-b1-l3-h16", "dsv4-decode-b1-h16", "tiny-rows-eps-visible", "neox-decode-q-weight",
                       "dsv4-nonunified-verify-b2-l3-h16"),
                timelines=("dsv4-mqa-mixed/mixed-padded", "dsv4-mqa-ring/accept-0-to-L",
                           "dsv4-mqa-ring/tiny-activations"))

# GPU-only checks (harness.gpu.runners): one grid (cdiv(T, BLOCK_T), H + 1) for q and kv; the chain
# launches q and kv (+ the ring store in decode)
GPU = GpuPlan(("dsv4-verify-b8-l3-h128",), "dsv4-verify-b256-l3-h64", 1, ("q_norm_rope", "kv_norm_rope", "ring_store"),
              lambda c, kw: 2 + (c.mode == "decode"), "qk_norm_rope_step")


def _paged_effect(inputs, oracle, valid) -> Effect:
    """The non-unified store's effect on ``swa_cache``: the pages holding loc's slots; their token
    records decoded (``swa_decode``: what attention reads) against the oracle's kv rows; every other
    byte of those pages (other slots, the pad bytes, the page padding) and every other page kept."""
    import torch

    from reference.qk_norm_rope import swa

    lay = swa.SwaLayout(inputs["kv"].shape[1], int(inputs["rope_dim"]), int(inputs["swa_page_size"]))
    slots = inputs["loc"].cpu()[valid].long()
    pages, where = torch.unique(slots // lay.page_size, return_inverse=True)  # (n_pages,), (n,)
    slot = slots % lay.page_size
    owned = torch.zeros(len(pages), lay.min_page_bytes, dtype=torch.int32).index_add_(
        0, where, lay.written_bytes(slot).int()) > 0  # (n_pages, min_page_bytes)
    view = functools.partial(_decode_tokens, where=where, slot=slot, lay=lay)
    return Effect("swa_cache", pages, oracle["kv_out"][valid], view=view, written_bytes=owned)


def _decode_tokens(page_rows, *, where, slot, lay):
    """(n_pages, page_bytes) uint8 -> (n, D) fp64: token i's record from page ``where[i]``, slot ``slot[i]``."""
    from reference.qk_norm_rope import swa

    return swa.swa_decode(page_rows[where.to(page_rows.device)], slot, lay)


def _qk_effects(case, inputs, oracle):
    import torch

    loc = inputs["loc"].cpu()
    valid = loc >= 0
    if inputs.get("swa_cache") is not None:  # non-unified layer: the paged fp8 store, every mode
        return [_paged_effect(inputs, oracle, valid)]
    if case.mode == "decode":
        return [Effect("ring", loc[valid].long(), oracle["kv_out"][valid])]
    return [Effect("ring", torch.empty(0, dtype=torch.long), oracle["kv_out"][:0])]


def _qk_fused(**kw):
    from fused.qk_norm_rope import wrapper as f

    return f.qk_norm_rope_step(**kw)


def _qk_fused_device_checked(**kw):
    """The fused step with ``checked="device"``: the kernel checks the values, and what it recorded is
    raised after the launch (``fused.device_checks.raise_pending``), as a caller does at its step's end."""
    from fused import device_checks as dc
    from fused.qk_norm_rope import wrapper as f

    out = f.qk_norm_rope_step(checked="device", **kw)
    dc.raise_pending(kw["q"].device)
    return out


@functools.cache
def _qk_compiled_fns():
    import torch

    from reference.qk_norm_rope import chain as r

    # One graph per (rope style, weight present, q_out given) × dynamic shapes: past the default
    # recompile limit dynamo silently runs eager, and "compiled" would no longer be compiled.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(r.q_norm_rope, dynamic=True), torch.compile(r.kv_norm_rope, dynamic=True)


def _qk_compiled(*, forward_mode, ring, loc, swa_cache=None, swa_page_size=None, **kw):
    """torch.compile of the reference chain's two launches (+ the decode ring store, or the
    non-unified paged store, both eager)."""
    from reference.qk_norm_rope import chain as r
    from reference.qk_norm_rope import swa

    r.validate(ring=ring, loc=loc, swa_cache=swa_cache, swa_page_size=swa_page_size, **kw)
    q_fn, kv_fn = _qk_compiled_fns()
    a = (kw["eps"], kw["cos"], kw["sin"], kw["positions"], kw["rope_dim"], kw["rope_style"])
    q_out = q_fn(kw["q"], kw["q_norm_weight"], *a, kw["q_out"])
    kv_out = kv_fn(kw["kv"], kw["kv_norm_weight"], *a)
    if swa_cache is not None:
        swa.swa_paged_store(kv_out, swa_cache, loc, swa.SwaLayout(kv_out.shape[1], int(kw["rope_dim"]),
                                                                  int(swa_page_size)))
    elif forward_mode == "decode":
        r.ring_store(kv_out, ring, loc)
    return {"q_out": q_out, "kv_out": kv_out}


def _qk_spec() -> OpSpec:
    return stem_spec(
        "qk_norm_rope", case_type="QkNormRopeCase", reference="qk_norm_rope_step",
        outputs=(OutputSpec("q_out", "numeric"),
                 OutputSpec("kv_out", "numeric", when=lambda case: case.mode == "target_verify" and case.unified)),
        effects=_qk_effects,
        writable=("ring", "swa_cache"),
        out_args=("q_out",),
        inputs=("q", "kv", "kv_norm_weight", "q_norm_weight", "eps", "rope_dim", "cos", "sin", "positions",
                "rope_style", "ring", "loc", "swa_cache", "swa_page_size", "forward_mode", "q_out"),
        tolerances=TOLERANCES,
        roundings={"bf16-norm": {"bf16_norm": True}},  # the normalised row in bf16 before RoPE (SGLang's JIT kernels)
        # which bf16 value a normalised element next to a midpoint takes turns on a kernel's fp32 choices: the
        # class's allowance is the worst of the chain taking each (an rsqrt 2 ulps off either way, as CUDA's
        # rsqrtf may be; one product of each RoPE expression fused into an FMA)
        rounding_variants=({}, {"rsqrt_ulps": 2}, {"rsqrt_ulps": -2}, {"rope_fma": "first"}, {"rope_fma": "second"}),
        role="prepare",  # the prepare step of the timeline families dsv4-mqa-ring/-mixed (cases.timelines)
        kill=KILL,
        gpu=GPU,
        doc="qk RMSNorm + RoPE (DeepSeek-V4 MQA); the unified verify step must not store into the ring (seed 000); "
            "a non-unified layer stores into its paged fp8 SWA cache",
    )


def register(reg: Registry) -> None:
    reg.add_op(_qk_spec())
    reg.add(Impl("qk_norm_rope", "reference", "reference", Deferred("reference.qk_norm_rope.chain:qk_norm_rope_step"),
                 doc="two launches (q, kv) + the decode ring store"))
    reg.add(Impl("qk_norm_rope", "fused", "fused", _qk_fused,
                 doc="gate + one Triton launch; in-kernel store in unified decode and on non-unified layers"))
    reg.add(Impl("qk_norm_rope", "fused-device-checked", "fused", _qk_fused_device_checked,
                 doc="the fused step with checked='device': positions and slots checked by the kernel, no host sync"))
    reg.add(Impl("qk_norm_rope", "compiled", "compiled", _qk_compiled,
                 doc="torch.compile(dynamic=True) of the reference chain's launches"))
