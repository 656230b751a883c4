"""Mutants of mla_fp8_prepare (seed 001): the dispatch bugs the seed's review worried about,
and the fp8 bugs its byte-identical contract test (inputs scaled by 0.1) could not see.

Each is the real fused step or kernel with one planted change; ``catches`` names the checks
that flag it and the catalog case that shows it (``tests/test_mla_fp8_prepare.py``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from harness.registry import Impl

if TYPE_CHECKING:  # annotations only: reading the declarations imports no torch (python -m harness list)
    import torch

OP = "mla_fp8_prepare"


def _fused():
    from fused.mla_fp8_prepare import wrapper as f

    return f


def _skip_fallback_write(**kw):
    """The KV write keyed on "fused was attempted" (writes on + switch on) instead of on the
    sentinel: when the write location does not resolve, nobody writes the rows."""
    from reference.mla_fp8_prepare import chain as ref

    f = _fused()
    pool = ref.KVPool(kw["kv_buffer"], kw["slot_map"])
    attempted = kw["save_kv_cache"] and kw["fused_switch"]
    loc = kw["decode_kernel_loc"] if attempted else None
    layout_ok = not f.covered(**{k: kw[k] for k in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "fp8_policy")})
    if attempted and loc is not None and layout_ok:
        q8 = f.mla_fp8_prepare(**_kernel_args(kw), loc=loc)
        pool.record(loc)
        return {"q8": q8, "kv_writes": pool.writes}
    q8, kn8, kr8 = _chain(kw)
    if kw["save_kv_cache"] and not attempted:  # BUG: should be "and the kernel did not write"
        pool.write_rows(_fallback_loc(kw, pool), kn8, kr8)
    return {"q8": q8, "kv_writes": pool.writes}


def _truncate_fp8(x: torch.Tensor, fp8_dtype: torch.dtype, scale_mul) -> torch.Tensor:
    """fp8 rounding toward zero (what the raw interpreter and some hand-written casts do)."""
    import torch

    from reference.mla_fp8_prepare import chain as ref

    xf = x.float() * (1.0 if scale_mul is None else scale_mul)
    rne = ref.cast_fp8(x, fp8_dtype, "saturate", scale_mul)
    up = rne.double().abs() > xf.double().abs()  # RNE rounded away from zero: step one code back
    codes = rne.view(torch.uint8)
    down = torch.where(up & (codes & 0x7F != 0), codes - 1, codes)
    return down.view(fp8_dtype)


def _double_write(**kw):
    """Sentinel ignored for the KV write: the kernel writes the rows, then the fallback's
    scatter writes them again — with a cast that truncates instead of rounding."""
    from reference.mla_fp8_prepare import chain as ref

    f = _fused()
    out = f.mla_fp8_prepare_step(**kw)
    if kw["save_kv_cache"]:
        pool = ref.KVPool(kw["kv_buffer"], kw["slot_map"])
        inv = ref.inv_descale(kw["kv_descale"])
        dt = kw["kv_buffer"].dtype
        pool.write_rows(_fallback_loc(kw, pool), _truncate_fp8(kw["k_nope"], dt, inv),
                        _truncate_fp8(kw["k_rope"], dt, inv))
        out["kv_writes"] = out["kv_writes"] + pool.writes
    return out


def _untranslated_loc(**kw):
    """``_resolve_fused_write_loc`` returns the logical out_cache_loc: on a translating pool
    the kernel writes rows attention never reads (and clobbers others)."""
    f = _fused()
    resolve = lambda *, out_cache_loc, decode_kernel_loc: out_cache_loc  # noqa: E731  BUG
    return f.mla_fp8_prepare_step(**kw, resolve_fn=resolve)


def _policy_flip(**kw):
    """The dispatch forgets that the kernel saturates: ``nan``-policy calls take the kernel,
    so overflow and ±inf become ±max where the contract says NaN."""
    import torch

    from reference.mla_fp8_prepare import chain as ref

    f = _fused()
    pool = ref.KVPool(kw["kv_buffer"], kw["slot_map"])
    loc = kw["decode_kernel_loc"]
    if kw["save_kv_cache"] and kw["fused_switch"] and loc is not None:
        q8 = torch.empty_like(ref.concat_q(kw["q_nope"], kw["q_rope"]), dtype=kw["kv_buffer"].dtype)
        k_mul = f.k_mul_tensor(kw["kv_descale"], q8.device)
        f.launch(q8=q8, loc=loc, k_mul=k_mul, **_kernel_args(kw, policy=False))  # BUG: whatever the policy
        pool.record(loc)
        return {"q8": q8, "kv_writes": pool.writes}
    return f.mla_fp8_prepare_step(**kw)


def _descale_multiplied(**kw):
    """k multiplied by kv_descale instead of by 1/kv_descale (scale vs descale confusion)."""
    import torch

    f = _fused()

    def kernel(*, kv_descale, **a):
        q8 = torch.empty((*a["q_nope"].shape[:2], a["q_nope"].shape[2] + a["q_rope"].shape[2]),
                         dtype=a["kv_buffer"].dtype, device=a["kv_buffer"].device)
        mul = None if kv_descale is None else torch.tensor([kv_descale], dtype=torch.float32, device=q8.device)  # BUG
        a.pop("fp8_policy")
        f.launch(q8=q8, k_mul=mul, **a)
        return q8

    return f.mla_fp8_prepare_step(**kw, kernel_fn=kernel)


def _kernel_args(kw, policy: bool = True) -> dict:
    keys = ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer") + (("kv_descale", "fp8_policy") if policy else ())
    return {k: kw[k] for k in keys}


def _chain(kw):
    from reference.mla_fp8_prepare import chain as ref

    return ref.quantize_chain(q_nope=kw["q_nope"], q_rope=kw["q_rope"], k_nope=kw["k_nope"], k_rope=kw["k_rope"],
                              fp8_dtype=kw["kv_buffer"].dtype, kv_descale=kw["kv_descale"], fp8_policy=kw["fp8_policy"])


def _fallback_loc(kw, pool):
    return kw["decode_kernel_loc"] if kw["decode_kernel_loc"] is not None else pool.physical(kw["out_cache_loc"])


MUTANTS = [
    Impl(OP, "mutant-fallback-write-skipped", "mutant", _skip_fallback_write,
         doc="seed 001: KV write skipped whenever the fused path was attempted, even when it was not "
             "taken (no resolvable write loc): the rows attention reads keep stale bytes",
         catches=("effect:kv_buffer", "exact:kv_writes")),
    Impl(OP, "mutant-double-write-truncating", "mutant", _double_write,
         doc="seed 001: the sentinel does not gate the second KV write; the fallback scatter rewrites the "
             "rows the kernel wrote, with a truncating cast (last write wins)",
         catches=("exact:kv_writes", "effect:kv_buffer")),
    Impl(OP, "mutant-untranslated-out-cache-loc", "mutant", _untranslated_loc,
         doc="seed 001: the fused write location is the logical out_cache_loc, not the physical slot the "
             "pool maps it to: on a translating pool rows land where attention never reads",
         catches=("effect:kv_buffer", "untouched:kv_buffer", "exact:kv_writes")),
    Impl(OP, "mutant-policy-flip-saturate", "mutant", _policy_flip, fp8_policy="saturate (ignores the case)",
         doc="fp8 overflow policy flip (seed 001's aten chain under torch 2.11 gives NaN, the kernel "
             "saturates): the dispatch sends 'nan'-policy calls to the saturating kernel",
         catches=("exact:q8", "effect:kv_buffer")),
    Impl(OP, "mutant-descale-multiplied", "mutant", _descale_multiplied,
         doc="seed 001 kv_descale: k multiplied by kv_descale instead of by 1/kv_descale; invisible at "
             "kv_descale = 1, so cases use non-unit scales",
         catches=("effect:kv_buffer",)),
]
