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
"""
from __future__ import annotations

from dataclasses import dataclass

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


# Per output dtype: the floor every op starts from.
DTYPE_FLOORS: dict[torch.dtype, Tolerance] = {
    torch.bfloat16: Tolerance(atol=1e-5, rtol=2.0 ** -8, floor=1.02, factor=2.0,
                              rationale="half a bf16 ulp, +2% for fp32 noise flipping a rounding near a midpoint"),
    torch.float16: Tolerance(atol=1e-6, rtol=2.0 ** -11, floor=1.02, factor=2.0,
                             rationale="half an fp16 ulp, +2% for fp32 noise"),
    torch.float32: Tolerance(atol=1e-7, rtol=2.0 ** -20, floor=1.0, factor=2.0,
                             rationale="fp32 accumulation over short reductions: ~8 ulps"),
}

# Per-op overrides, each with its reason. Key: (op, output name).
OVERRIDES: dict[tuple[str, str], Tolerance] = {
    ("qk_norm_rope", "q_out"): Tolerance(
        atol=1e-5, rtol=2.0 ** -8, floor=1.02, factor=1.0,
        rationale="norm+rope round once to bf16 in both the chain and the kernel: no excess over the chain "
                  "is honest (factor 1); outputs are normalised, so atol only guards rope cancellation"),
    ("qk_norm_rope", "kv_out"): Tolerance(
        atol=1e-5, rtol=2.0 ** -8, floor=1.02, factor=1.0, rationale="as q_out: kv rows round once to bf16 in both paths"),
    ("qk_norm_rope", "ring"): Tolerance(
        atol=1e-5, rtol=2.0 ** -8, floor=1.02, factor=1.0, rationale="ring rows are kv_out rows stored as bf16"),
}


def lookup(op: str, output: str, dtype: torch.dtype) -> Tolerance:
    if (op, output) in OVERRIDES:
        return OVERRIDES[(op, output)]
    if dtype not in DTYPE_FLOORS:
        raise KeyError(f"no tolerance for {op}.{output} in dtype {dtype}: add one to harness/tolerance.py")
    return DTYPE_FLOORS[dtype]
