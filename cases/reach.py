"""Which regions of each op's case space the generated cases reach, and how often.

A region is a predicate over a generated case (and, where the case alone does not say, the
inputs it builds: positions, prefix lengths). ``tests/test_reach.py`` holds every region at
>= ``MIN_FRACTION`` of a profile's generated cases, so a strategy change that starves one (RoPE
the identity in most cases, a fallback branch never drawn) fails there, not in a kernel bug
that goes unseen. Print the tables:

    python -m cases.reach [--profile ci] [--op OP] [--seed 0]
"""
from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from types import SimpleNamespace

import torch

from cases import base
from cases import mla_fp8_prepare as mc
from cases import qk_norm_rope as qc
from cases import verify_attention as vc
from cases.profiles import PROFILES, current

MIN_FRACTION = 0.2
CPU = SimpleNamespace(torch_device=torch.device("cpu"))  # all build_inputs reads of a Device


def _pow2(x: float) -> bool:
    return x > 0 and float(x).hex().startswith("0x1.0000000000000p")


# ----------------------------------------------------------------------------- qk_norm_rope

def _qk_facts(c: qc.QkNormRopeCase) -> dict:
    pos = qc.build_inputs(c, CPU)["positions"]
    return dict(pos=pos, spread=int(pos.max() - pos.min()))


def _qk_tile_edge(c) -> bool:
    return c.T in qc.tile_edges(c.D, c.T)


QK = {
    "rope rotates (some position > 0)": lambda c, f: bool((f["pos"] > 0).any()),
    "positions spread over >= 1/4 of the table": lambda c, f: f["spread"] >= 1 and f["spread"] >= c.max_pos // 4,
    "positions >= 1024 (large angles)": lambda c, f: int(f["pos"].max()) >= 1024,
    "last table row used": lambda c, f: int(f["pos"].max()) == c.max_pos - 1 and c.max_pos > 1,
    "rope_style interleaved": lambda c, f: c.rope_style == "interleaved",
    "rope_style neox": lambda c, f: c.rope_style == "neox",
    "q weight on": lambda c, f: c.q_weight,
    "q weight off": lambda c, f: not c.q_weight,
    **{f"head_dim {d}": (lambda d: lambda c, f: c.D == d)(d) for d in (64, 128, 256, 512)},
    **{f"rope_dim {r}": (lambda r: lambda c, f: c.R == r)(r) for r in (16, 32, 64)},
    "several heads": lambda c, f: c.H > 1,
    "tokens at a compiled tile edge ±1": lambda c, f: _qk_tile_edge(c),
    "mode decode": lambda c, f: c.mode == "decode",
    "mode target_verify": lambda c, f: c.mode == "target_verify",
    "decode with padding slots": lambda c, f: c.mode == "decode" and c.padding > 0,
    "rows near eps (scale 1e-3)": lambda c, f: c.scale == 1e-3,
    "large rows (scale 30)": lambda c, f: c.scale == 30.0,
    "eps 1e-5": lambda c, f: c.eps == 1e-5,
    "kv strided": lambda c, f: c.kv_layout == "strided",
    "kv contiguous": lambda c, f: c.kv_layout == "contiguous",
    "caller's q_out": lambda c, f: c.q_out == "provided",
}


# ----------------------------------------------------------------------------- mla_fp8_prepare

def _mla_tile_edge(rows: int) -> bool:
    from_compiled = 4  # fused.mla_fp8_prepare.block_config(interpreted=False)[0]
    return rows >= from_compiled - 1 and rows % from_compiled in (from_compiled - 1, 0, 1)


MLA = {
    "e4m3fn": lambda c, f: c.fp8_format == "e4m3fn",
    "e4m3fnuz": lambda c, f: c.fp8_format == "e4m3fnuz",
    "dispatch: kernel": lambda c, f: mc.expected_path(c) == "kernel",
    "dispatch: a gate off (fallback)": lambda c, f: not (c.save_kv_cache and c.switch and c.capture_loc
                                                         and c.q_layout != "inner_strided"),
    "policy nan (fused refuses)": lambda c, f: c.policy == "nan",
    "no kv_descale": lambda c, f: c.kv_descale == 0.0,
    "kv_descale a power of two": lambda c, f: _pow2(c.kv_descale),
    "kv_descale not a power of two": lambda c, f: c.kv_descale != 0.0 and not _pow2(c.kv_descale),
    "fp8 specials present": lambda c, f: c.specials > 0,
    "fp8 specials only": lambda c, f: c.specials == 1.0,
    "overflow-heavy (scale 300)": lambda c, f: c.scale == 300.0,
    "subnormal-heavy (scale 0.01)": lambda c, f: c.scale == 0.01,
    "padding entries": lambda c, f: c.padding > 0,
    "pool full (no extra slots)": lambda c, f: c.extra_slots == 0,
    "pool translated": lambda c, f: c.pool == "translated",
    "pool identity": lambda c, f: c.pool == "identity",
    "q model layout": lambda c, f: c.q_layout == "model",
    "q contiguous": lambda c, f: c.q_layout == "contiguous",
    "k model layout": lambda c, f: c.k_layout == "model",
    "k contiguous": lambda c, f: c.k_layout == "contiguous",
    "loc int32": lambda c, f: c.loc_dtype == "int32",
    **{f"dims {dn}/{r}": (lambda dn, r: lambda c, f: (c.Dn, c.R) == (dn, r))(dn, r)
       for dn, r in ((512, 64), (64, 16), (100, 28), (17, 5))},
    "q rows (T·H) at a compiled tile edge ±1": lambda c, f: _mla_tile_edge(c.T * c.H),
    "k rows (T) at a compiled tile edge ±1": lambda c, f: _mla_tile_edge(c.T),
}


