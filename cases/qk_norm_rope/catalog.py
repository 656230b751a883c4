"""Cases for ``qk_norm_rope`` (seed 000): DeepSeek-V4 MQA shapes and the ugly ones.

DeepSeek-V4: head_dim 512, rope_dim 64 (interleaved), no q weight, local heads 8…128 after
TP; a verify batch has T = B·(L+1) tokens; kv is a strided slice of ``qkv_a``. A layer is
unified (the bf16 ring, ``ring``) or non-unified (``unified=False``: the paged fp8 SWA cache,
``swa_cache`` + ``swa_page_size``, ``reference.qk_norm_rope.swa.SwaLayout``; ``ring`` None), the
gate's third branch.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Literal

from cases.base import composite
from cases.timeline_family import Family

if TYPE_CHECKING:  # annotations only: reading the declarations imports no torch (python -m harness list)
    import torch

FORWARD_MODES = ("decode", "target_verify")


@dataclass(frozen=True)
class QkNormRopeCase:
    T: int  # num_tokens
    H: int  # num_heads (local)
    D: int = 512  # head_dim
    R: int = 64  # rope_dim
    rope_style: Literal["interleaved", "neox"] = "interleaved"
    q_weight: bool = False  # DeepSeek-V4 passes no q weight
    mode: Literal["decode", "target_verify"] = "target_verify"  # forward_mode
    scale: float = 1.0  # input magnitude; 1e-3 puts mean(x²) next to eps
    eps: float = 1e-6
    max_pos: int = 8192  # rows of the cos/sin tables
    pos: Literal["random", "near_end", "zero"] = "random"
    padding: int = 0  # loc entries set to -1 (padding slots)
    kv_layout: Literal["strided", "contiguous"] = "strided"  # strided: a slice of qkv_a, as in the model
    q_out: Literal["alloc", "provided"] = "alloc"  # provided: the caller passes q_out
    unified: bool = True  # False: non-unified layer, the paged fp8 SWA cache instead of the ring
    page_size: int = 64  # tokens per SWA page (non-unified only)
    seed: int = 0
    name: str = ""


def _verify(name, B, L, H, **kw):
    return QkNormRopeCase(T=B * (L + 1), H=H, name=name, **kw)


def case_cost(c: QkNormRopeCase) -> float:
    """Scheduling weight (``OpSpec.case_cost``): the elements the case normalises, T x (H + 1) x D."""
    return float(c.T * (c.H + 1) * c.D)


def catalog(*, big: bool = False) -> list[QkNormRopeCase]:
    C = QkNormRopeCase
    cases = [
        # DeepSeek-V4 verify, L = 3 drafts (+1 bonus token), every TP-local head count
        *[_verify(f"dsv4-verify-b1-l3-h{h}", 1, 3, h, seed=h) for h in (8, 16, 32, 64, 128)],
        _verify("dsv4-verify-b8-l3-h16", 8, 3, 16, seed=1),
        _verify("dsv4-verify-b8-l3-h128", 8, 3, 128, seed=2),
        _verify("dsv4-verify-b32-l3-h16", 32, 3, 16, seed=3),
        # decode: the in-kernel ring store is legal here (1-source consumer)
        C(T=1, H=16, mode="decode", name="dsv4-decode-b1-h16"),
        C(T=16, H=128, mode="decode", name="dsv4-decode-b16-h128", seed=4),
        C(T=16, H=16, mode="decode", padding=5, name="decode-padding-slots", seed=5),
        # ugly cases
        C(T=1, H=1, name="one-token-one-head"),
        C(T=7, H=3, name="odd-tokens-odd-heads", seed=6),
        C(T=13, H=16, pos="near_end", max_pos=20, name="positions-at-table-end", seed=7),
        C(T=5, H=8, max_pos=1, pos="zero", name="table-of-one-position", seed=8),
        C(T=9, H=8, kv_layout="contiguous", name="kv-contiguous", seed=9),
        C(T=9, H=8, q_out="provided", name="caller-q-out", seed=10),
        C(T=9, H=8, q_out="provided", mode="decode", name="caller-q-out-decode", seed=11),
        C(T=8, H=4, q_weight=True, name="with-q-weight", seed=12),
        C(T=8, H=4, rope_style="neox", name="neox", seed=13),
        C(T=8, H=4, rope_style="neox", q_weight=True, mode="decode", name="neox-decode-q-weight", seed=14),
        # mean(x²) ≈ eps: the only regime where eps placement is visible in bf16
        C(T=8, H=4, scale=1e-3, name="tiny-rows-eps-visible", seed=15),
        C(T=8, H=4, scale=1e-3, mode="decode", name="tiny-rows-decode", seed=16),
        C(T=8, H=4, scale=30.0, name="large-rows", seed=17),
        C(T=6, H=2, D=128, R=64, name="d128-r64", seed=18),
        C(T=6, H=2, D=64, R=64, name="rope-covers-whole-head", seed=19),
        C(T=513, H=2, D=256, R=32, name="tile-boundary-plus-one", seed=20),
        C(T=511, H=2, D=256, R=32, name="tile-boundary-minus-one", seed=21),
        # non-unified layers (the gate's third branch): the kernel's own paged fp8 store in every
        # mode, no kv handed back; DeepSeek-V4's page of 64 tokens and short pages that split a batch
        _verify("dsv4-nonunified-verify-b2-l3-h16", 2, 3, 16, unified=False, seed=22),
        C(T=4, H=16, mode="decode", unified=False, name="dsv4-nonunified-decode-b4-h16", seed=23),
        C(T=12, H=4, D=128, R=64, mode="decode", unified=False, page_size=4, padding=3,
          name="nonunified-short-pages-padding", seed=24),
        C(T=7, H=2, D=256, R=64, unified=False, page_size=3, q_out="provided", name="nonunified-odd-pages-q-out",
          seed=25),
        C(T=6, H=2, D=64, R=64, unified=False, page_size=2, name="nonunified-rope-covers-whole-head", seed=26),
        C(T=8, H=4, D=128, R=64, scale=1e-3, unified=False, page_size=8, name="nonunified-tiny-rows", seed=27),
        C(T=8, H=4, D=128, R=64, rope_style="neox", q_weight=True, unified=False, page_size=1,
          name="nonunified-neox-page-of-one", seed=28),
    ]
    if big:
        cases += [
            _verify("dsv4-verify-b64-l3-h128", 64, 3, 128, seed=30),
            _verify("dsv4-verify-b256-l3-h64", 256, 3, 64, seed=31),
            C(T=512, H=128, mode="decode", name="dsv4-decode-b512-h128", seed=32),
            C(T=4096, H=16, name="prefill-sized-4096", seed=33),
        ]
    return cases


# fused.qk_norm_rope.wrapper.block_config's compiled BLOCK_T: 1024 fp32 elements per token tile
# (tests/test_reach.py holds the two equal); the interpreter's 512 is the catalog's
def compiled_block_t(D: int) -> int:
    return max(1, 1024 // (1 << (D - 1).bit_length()))


def tile_edges(D: int, max_tokens: int) -> list[int]:
    """Token counts one short of, on, and one past a compiled token-tile boundary, up to ``max_tokens``."""
    bt = compiled_block_t(D)
    return [t for k in range(1, max_tokens // bt + 2) for t in (k * bt - 1, k * bt, k * bt + 1)
            if 2 <= t <= max_tokens]


@composite
def cases(draw, *, max_tokens: int = 40, max_heads: int = 12, head_dims=(64, 128, 256, 512),
          rope_dims=(16, 32, 64), max_positions: int = 8192):
    """Generated cases, built bottom-up; shrinks toward T=1, H=1, the smallest head_dim, a unified
    layer. A non-unified layer (the paged fp8 store) needs head_dim − rope_dim in whole 64-value
    tiles: its rope dims are drawn among those (2 layers in 5 are non-unified).

    Weighted so that every region of ``REACH`` holds >= 20 % of a profile's cases (tests/test_reach.py):
    half the token counts sit on a compiled tile edge, tables are small (2..64 rows, 1 in 3) or
    large (>= 4096 rows: large angles), and positions are all 0 (RoPE the identity) in 1 case
    in 8 only."""
    from hypothesis import strategies as st

    from reference.qk_norm_rope.swa import SWA_TILE

    D = draw(st.sampled_from(head_dims))
    non_unified = draw(st.sampled_from((False, False, False, True, True)))  # 2 in 5
    fits = [r for r in rope_dims if r <= D and D % r == 0 and (not non_unified or (D - r) % SWA_TILE == 0)]
    if not fits:  # no drawable rope dim tiles this head: a unified layer
        non_unified = False
        fits = [r for r in rope_dims if r <= D and D % r == 0]
    # a non-unified layer tiles D - R by 64 (in practice R = 64): unified layers favour the others
    R = draw(st.sampled_from(fits if non_unified else fits + [r for r in fits if r != max(fits)]))
    edges = tile_edges(D, max_tokens)
    T = draw(st.integers(1, max_tokens) | st.sampled_from(edges) if edges else st.integers(1, max_tokens))
    H = draw(st.integers(1, max_heads))
    mode = draw(st.sampled_from(FORWARD_MODES[::-1]))
    stores = mode == "decode" or non_unified  # padding slots mean something where the step stores
    pos = draw(st.sampled_from(("random",) * 5 + ("near_end",) * 2 + ("zero",)))
    if pos == "zero":
        max_pos = draw(st.integers(1, max_positions))
    else:  # >= 2 rows: positions differ
        small = draw(st.sampled_from((True, False, False)))
        max_pos = draw(st.integers(min(2, max_positions), min(64, max_positions)) if small else
                       st.integers(min(4096, max_positions), max_positions))
    return QkNormRopeCase(
        T=T, H=H, D=D, R=R,
        rope_style=draw(st.sampled_from(("interleaved", "neox"))),
        q_weight=draw(st.booleans()),
        mode=mode,
        scale=draw(st.sampled_from((1.0, 1e-3, 30.0))),
        eps=draw(st.sampled_from((1e-6, 1e-5))),
        max_pos=max_pos,
        pos=pos,
        padding=draw(st.integers(0, T - 1)) if stores else 0,
        kv_layout=draw(st.sampled_from(("strided", "contiguous"))),
        q_out=draw(st.sampled_from(("alloc", "provided"))),
        unified=not non_unified,
        page_size=draw(st.sampled_from((1, 2, 3, 4, 64))) if non_unified else 64,
        seed=draw(st.integers(0, 2 ** 16)),
    )


def rope_tables(max_pos: int, R: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (max_pos, R/2) fp32."""
    import torch

    inv_freq = 1.0 / base ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos().float().contiguous(), ang.sin().float().contiguous()


