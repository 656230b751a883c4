"""Tolerance policy as data.

Standard: every numeric output is compared with the fp64 oracle through the scaled error
    e = max_i |x_i − o_i| / (atol + rtol·|o_i|)
and passes when ``e <= max(floor, factor × e_ref)``, where ``e_ref`` is the same measure for
the reference chain run in the same dtype on the same inputs: the chain shows how much
rounding is honest. The reference chain itself is held to ``floor`` alone. Exact contracts
(bytes, rows, indices) never go through this table.

Choosing numbers: ``rtol`` is the output dtype's worst round-to-nearest error (half an ulp,
relative: 2^-8 for bf16), so ``floor = 1`` means "correctly rounded"; the floor's slack above
1 is for fp32 noise that can flip a rounding near a midpoint. ``atol`` only covers values so
close to zero that fp32 cancellation dominates. Truncating instead of rounding costs up to a
whole ulp (e ≈ 2) and must fail, so no floor may approach 2 for single-rounding ops.

Precision classes: a production kernel rounds on purpose (P to bf16 before P·V, bf16 split
partials, q cast to the fp8 KV dtype) and the exact-fp32 chain cannot show how much that costs.
An implementation declares the roundings of its design (``Impl.precision``, "+"-joined names of
``PRECISION_CLASSES``); its op defines how the reference chain emulates each one
(``OpSpec.roundings``: name -> keyword arguments of the chain), and ``e_ref`` becomes the error
of the chain run with exactly those roundings (``harness.parity.runners.CaseSetup``). The allowance is
derived, never widened by hand, and a class that understates the kernel's rounding still fails.
Undeclared means ``exact-fp32``: no rounding, the standard above.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation only: the registry imports this module, and `list` imports no torch
    import torch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    floor: float  # allowed scaled error regardless of the reference chain
    factor: float  # allowed multiple of the reference chain's scaled error
    rationale: str

    def allowed(self, ref_err: float, *, is_reference: bool) -> float:
        if is_reference or ref_err != ref_err:  # NaN reference error: fall back to the floor
            return self.floor
        return max(self.floor, self.factor * ref_err)


# Per output dtype, by its name in torch (``torch.bfloat16`` -> "bfloat16"): the floor every op starts from.
DTYPE_FLOORS: dict[str, Tolerance] = {
    "bfloat16": Tolerance(atol=1e-5, rtol=2.0 ** -8, floor=1.02, factor=2.0,
                              rationale="half a bf16 ulp, +2% for fp32 noise flipping a rounding near a midpoint"),
    "float16": Tolerance(atol=1e-6, rtol=2.0 ** -11, floor=1.02, factor=2.0,
                             rationale="half an fp16 ulp, +2% for fp32 noise"),
    "float32": Tolerance(atol=1e-7, rtol=2.0 ** -20, floor=1.0, factor=2.0,
                             rationale="fp32 accumulation over short reductions: ~8 ulps"),
}

# Per-op overrides, each with its reason, live in the op's spec: ``OpSpec.tolerances`` (output or
# written buffer name -> Tolerance, in cases/<op>/spec.py); ``harness.ops.tolerance_overrides()`` collects the built-in ones.


EXACT = "exact-fp32"


@dataclass(frozen=True)
class Rounding:
    rationale: str  # which kernels make it and why it is honest
    emulation: str  # what the reference chain does instead (the op's OpSpec.roundings names the flag)


# name -> the rounding; a declared precision is a "+"-joined set of these names (EXACT: none of them)
PRECISION_CLASSES: dict[str, Rounding] = {
    EXACT: Rounding("the standard: the reference chain's own fp32 math and one rounding of the output; a "
                    "kernel that rounds intermediates more must declare it", emulation="none (the empty class)"),
    "bf16-p": Rounding("FlashAttention-style kernels feed the softmax numerators P = exp(x - m) to the P·V "
                       "tensor-core dot as bf16 (up to half a bf16 ulp per weight); the row sums use fp32 p",
                       emulation="verify_attention: P rounded to bf16 before every P·V product (flag bf16_p)"),
    "bf16-partials": Rounding("split-KV kernels store each split's normalised partial output acc/l in bf16 "
                              "(the LSE stays fp32) before the combine",
                              emulation="verify_attention: each prefix split's acc/l rounded to bf16 (flag "
                                        "bf16_partials)"),
    "fp8-q": Rounding("fp8-KV kernels (SGLang: q.to(K_Buffer.dtype), p.to(v.dtype)) run the prefix dots in "
                      "the KV's fp8 dtype: q and P rounded to e4m3",
                      emulation="verify_attention: q and the prefix P rounded to the KV fp8 dtype; bf16 KV "
                                "unaffected (flag fp8_q)"),
    "cache-drafts": Rounding("engines that write the step's K/V into the KV cache before attention (vLLM's "
                             "do_kv_cache_update, the pre-attention store of the DeepSeek-V4 verify path) read the "
                             "drafts back from the cache: with an fp8 cache they are quantized like the prefix",
                             emulation="verify_attention: the drafts stored as the prefix is, fp8(sat(k / k_scale)) "
                                       "and fp8(sat(v / v_scale)) saturated to the dtype's finite range, then "
                                       "dequantized with the same scales (their scores x sm_scale·k_scale, values "
                                       "x v_scale); bf16 KV unaffected (flag cache_drafts)"),
    "bf16-norm": Rounding("norm+RoPE kernels that keep the rounding of the unfused model's two steps (RMSNorm, then "
                          "RoPE): the normalised row x·rsqrt(mean(x²) + eps)·w is rounded to bf16 and RoPE rotates "
                          "those bf16 values (SGLang's DeepSeek-V4 JIT kernels, deepseek_v4/main_norm_rope.cuh and "
                          "fused_norm_rope.cuh): the RoPE dims rounded twice",
                          emulation="qk_norm_rope: the normalised row rounded to bf16 before RoPE (flag bf16_norm)"),
}


def parse_precision(precision: str) -> frozenset[str]:
    """A declared precision -> its set of rounding names: ``EXACT`` is the empty set, otherwise
    "+"-joined names of ``PRECISION_CLASSES`` (each at most once, ``EXACT`` not among them).
    ValueError naming what is unknown."""
    if not isinstance(precision, str):
        raise ValueError(f"precision: expected a '+'-joined string of {sorted(PRECISION_CLASSES)}, "
                         f"got {precision!r}")
    if precision == EXACT:
        return frozenset()
    names = precision.split("+")
    unknown = [n for n in names if n not in PRECISION_CLASSES or n == EXACT]
    if unknown:
        raise ValueError(f"precision {precision!r}: unknown rounding name(s) {unknown}; known: "
                         f"{sorted(set(PRECISION_CLASSES) - {EXACT})} ('+'-joined), or {EXACT!r} alone")
    if len(set(names)) != len(names):
        raise ValueError(f"precision {precision!r}: a rounding named twice")
    return frozenset(names)


def canonical_precision(precision: str) -> str:
    """One spelling per class (sorted names; ``EXACT`` for none): the key of its emulated chain."""
    return "+".join(sorted(parse_precision(precision))) or EXACT


def floor(op: str, output: str, dtype: torch.dtype) -> Tolerance:
    """The dtype's standard tolerance (``DTYPE_FLOORS``); KeyError naming ``op.output`` for a dtype without one."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_FLOORS:
        raise KeyError(f"no tolerance for {op}.{output} in dtype {dtype}: add one to harness/tolerance.py "
                       f"(DTYPE_FLOORS) or to the op's OpSpec.tolerances")
    return DTYPE_FLOORS[name]
