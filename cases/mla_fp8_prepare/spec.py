"""Registry entry for ``mla_fp8_prepare``: its OpSpec and built-in implementations.

Contract: exact. q8 bytes and the bytes of every written KV row equal the reference chain's;
``kv_writes`` (writes per physical row) equals the chain's, i.e. every path writes each row
exactly once, at the physical slot attention reads; every other row keeps its canary bytes.
The ``kv_writes`` compared is what the pool shows (``_observed_writes``): a row whose bytes
changed was written, at least once (more when the implementation's own count says so); a row
whose bytes did not change was not, whatever the count says. A kernel writing a row it should
not fails ``exact:kv_writes`` even when its wrapper's count leaves the row out.

fp8 policy per implementation: the reference and ``compiled`` follow the case's policy
(``saturate`` or ``nan``); the fused kernel implements ``saturate`` only. Its ``can_handle``
refuses ``nan``-policy cases rather than pass them through the chain: the dispatch would send
them to the fallback (``fused.mla_fp8_prepare.wrapper.covered``), so a pass there would measure the
chain against itself. The refusals are in the report; the reference, ``compiled`` and the
policy-flip mutant still run those cases.
"""
from __future__ import annotations

import functools

from harness.ops import stem_spec
from harness.registry import Deferred, Effect, GpuPlan, Impl, KillPlan, OpSpec, OutputSpec, Registry

OP = "mla_fp8_prepare"

# kill matrix: the targeted catalog subset (each per-op proof case) and the family's timelines
KILL = KillPlan(clean=("reference", "fused"),
                cases=("k3-verify-b1-l3-h8", "translated-pool", "translated-pool-no-capture-loc", "nan-policy-overflow",
                       "descale-0.37"),
                timelines=("k3-mla-fp8/accept-0-to-L", "k3-mla-fp8/fallback-write"))


def _capture(inputs):
    """As a CUDA graph runs it: the pool model without its write counter (``record`` masks rows: a
    sync). The descale reciprocal is a layer constant already (``fused.mla_fp8_prepare.wrapper.k_mul_tensor``
    keeps one tensor per value, made by the validated eager call)."""
    from reference.mla_fp8_prepare import chain as ref

    return ref.writes_uncounted()


# GPU-only checks (harness.gpu.runners): one grid for q8 and the KV rows; the chain's five launches
GPU = GpuPlan(("k3-verify-b4-l3-h16",), "k3-verify-b64-l3-h128", 1, ("concat_q", "cast_fp8", "scatter_kv"),
              lambda c, kw: 4 + c.save_kv_cache, "mla_fp8_prepare_step",
              reference_not_capturable="launch 5 (scatter_kv) selects the written rows with a boolean mask "
                                       "(loc >= 0): a device->host sync, which capture forbids",
              capture=_capture)


def _effects(case, inputs, oracle):
    from cases.mla_fp8_prepare import catalog as c

    return [Effect("kv_buffer", c.written_rows(case, inputs), None, contract="exact")]


def _observed_writes(reported, after, before):
    """writes per row as the pool shows them: a changed row at least once, an unchanged row never

    ``reported`` (S,) int: the implementation's own count. Returned as it is when it is None or of
    another shape, or the buffer is not there to diff (the exact check names what it sees).
    Computed on the buffer's device. Shape: (S,), ``reported``'s dtype."""
    import torch

    from harness.compare import as_bytes, on_device_of

    new, old = (after or {}).get("kv_buffer"), (before or {}).get("kv_buffer")
    if not (isinstance(reported, torch.Tensor) and isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor)
            and reported.dim() == 1 and new.dim() >= 1 and reported.shape[0] == new.shape[0]
            and old.shape == new.shape and old.dtype == new.dtype):
        return reported
    changed = (as_bytes(new) != as_bytes(on_device_of(old, new))).reshape(new.shape[0], -1).any(dim=1)
    return torch.where(on_device_of(changed, reported), reported.clamp(min=1), torch.zeros_like(reported))


def _fused(**kw):
    from fused.mla_fp8_prepare import wrapper as f

    return f.mla_fp8_prepare_step(**kw)


def _fused_can_handle(case, dev):
    from fused.mla_fp8_prepare import wrapper as f

    if case.policy != f.KERNEL_FP8_POLICY:
        return (f"fp8 policy {case.policy!r}: the kernel implements {f.KERNEL_FP8_POLICY!r} "
                f"(the dispatch sends this call to the chain)")
    if case.fp8_format not in f.kernel_fp8_formats(dev):
        return f"{case.fp8_format} on {dev.kind} {dev.arch}: Triton has no such fp8 conversion for this target"
    return True