def build_inputs(case: QkNormRopeCase, device) -> dict:
    """Keyword arguments of a prepare step, on ``device`` (a harness.devices.Device)."""
    import torch

    from reference.qk_norm_rope.swa import SwaLayout

    g = torch.Generator().manual_seed(case.seed)
    T, H, D, R = case.T, case.H, case.D, case.R
    q = (torch.randn(T, H, D, generator=g) * case.scale).bfloat16()
    if case.kv_layout == "strided":  # kv = qkv_a[:, q_lora_rank:], qkv_a wider than D
        qkv_a = (torch.randn(T, 96 + D, generator=g) * case.scale).bfloat16()
        kv = qkv_a[:, 96:]
    else:
        kv = (torch.randn(T, D, generator=g) * case.scale).bfloat16()
    cos, sin = rope_tables(case.max_pos, R)
    if case.pos == "random":
        positions = torch.randint(0, case.max_pos, (T,), generator=g)
    elif case.pos == "near_end":
        positions = (case.max_pos - 1 - torch.arange(T)).clamp_min(0)
    else:
        positions = torch.zeros(T, dtype=torch.int64)
    S = 2 * T + 3
    ring = torch.randn(S, D, generator=g).bfloat16()  # stale contents: canary for untouched rows
    loc = torch.randperm(S, generator=g)[:T]
    loc[torch.randperm(T, generator=g)[: case.padding]] = -1
    dev = device.torch_device
    store = dict(ring=ring.to(dev), loc=loc.to(dev))
    if not case.unified:  # slots spread over a few pages, the rest of every page stale canary bytes
        lay = SwaLayout(D, R, case.page_size)
        pages = -(-S // case.page_size) + 1
        loc = torch.randperm(pages * case.page_size, generator=g)[:T]
        loc[torch.randperm(T, generator=g)[: case.padding]] = -1
        pool = torch.randint(0, 256, (pages, lay.page_bytes), generator=g, dtype=torch.uint8)
        store = dict(ring=None, loc=loc.to(dev), swa_cache=pool.to(dev), swa_page_size=case.page_size)
    kw = dict(
        q=q.to(dev), kv=(qkv_a.to(dev)[:, 96:] if case.kv_layout == "strided" else kv.to(dev)),
        kv_norm_weight=(0.5 + torch.rand(D, generator=g)).bfloat16().to(dev),
        q_norm_weight=(0.5 + torch.rand(D, generator=g)).bfloat16().to(dev) if case.q_weight else None,
        eps=case.eps, rope_dim=R, cos=cos.to(dev), sin=sin.to(dev), positions=positions.to(dev),
        rope_style=case.rope_style, **store, forward_mode=case.mode,
        q_out=torch.full((T, H, D), float("nan"), dtype=torch.bfloat16, device=dev) if case.q_out == "provided" else None,
    )
    return kw


# ----------------------------------------------------------------------------- reach (cases.reach)

_CPU = SimpleNamespace(torch_device="cpu")  # all build_inputs reads of a Device


def reach_facts(c: QkNormRopeCase) -> dict:
    pos = build_inputs(c, _CPU)["positions"]
    return dict(pos=pos, spread=int(pos.max() - pos.min()))


def _qk_tile_edge(c) -> bool:
    return c.T in tile_edges(c.D, c.T)


REACH = {
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
    "unified layer (ring)": lambda c, f: c.unified,
    "non-unified layer (paged fp8 store)": lambda c, f: not c.unified,
    "rows near eps (scale 1e-3)": lambda c, f: c.scale == 1e-3,
    "large rows (scale 30)": lambda c, f: c.scale == 30.0,
    "eps 1e-5": lambda c, f: c.eps == 1e-5,
    "kv strided": lambda c, f: c.kv_layout == "strided",
    "kv contiguous": lambda c, f: c.kv_layout == "contiguous",
    "caller's q_out": lambda c, f: c.q_out == "provided",
}

# ----------------------------------------------------------------------------- timeline families

# the store-timing families (cases.timelines) whose layers run this op as their prepare step
TIMELINE_FAMILIES = (
    # DeepSeek-V4 MQA, unified ring (seed 000): qk_norm_rope + verify_attention, k = v = the kv row
    Family("dsv4-mqa-ring", "ring", "qk_norm_rope", H=4, Hkv=1, D=64, Dv=64, rope_dim=16,
           causal=True, model_family="generic", verify_store="pre"),
    # the same stack with a q norm weight (the q-side weight path of the prepare)
    Family("dsv4-mqa-ring-qw", "ring", "qk_norm_rope", H=4, Hkv=1, D=64, Dv=64, rope_dim=16,
           causal=True, model_family="generic", verify_store="pre", q_weight=True,
           nightly_with="dsv4-mqa-ring"),
    # DeepSeek-V4 MQA, a unified layer (the ring) over a non-unified one (the paged fp8 SWA cache):
    # the store gate's three branches in one stack (head_dim - rope_dim: one 64-value fp8 tile)
    Family("dsv4-mqa-mixed", "ring", "qk_norm_rope", H=2, Hkv=1, D=128, Dv=128, rope_dim=64,
           causal=True, model_family="generic", verify_store="pre", non_unified_layers=(1,)),
    Family("dsv4-mqa-mixed-qw", "ring", "qk_norm_rope", H=2, Hkv=1, D=128, Dv=128,
           rope_dim=64, causal=True, model_family="generic", verify_store="pre",
           non_unified_layers=(1,), q_weight=True, nightly_with="dsv4-mqa-mixed"),
)
