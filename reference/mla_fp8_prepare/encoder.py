"""The fp8 e4m3 formats decoded from their bit layout, and an independent encoder built on that
table alone (nearest code by magnitude, ties to even, overflow by the midpoint past max): what
``reference.mla_fp8_prepare.chain``'s fp64 oracle takes the chain's codes from. Pure torch.
"""
from __future__ import annotations

import torch


def fp8_code_values(fmt: str) -> torch.Tensor:
    """(256,) fp64 value of every code, decoded from the bit layout (NaN for NaN codes)."""
    bias, out = (7, []) if fmt == "e4m3fn" else (8, [])
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 0xF, b & 0x7
        if (fmt == "e4m3fn" and e == 15 and m == 7) or (fmt == "e4m3fnuz" and b == 0x80):
            out.append(float("nan"))
            continue
        mag = (m / 8.0) * 2.0 ** (1 - bias) if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - bias)
        out.append(-mag if s else mag)
    return torch.tensor(out, dtype=torch.float64)


def encode_fp8_oracle(x: torch.Tensor, fmt: str, policy: str) -> torch.Tensor:
    """Independent encoder: fp64 values -> uint8 codes, same shape.

    Picks the nearest finite code by magnitude from the decoded table (ties: the code with an
    even mantissa, i.e. an even code), applies the sign, and decides overflow by comparing
    with the midpoint between max and the next value the format would have (2^e·(1 + 8/8)).
    """
    vals = fp8_code_values(fmt)
    pos_codes = torch.arange(0, 0x80)
    pos_codes = pos_codes[~torch.isnan(vals[pos_codes])]  # finite non-negative codes, ascending
    mags = vals[pos_codes]
    fmax = float(mags[-1])
    top_ulp = fmax - float(mags[-2])
    next_up = fmax + top_ulp
    tie = (fmax + next_up) / 2.0
    max_code_even = int(pos_codes[-1]) % 2 == 0

    x = x.double().flatten()
    a = x.abs()
    hi = torch.searchsorted(mags, a.clamp(max=fmax)).clamp(max=len(mags) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = (a - mags[lo]).abs(), (mags[hi] - a).abs()
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (pos_codes[hi] % 2 == 0))
    code = torch.where(pick_hi, pos_codes[hi], pos_codes[lo])
    over = torch.isinf(a) | (a > tie) | ((a == tie) & (not max_code_even))
    neg = torch.signbit(x)
    if policy == "saturate":
        code = torch.where(over, pos_codes[-1], code)
    if fmt == "e4m3fn":
        code = torch.where(neg, code | 0x80, code)  # -0 exists: 0x80
    else:
        code = torch.where(neg & (code != 0), code | 0x80, code)  # no -0 in fnuz
    nan_code = torch.full_like(code, 0x7F if fmt == "e4m3fn" else 0x80)  # canonical NaN, sign dropped
    special = torch.isnan(x) | (over if policy == "nan" else torch.zeros_like(over))
    return torch.where(special, nan_code, code).to(torch.uint8)
