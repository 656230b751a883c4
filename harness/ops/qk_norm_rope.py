"""Registry entry for ``qk_norm_rope``: its OpSpec and built-in implementations."""
from __future__ import annotations

import functools

import torch

from harness.registry import Effect, GpuPlan, Impl, KillPlan, OpSpec, OutputSpec, Registry
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
}

# kill matrix: the targeted catalog subset (the same for every implementation, clean or not: it
# contains each per-op proof case) and the timelines of the families using the op, one short
# named timeline each plus the one that makes a value-dependent bug reachable
KILL = KillPlan(clean=("reference", "fused"),
                cases=("dsv4-verify-b1-l3-h16", "dsv4-decode-b1-h16", "tiny-rows-eps-visible", "neox-decode-q-weight"),
                timelines=("dsv4-mqa-ring/accept-0-to-L", "dsv4-mqa-ring/tiny-activations"))

# GPU-only checks (harness.gpu_runners): one grid (cdiv(T, BLOCK_T), H + 1) for q and kv; the chain
# launches q and kv (+ the ring store in decode)
GPU = GpuPlan(("dsv4-verify-b8-l3-h128",), "dsv4-verify-b256-l3-h64", 1, ("q_norm_rope", "kv_norm_rope", "ring_store"),
              lambda c, kw: 2 + (c.mode == "decode"), "qk_norm_rope_step")


def _qk_effects(case, inputs, oracle):
    loc = inputs["loc"].cpu()
    valid = loc >= 0
    if case.mode == "decode":
        return [Effect("ring", loc[valid].long(), oracle["kv_out"][valid])]
    return [Effect("ring", torch.empty(0, dtype=torch.long), oracle["kv_out"][:0])]


def _qk_fused(**kw):
    from fused import qk_norm_rope as f

    return f.qk_norm_rope_step(**kw)


@functools.cache
def _qk_compiled_fns():
    from reference import qk_norm_rope as r

    # One graph per (rope style, weight present, q_out given) × dynamic shapes: past the default
    # recompile limit dynamo silently runs eager, and "compiled" would no longer be compiled.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(r.q_norm_rope, dynamic=True), torch.compile(r.kv_norm_rope, dynamic=True)


def _qk_compiled(*, forward_mode, ring, loc, **kw):
    """torch.compile of the reference chain's two launches (+ the decode store)."""
    from reference import qk_norm_rope as r

    r.validate(ring=ring, loc=loc, **kw)
    q_fn, kv_fn = _qk_compiled_fns()
    a = (kw["eps"], kw["cos"], kw["sin"], kw["positions"], kw["rope_dim"], kw["rope_style"])
    q_out = q_fn(kw["q"], kw["q_norm_weight"], *a, kw["q_out"])
    kv_out = kv_fn(kw["kv"], kw["kv_norm_weight"], *a)
    if forward_mode == "decode":
        r.ring_store(kv_out, ring, loc)
    return {"q_out": q_out, "kv_out": kv_out}


def _qk_spec() -> OpSpec:
    from cases import qk_norm_rope as c
    from reference import qk_norm_rope as r

    return OpSpec(
        name="qk_norm_rope",
        case_type=c.QkNormRopeCase,
        catalog=c.catalog,
        strategy=c.cases,
        build_inputs=c.build_inputs,
        reference=r.qk_norm_rope_step,
        oracle=r.qk_norm_rope_oracle,
        outputs=(OutputSpec("q_out", "numeric"),
                 OutputSpec("kv_out", "numeric", when=lambda case: case.mode == "target_verify")),
        effects=_qk_effects,
        writable=("ring",),
        out_args=("q_out",),
        inputs=("q", "kv", "kv_norm_weight", "q_norm_weight", "eps", "rope_dim", "cos", "sin", "positions",
                "rope_style", "ring", "loc", "forward_mode", "q_out"),
        tolerances=TOLERANCES,
        role="prepare",  # the prepare step of the timeline family dsv4-mqa-ring (cases.timelines)
        kill=KILL,
        gpu=GPU,
        bench="harness.bench.qk_norm_rope",  # its GPU benchmark (harness.bench.perf per-op API)
        timeline=_timeline_adapter,
        doc="qk RMSNorm + RoPE (DeepSeek-V4 MQA); the verify step must not store into the ring (seed 000)",
    )


def _timeline_adapter():
    """How it runs as a timeline family's prepare step (``harness.timeline.Prepare``)."""
    from harness.prepares import qk_norm_rope as p

    return p.ADAPTER


def register(reg: Registry) -> None:
    from reference import qk_norm_rope as r

    reg.add_op(_qk_spec())
    reg.add(Impl("qk_norm_rope", "reference", "reference", r.qk_norm_rope_step,
                 doc="two launches (q, kv) + the decode ring store"))
    reg.add(Impl("qk_norm_rope", "fused", "fused", _qk_fused,
                 doc="gate + one Triton launch; in-kernel store only in decode"))
    reg.add(Impl("qk_norm_rope", "compiled", "compiled", _qk_compiled,
                 doc="torch.compile(dynamic=True) of the reference chain's launches"))
