"""Cases for ``verify_attention`` (seeds 002, 003): target-verify attention over a paged prefix.

Layouts: ``gqa`` (D = Dv ∈ {64, 128, 256}, Hkv KV heads; Qwen3.5 / MiniMax have one local KV
head after TP, the DSpark draft has several and is non-causal) and ``mla`` (Kimi-K3 absorbed
MLA: Hkv = 1, D = 576, Dv = 512, V = the first 512 dims of K, passed as strided views).

Prefix patterns (``prefix`` field, no commas so case ids stay parseable):
  ``const:N``   every request has N prefix tokens;
  ``mixed:N``   request lengths drawn in [0, N], the first request 0, the second N;
  ``list:a-b-c`` lengths cycled over the requests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cases.base import composite

if TYPE_CHECKING:  # annotations only: reading the declarations imports no torch (python -m harness list)
    import torch

KV_DTYPES = ("bf16", "e4m3fn", "e4m3fnuz")
FAMILIES = ("generic", "kimi-k3", "qwen3.5", "minimax", "dspark-draft")


@dataclass(frozen=True)
class VerifyAttentionCase:
    layout: Literal["gqa", "mla"] = "gqa"
    B: int = 1  # batch (requests)
    L: int = 4  # verify_width (drafts per request); the widest when ragged
    H: int = 16  # num_heads (TP-local)
    Hkv: int = 1  # num_kv_heads (TP-local)
    D: int = 128  # head_dim (mla: 576)
    Dv: int = 128  # v_head_dim (mla: 512)
    prefix: str = "const:40"  # prefix-length pattern, see module docstring
    kv_dtype: Literal["bf16", "e4m3fn", "e4m3fnuz"] = "bf16"  # the KV buffers; drafts stay bf16
    k_scale: float = 1.0
    v_scale: float = 1.0
    is_causal: bool = True
    permuted: bool = True  # kv_indices a random permutation of pool slots (else ascending)
    ragged: bool = False  # request widths vary in [1, L]
    splits: int = 2  # num_kv_splits
    topk: int = 1  # > 1: a tree of drafts with a custom mask
    family: Literal["generic", "kimi-k3", "qwen3.5", "minimax", "dspark-draft"] = "generic"  # seen by the backend gate
    q_scale: float = 1.0  # query magnitude (4.0 makes softmax peaky: LSE merge under stress)
    seed: int = 0
    name: str = ""


def prefix_lengths(pattern: str, B: int, seed: int) -> list[int]:
    import torch

    kind, arg = pattern.split(":", 1)
    if kind == "const":
        return [int(arg)] * B
    if kind == "list":
        vals = [int(x) for x in arg.split("-")]
        return [vals[i % len(vals)] for i in range(B)]
    if kind == "mixed":
        n = int(arg)
        g = torch.Generator().manual_seed(seed + 7)
        lens = torch.randint(0, n + 1, (B,), generator=g).tolist()
        lens[0] = 0
        if B > 1:
            lens[1] = n
        return lens
    raise ValueError(f"prefix: unknown pattern {pattern!r}")


def widths(case: VerifyAttentionCase) -> list[int]:
    import torch

    if not case.ragged:
        return [case.L] * case.B
    g = torch.Generator().manual_seed(case.seed + 11)
    w = torch.randint(1, case.L + 1, (case.B,), generator=g).tolist()
    w[0] = case.L
    if case.B > 1 and case.L > 1:
        w[1] = 1  # guarantee the widths really differ
    return w


def _gqa(name, *, H, Hkv=1, D=128, L=4, B=1, **kw):
    return VerifyAttentionCase(layout="gqa", B=B, L=L, H=H, Hkv=Hkv, D=D, Dv=D, name=name, **kw)


def _mla(name, *, H, L=4, B=1, **kw):
    return VerifyAttentionCase(layout="mla", B=B, L=L, H=H, Hkv=1, D=576, Dv=512, family="kimi-k3", name=name, **kw)


def case_cost(c: VerifyAttentionCase) -> float:
    """Scheduling weight (``OpSpec.case_cost``): the key and query elements the case reads, (prefix +
    drafts) x heads x head_dim. Measured on the H200, torch.compile's chain spent 104-105 s on each
    200K-prefix case where most took 2-20 s."""
    return float(sum(prefix_lengths(c.prefix, c.B, c.seed)) + c.B * c.L) * c.H * c.D


def catalog(*, big: bool = False) -> list[VerifyAttentionCase]:
    cases = [
        # Qwen3.5 GQA, one local KV head, D 256: TP8/TP4/TP2 local heads 4/8/16, widths 1-3 (seed 002)
        *[_gqa(f"qwen35-tp-h{h}-l{l}", H=h, D=256, L=l, family="qwen3.5", seed=h * 10 + l)
          for h in (4, 8, 16) for l in (1, 2, 3)],
        _gqa("qwen35-h16-l4-b3", H=16, D=256, L=4, B=3, family="qwen3.5", prefix="list:5-70-33", seed=1),
        # MiniMax-style GQA, one local KV head, D 128
        _gqa("minimax-h8-l5", H=8, D=128, L=5, B=2, family="minimax", seed=2),
        # Kimi-K3 absorbed MLA (D 576 / Dv 512, V = latent), TP-local heads 16 and 64, fp8 KV
        _mla("k3-mla-h16-l3", H=16, L=3, B=2, seed=3),
        _mla("k3-mla-h16-l1-e4m3fn", H=16, L=1, kv_dtype="e4m3fn", k_scale=0.75, v_scale=1.5, seed=4),
        _mla("k3-mla-h4-l2-e4m3fnuz", H=4, L=2, B=2, kv_dtype="e4m3fnuz", k_scale=1.25, v_scale=0.5, seed=5),
        # DSpark draft (seed 003): GQA, several local KV heads, non-causal drafts, D 64
        _gqa("dspark-hkv2-h8-noncausal", H=8, Hkv=2, D=64, L=4, B=2, is_causal=False, family="dspark-draft", seed=6),
        _gqa("dspark-hkv4-h16-noncausal", H=16, Hkv=4, D=64, L=3, is_causal=False, family="dspark-draft", seed=7),
        _gqa("dspark-hkv4-h8-l7-noncausal", H=8, Hkv=4, D=64, L=7, is_causal=False, family="dspark-draft", seed=8),
        # KV heads 2/4, causal, generic GQA (split-KV path)
        _gqa("gqa-hkv2-h4-d128", H=4, Hkv=2, D=128, L=4, seed=9),
        _gqa("gqa-hkv4-h16-d64-l8", H=16, Hkv=4, D=64, L=8, seed=10),
        # prefix 0 and 1; tile boundaries ±1 (interpreter BLOCK_N 512 -> 511/512/513, 1023/1024/1025;
        # multiples of 512 are tile boundaries of every compiled BLOCK_N as well)
        _gqa("empty-prefix-all", H=4, D=64, L=3, B=2, prefix="const:0", seed=11),
        _gqa("empty-prefix-one-request", H=8, D=128, L=2, B=3, prefix="list:0-17-1", seed=12),
        _gqa("prefix-one", H=4, D=64, L=4, prefix="const:1", splits=3, seed=13),
        _gqa("tile-boundary-pm1", H=4, D=64, L=2, B=6, prefix="list:511-512-513-1023-1024-1025", splits=1, seed=14),
        # two splits of 512 / 512 / 513 keys (cdiv partition): each split's own tile boundary
        _gqa("tile-boundary-split2", H=4, D=64, L=2, B=3, prefix="list:1023-1024-1025", splits=2, seed=15),
        _gqa("many-splits-short-prefix", H=4, D=64, L=2, prefix="const:5", splits=8, seed=16),
        # a 24-request batch with mixed prefixes (0 and the max included)
        _gqa("batch24-mixed", H=4, D=64, L=3, B=24, prefix="mixed:90", family="qwen3.5", seed=17),
        # widths 1..8 on one head config
        *[_gqa(f"width-{l}", H=4, D=64, L=l, B=2, prefix="const:20", seed=20 + l) for l in range(1, 9)],
        # fp8 KV with non-unit scales, both formats, GQA
        _gqa("fp8-e4m3fn-gqa", H=8, D=128, L=3, B=2, kv_dtype="e4m3fn", k_scale=0.5, v_scale=2.0, seed=30),
        _gqa("fp8-e4m3fnuz-gqa-hkv2", H=8, Hkv=2, D=64, L=4, B=2, kv_dtype="e4m3fnuz", k_scale=1.75,
             v_scale=0.25, is_causal=False, family="dspark-draft", seed=31),
        # ascending (unpermuted) indices, peaky softmax, heads 128 local (MLA TP1 has 128)
        _gqa("ascending-indices", H=4, D=64, L=3, permuted=False, seed=32),
        _gqa("peaky-softmax", H=4, D=128, L=4, B=2, q_scale=4.0, prefix="const:100", splits=3, seed=33),
        # refusals: ragged widths, group not divisible by BLOCK_H, split-KV switch off
        _gqa("ragged-widths", H=4, D=64, L=5, B=4, ragged=True, prefix="mixed:30", seed=35),
        _gqa("group-6-odd", H=6, D=64, L=2, family="qwen3.5", seed=36),
        _gqa("group-3-hkv2", H=6, Hkv=2, D=64, L=3, is_causal=False, family="dspark-draft", seed=37),
        # trees (topk > 1): shared-KV must not run (the kernel ignores tree masks)
        _gqa("tree-topk2-qwen35", H=8, D=64, L=6, B=2, topk=2, family="qwen3.5", seed=38),
        _mla("tree-topk4-k3", H=4, L=8, topk=4, prefix="const:16", seed=39),
    ]
    if big:
        cases += [
            # TP-local heads 64 / 128 (K3 MLA at TP2 / TP1): too many programs for the interpreter
            _mla("k3-mla-h128-l2", H=128, L=2, prefix="const:24", seed=34),
            _mla("k3-mla-h64-l3-e4m3fn", H=64, L=3, B=2, prefix="list:300-0", kv_dtype="e4m3fn", k_scale=0.5,
                 v_scale=1.25, seed=35),
            _gqa("gqa-h64-hkv4-d128", H=64, Hkv=4, D=128, L=3, B=2, seed=36),
            *[_gqa(f"gpu-qwen35-b64-h16-p{p}", H=16, D=256, L=4, B=64, prefix=f"const:{p}", splits=8,
                   family="qwen3.5", seed=100 + i) for i, p in enumerate((1024, 4096, 16384))],
            _gqa("gpu-qwen35-b4-p200k", H=16, D=256, L=4, B=4, prefix="const:200000", splits=32, family="qwen3.5",
                 seed=110),
            _gqa("gpu-batch24-mixed-8k", H=16, D=256, L=3, B=24, prefix="mixed:8192", splits=8, family="qwen3.5",
                 kv_dtype="e4m3fn", k_scale=0.5, v_scale=1.5, seed=111),
            _mla("gpu-k3-b16-h64-p16k", H=64, L=4, B=16, prefix="const:16384", splits=8, kv_dtype="e4m3fn",
                 k_scale=0.75, v_scale=1.25, seed=112),
            _mla("gpu-k3-b2-h128-p200k", H=128, L=2, B=2, prefix="const:200000", splits=32, seed=113),
            _gqa("gpu-dspark-b32-hkv4-p32k", H=16, Hkv=4, D=64, L=4, B=32, prefix="const:32768", splits=16,
                 is_causal=False, family="dspark-draft", seed=114),
            _gqa("gpu-tile-pm1-d128", H=8, D=128, L=2, B=6, prefix="list:255-256-257-4095-4096-4097", splits=4,
                 seed=115),
        ]
    return cases


# fused.verify_attention.wrapper.BLOCK_CONFIG["sm90"]'s BLOCK_N per head_dim (tests/test_reach.py holds them
# equal): the key tile of the compiled kernels; the interpreter's 512 is the catalog's
COMPILED_BLOCK_N = {64: 64, 128: 64, 256: 32, 576: 32}


def at_tile_edge(keys: int, D: int) -> bool:
    """``keys`` (one split's share of a prefix) one short of, on, or one past a compiled key-tile boundary."""
    bn = COMPILED_BLOCK_N[D]
    return keys >= bn - 1 and keys % bn in (bn - 1, 0, 1)


@composite
def cases(draw, *, max_batch: int = 3, max_width: int = 8, max_heads: int = 8, max_prefix: int = 200,
          max_splits: int = 3, head_dims=(64, 128, 256), layouts=("gqa", "gqa", "gqa", "mla")):
    """Generated cases, built bottom-up; shrink toward one request, width 1, one head, gqa D 64.

    Weighted so that every region tests/test_reach.py lists holds >= 20 % of a profile's cases:
    ``layouts`` repeats gqa so that each head_dim (gqa's and MLA's 576) gets about a quarter, width 1
    takes 1 in 4 (plus its share of the rest), 3 in 5 gqa cases have one KV head, 2 in 3 causal multi-draft cases are trees, and half the
    prefix lengths give every split a share at a compiled key-tile edge ±1."""
    from hypothesis import strategies as st

    layout = draw(st.sampled_from(layouts))
    B = draw(st.integers(1, max_batch))
    L = 1 if draw(st.sampled_from((False, False, False, True))) else draw(st.integers(1, max_width))
    if layout == "mla":
        H, Hkv, D, Dv = draw(st.sampled_from([h for h in (1, 2, 4, 8, 16) if h <= max_heads])), 1, 576, 512
        family = "kimi-k3"
        is_causal = True
    else:
        Hkv = draw(st.sampled_from([h for h in (1, 1, 1, 2, 4) if h <= max_heads]))
        H = Hkv * draw(st.integers(1, max(1, max_heads // Hkv)))
        D = Dv = draw(st.sampled_from(head_dims))
        is_causal = draw(st.booleans())
        family = ("dspark-draft" if not is_causal and Hkv > 1 else
                  draw(st.sampled_from(("generic", "qwen3.5", "minimax"))))
    kv_dtype = draw(st.sampled_from(KV_DTYPES))
    scales = (1.0, 0.5, 1.75) if kv_dtype != "bf16" else (1.0,)
    topk = draw(st.sampled_from((1, 2, 4))) if L > 1 and is_causal else 1
    splits = draw(st.integers(1, max_splits))
    bn = COMPILED_BLOCK_N[D]
    edges = [splits * k for k in (bn - 1, bn, bn + 1) if splits * k <= max_prefix]  # every split's share k
    n = draw(st.integers(0, max_prefix) | st.sampled_from(edges) if edges else st.integers(0, max_prefix))
    prefix = draw(st.sampled_from((f"const:{n}", f"mixed:{n}", f"const:{n}")))
    return VerifyAttentionCase(
        layout=layout, B=B, L=L, H=H, Hkv=Hkv, D=D, Dv=Dv, prefix=prefix, kv_dtype=kv_dtype,
        k_scale=draw(st.sampled_from(scales)), v_scale=draw(st.sampled_from(scales)), is_causal=is_causal,
        permuted=draw(st.booleans()), ragged=draw(st.booleans()) if B > 1 else False,
        splits=splits, topk=topk, family=family,
        q_scale=draw(st.sampled_from((1.0, 1.0, 4.0))), seed=draw(st.integers(0, 2 ** 16)),
    )


def _tree(L: int, g: torch.Generator) -> torch.Tensor:
    """(L, L) bool ancestor-or-self mask of a random draft tree (parent[i] < i, −1 = root)."""
    import torch

    parent = [int(torch.randint(-1, i, (1,), generator=g)) if i else -1 for i in range(L)]
    m = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parent[j]
    return m


def _to_kv(x: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    if kv_dtype == "bf16":
        return x.bfloat16()
    from harness.devices import fp8_dtype

    return x.clamp(-200, 200).to(fp8_dtype(kv_dtype))  # in range: no overflow policy involved here


def build_inputs(case: VerifyAttentionCase, device) -> dict:
    """Keyword arguments of one verify step, on ``device`` (a harness.devices.Device)."""
    import torch

    g = torch.Generator().manual_seed(case.seed)
    w = widths(case)
    pre = prefix_lengths(case.prefix, case.B, case.seed)
    T, N = sum(w), sum(pre)
    H, Hkv, D, Dv = case.H, case.Hkv, case.D, case.Dv
    S = N + 8 + N // 4  # pool larger than the prefixes: unread rows hold stale values
    q = (torch.randn(T, H, D, generator=g) * case.q_scale).bfloat16()
    k = torch.randn(T, Hkv, D, generator=g).bfloat16()
    kb = _to_kv(torch.randn(S, Hkv, D, generator=g) * 1.5, case.kv_dtype)
    if case.layout == "mla":  # V is the latent: the first Dv dims of K (strided views)
        v, vb = k[..., :Dv], kb[..., :Dv]
    else:
        v = torch.randn(T, Hkv, Dv, generator=g).bfloat16()
        vb = _to_kv(torch.randn(S, Hkv, Dv, generator=g) * 1.5, case.kv_dtype)
    kv_indices = torch.randperm(S, generator=g)[:N] if case.permuted else torch.arange(N)
    tree = torch.cat([_tree(l, g).flatten() for l in w]) if case.topk > 1 else None
    dev = device.torch_device
    qo_indptr = torch.tensor([0] + w, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    kv_indptr = torch.tensor([0] + pre, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    kb_d = kb.to(dev)
    k_d = k.to(dev)
    return dict(
        q=q.to(dev), k=k_d, v=k_d[..., :Dv] if case.layout == "mla" else v.to(dev),
        k_buffer=kb_d, v_buffer=kb_d[..., :Dv] if case.layout == "mla" else vb.to(dev),
        qo_indptr=qo_indptr.to(dev), kv_indptr=kv_indptr.to(dev), kv_indices=kv_indices.to(torch.int32).to(dev),
        sm_scale=1.0 / math.sqrt(D if case.layout == "gqa" else 192), is_causal=case.is_causal,
        k_scale=float(case.k_scale), v_scale=float(case.v_scale), num_kv_splits=case.splits,
        custom_mask=None if tree is None else tree.to(dev), o=None, topk=case.topk, model_family=case.family,
        splitkv_switch=True,
    )


# ----------------------------------------------------------------------------- reach (cases.reach)

def reach_facts(c: VerifyAttentionCase) -> dict:
    pre = prefix_lengths(c.prefix, c.B, c.seed)
    chunks = [-(-n // c.splits) for n in pre]  # the kernels' cdiv partition: keys per split
    return dict(pre=pre, chunks=chunks)


REACH = {
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
    "split keys at a compiled tile edge ±1": lambda c, f: any(at_tile_edge(k, c.D) for k in f["chunks"]),
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