# ----------------------------------------------------------------------------- verify_attention

def _va_facts(c: vc.VerifyAttentionCase) -> dict:
    pre = vc.prefix_lengths(c.prefix, c.B, c.seed)
    chunks = [-(-n // c.splits) for n in pre]  # the kernels' cdiv partition: keys per split
    return dict(pre=pre, chunks=chunks)


VA = {
    "layout gqa": lambda c, f: c.layout == "gqa",
    "layout mla": lambda c, f: c.layout == "mla",
    **{f"head_dim {d}": (lambda d: lambda c, f: c.D == d)(d) for d in (64, 128, 256, 576)},
    "several requests": lambda c, f: c.B > 1,
    "width 1": lambda c, f: c.L == 1,
    "width >= 4": lambda c, f: c.L >= 4,
    "several KV heads": lambda c, f: c.Hkv > 1,
    "group not a power of two (shared-KV refuses)": lambda c, f: (c.H // c.Hkv) & (c.H // c.Hkv - 1) != 0,
    "an empty prefix": lambda c, f: 0 in f["pre"],
    "prefix mixed": lambda c, f: c.prefix.startswith("mixed:"),
    "split keys at a compiled tile edge ±1": lambda c, f: any(vc.at_tile_edge(k, c.D) for k in f["chunks"]),
    "kv bf16": lambda c, f: c.kv_dtype == "bf16",
    "kv e4m3fn": lambda c, f: c.kv_dtype == "e4m3fn",
    "kv e4m3fnuz": lambda c, f: c.kv_dtype == "e4m3fnuz",
    "non-unit k/v scales": lambda c, f: (c.k_scale, c.v_scale) != (1.0, 1.0),
    "non-causal": lambda c, f: not c.is_causal,
    "ascending indices": lambda c, f: not c.permuted,
    "ragged widths": lambda c, f: c.ragged,
    "one split": lambda c, f: c.splits == 1,
    "several splits": lambda c, f: c.splits > 1,
    "tree (topk > 1)": lambda c, f: c.topk > 1,
    "peaky softmax (q_scale 4)": lambda c, f: c.q_scale == 4.0,
}

OPS: dict[str, tuple[Callable, Callable, dict]] = {
    "qk_norm_rope": (qc.cases, _qk_facts, QK),
    "mla_fp8_prepare": (mc.cases, lambda c: {}, MLA),
    "verify_attention": (vc.cases, _va_facts, VA),
}


@functools.cache
def generated(op: str, n: int, seed: int = 0) -> tuple:
    """The ``n`` generated cases a parity run with this seed draws (suite.plan_cases)."""
    return tuple(base.draw(OPS[op][0](), n, rng_seed=seed))


@functools.cache
def hits(op: str, n: int, seed: int = 0) -> dict[str, int]:
    """Region -> how many of the ``n`` generated cases fall in it."""
    strategy, facts, regions = OPS[op]
    out = dict.fromkeys(regions, 0)
    for c in generated(op, n, seed):
        f = facts(c)
        for name, pred in regions.items():
            out[name] += bool(pred(c, f))
    return out


def counts(op: str, profile: str | None = None) -> list[int]:
    """Case counts a profile draws for ``op``: the profile's, and the interpreter's cap if lower."""
    from harness.registry import default_registry  # the caps live in the op specs

    prof = current(profile)
    cap = default_registry().ops[op].interpreter_generated
    return [prof.generated] + ([cap] if cap is not None and cap < prof.generated else [])


def table(op: str, profile: str | None = None, seed: int = 0) -> str:
    ns = counts(op, profile)
    cols = [hits(op, n, seed) for n in ns]
    head = " | ".join(f"{n} cases" + (" (interpreter)" if i else "") for i, n in enumerate(ns))
    width = max(map(len, OPS[op][2]))
    lines = [f"{op} ({current(profile).name} profile, seed {seed}): fraction of generated cases in each region",
             f"{'region':<{width}} | {head}"]
    for name in OPS[op][2]:
        lines.append(f"{name:<{width}} | " + " | ".join(f"{col[name] / n:>5.0%}" + (" <" if col[name] / n < MIN_FRACTION
                                                                                  else "  ")
                                                       for col, n in zip(cols, ns)))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cases.reach", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", choices=sorted(PROFILES), default=None, help="default: $VP_PROFILE or ci")
    ap.add_argument("--op", choices=sorted(OPS), action="append", help="default: every op")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("\n\n".join(table(op, args.profile, args.seed) for op in args.op or OPS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