def _compiled_can_handle(case, dev):
    """Inductor emits Triton too: on the H200 it fails to compile fp8e4b8 (seen: InductorError,
    'type fp8e4b8 not supported in this architecture'), so fnuz runs there only eagerly."""
    from fused.mla_fp8_prepare import wrapper as f

    if case.fp8_format not in f.kernel_fp8_formats(dev):
        return f"{case.fp8_format} on {dev.kind} {dev.arch}: torch.compile's Triton has no such fp8 conversion"
    return True


@functools.cache
def _compiled_chain():
    import torch

    from reference.mla_fp8_prepare import chain as r

    def chain(q_nope, q_rope, k_nope, k_rope, kv_buffer, phys, inv, policy: str):
        dt = kv_buffer.dtype
        q8 = r.cast_fp8(r.concat_q(q_nope, q_rope), dt, policy)
        kn8, kr8 = r.cast_fp8(k_nope, dt, policy, inv), r.cast_fp8(k_rope, dt, policy, inv)
        r.scatter_kv(kv_buffer, phys, kn8, kr8)
        return q8

    # one graph per (fp8 format, policy, input layouts, loc dtype): ~50 variants, past dynamo's default of 8
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(chain, dynamic=True)


def _compiled(*, q_nope, q_rope, k_nope, k_rope, kv_buffer, out_cache_loc, slot_map, decode_kernel_loc,
              save_kv_cache, fused_switch, kv_descale, fp8_policy):
    """torch.compile of the reference chain's five launches (the write through the pool model)."""
    import torch

    from reference.mla_fp8_prepare import chain as r

    r.validate_pool(kv_buffer=kv_buffer, out_cache_loc=out_cache_loc, slot_map=slot_map,
                    decode_kernel_loc=decode_kernel_loc)
    pool = r.KVPool(kv_buffer, slot_map)
    phys = pool.physical(out_cache_loc)
    r.validate(q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope, kv_buffer=kv_buffer, loc=phys,
               kv_descale=kv_descale, fp8_policy=fp8_policy)
    if not save_kv_cache:
        phys = torch.full_like(phys, -1)
    inv = r.inv_descale(kv_descale)  # x·1.0 == x for every fp32 (NaN, ±0, ±inf too): one graph for both
    inv_t = torch.tensor(1.0 if inv is None else inv, dtype=torch.float32, device=kv_buffer.device)
    q8 = _compiled_chain()(q_nope, q_rope, k_nope, k_rope, kv_buffer, phys, inv_t, fp8_policy)
    pool.record(phys)
    return {"q8": q8, "kv_writes": pool.writes}


def _spec() -> OpSpec:
    return stem_spec(
        OP, case_type="MlaFp8PrepareCase", reference="mla_fp8_prepare_step",
        outputs=(OutputSpec("q8", "exact"), OutputSpec("kv_writes", "exact", observed=_observed_writes)),
        effects=_effects,
        writable=("kv_buffer",),
        inputs=("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "out_cache_loc", "slot_map", "decode_kernel_loc",
                "save_kv_cache", "fused_switch", "kv_descale", "fp8_policy"),
        role="prepare",  # the prepare step of the timeline family k3-mla-fp8 (cases.timelines)
        kill=KILL,
        gpu=GPU,
        doc="fp8 KV/Q prepare for Kimi-K3 absorbed MLA: byte-identical q8 and KV rows, each row written "
            "exactly once at the physical slot (seed 001)",
    )


def register(reg: Registry) -> None:
    reg.add_op(_spec())
    reg.add(Impl(OP, "reference", "reference", Deferred("reference.mla_fp8_prepare.chain:mla_fp8_prepare_step"),
                 fp8_policy="case (saturate|nan)",
                 doc="five launches: cat q, cast q, cast k_nope, cast k_rope, scatter at the physical rows"))
    reg.add(Impl(OP, "fused", "fused", _fused, can_handle=_fused_can_handle, fp8_policy="saturate",
                 doc="gate + one Triton launch (q8 and KV rows); the fallback chain when the gate says so"))
    reg.add(Impl(OP, "compiled", "compiled", _compiled, can_handle=_compiled_can_handle, fp8_policy="case (saturate|nan)",
                 doc="torch.compile(dynamic=True) of the reference chain's five launches"))
