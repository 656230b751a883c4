"""Cases for ``mla_fp8_prepare`` (seed 001): Kimi-K3 absorbed-MLA shapes, fp8 edge values, pools.

Kimi-K3: kv_lora_rank Dn = 512, rope R = 64 (no RoPE applied: skip_rope), local heads 8…128
after TP; a verify batch has T = B·(L+1) tokens. q_nope arrives as a transposed bmm output
(H, T, Dn) -> (T, H, Dn), q_rope as a slice of the q projection, k_nope / k_rope as slices
of the kv_a output: all strided views with a unit innermost stride.

Values: a random part (``scale``) with a fraction ``specials`` of elements replaced by the
values where fp8 rounding is decided — every code of the format, every tie between adjacent
codes and one bf16 ulp either side, the overflow tie (464 / 248) and its neighbours, ±max,
±inf, NaN of both signs, ±0, subnormal ties, far overflow. For k they are multiplied by
kv_descale first, so with a power-of-two descale the ties survive the scaling.

Pool: slot 0 is reserved (padding slot, never allocated), real tokens get duplicate-free
logical slots in 1..S-1, padding tokens get -1; a ``translated`` pool maps logical slots to a
permutation of the physical rows; ``capture_loc`` says whether the backend filled the
capture-stable physical write location (``decode_kernel_loc``) for target-verify.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cases.base import composite
from cases.timeline_family import Family

if TYPE_CHECKING:  # annotations only: reading the declarations imports no torch (python -m harness list)
    import torch

FP8_FORMATS = ("e4m3fn", "e4m3fnuz")  # the fp8 dtypes by name (reference.mla_fp8_prepare.chain.FP8_DTYPES)
Q_LAYOUTS = ("model", "contiguous", "inner_strided")  # inner_strided: not covered -> fallback
K_LAYOUTS = ("model", "contiguous")
POOLS = ("translated", "identity")
# 0.0 = no kv_descale; powers of two keep ties exact, the others make multiply-vs-divide visible
DESCALES = (0.0, 0.5, 2.0, 0.0625, 0.37, 3.3, 0.002232142857142857)
Q_PROJ_PAD = 128  # q_rope is a slice of a per-head projection this much wider
KV_A_PAD = 96  # k_nope/k_rope are slices of a kv_a row this much wider


@dataclass(frozen=True)
class MlaFp8PrepareCase:
    T: int  # num_tokens
    H: int  # num_heads (local)
    Dn: int = 512  # kv_lora_rank
    R: int = 64  # rope dims (carried, not rotated)
    fp8_format: Literal["e4m3fn", "e4m3fnuz"] = "e4m3fn"
    policy: Literal["saturate", "nan"] = "saturate"  # fp8 overflow policy of the contract
    kv_descale: float = 0.0  # 0.0 = none
    scale: float = 1.0  # magnitude of the random part (300 overflows, 0.01 is mostly subnormal)
    specials: float = 0.25  # fraction of elements replaced by fp8 edge values
    padding: int = 0  # out_cache_loc entries set to -1
    extra_slots: int = 3  # pool rows beyond reserved slot 0 + T
    pool: Literal["translated", "identity"] = "translated"
    capture_loc: bool = True  # decode_kernel_loc filled (unified pool, target-verify)
    save_kv_cache: bool = True  # writes on
    switch: bool = True  # static fused switch
    q_layout: Literal["model", "contiguous", "inner_strided"] = "model"  # inner_strided: not covered -> fallback
    k_layout: Literal["model", "contiguous"] = "model"
    loc_dtype: Literal["int64", "int32"] = "int64"
    seed: int = 0
    name: str = ""


def _verify(name, B, L, H, **kw):
    return MlaFp8PrepareCase(T=B * (L + 1), H=H, name=name, **kw)


def catalog(*, big: bool = False) -> list[MlaFp8PrepareCase]:
    C = MlaFp8PrepareCase
    cases = [
        # Kimi-K3 verify, L = 3 drafts (+1 bonus), every TP-local head count, both formats
        *[_verify(f"k3-verify-b1-l3-h{h}", 1, 3, h, seed=h) for h in (8, 16, 32, 64, 128)],
        *[_verify(f"k3-verify-b1-l3-h{h}-fnuz", 1, 3, h, fp8_format="e4m3fnuz", seed=100 + h) for h in (8, 64)],
        _verify("k3-verify-b4-l3-h16", 4, 3, 16, kv_descale=0.37, seed=1),
        _verify("k3-verify-b8-l4-h8", 8, 4, 8, kv_descale=2.0, seed=2),
        _verify("k3-verify-b4-l3-h16-fnuz", 4, 3, 16, fp8_format="e4m3fnuz", kv_descale=0.37, seed=3),
        # one token; odd token and head counts
        C(T=1, H=8, name="one-token", seed=4),
        C(T=1, H=1, fp8_format="e4m3fnuz", name="one-token-one-head-fnuz", seed=5),
        C(T=7, H=3, name="odd-tokens-odd-heads", seed=6),
        C(T=13, H=5, fp8_format="e4m3fnuz", kv_descale=0.0625, name="odd-tokens-fnuz", seed=7),
        # padding entries (CUDA-graph padded batch), all padding, int32 loc
        C(T=9, H=4, padding=4, name="padding-entries", seed=8),
        C(T=4, H=4, padding=4, name="all-padding", seed=9),
        C(T=9, H=4, padding=2, loc_dtype="int32", fp8_format="e4m3fnuz", name="padding-int32-loc-fnuz", seed=10),
        # pools: permuted slots on an identity pool; translated pools with and without the capture loc
        C(T=11, H=4, pool="identity", extra_slots=20, name="identity-pool-permuted-slots", seed=11),
        C(T=11, H=4, pool="translated", extra_slots=20, name="translated-pool", seed=12),
        C(T=11, H=4, pool="translated", capture_loc=False, name="translated-pool-no-capture-loc", seed=13),
        C(T=6, H=4, pool="translated", extra_slots=0, name="translated-pool-full", seed=14),
        # kv_descale: non-unit scales; powers of two keep the ties
        C(T=8, H=4, kv_descale=0.37, name="descale-0.37", seed=15),
        C(T=8, H=4, kv_descale=3.3, scale=300.0, name="descale-3.3-overflow", seed=16),
        C(T=8, H=4, kv_descale=0.5, specials=1.0, name="descale-pow2-ties", seed=17),
        C(T=8, H=4, kv_descale=0.0625, specials=1.0, fp8_format="e4m3fnuz", name="descale-pow2-ties-fnuz", seed=18),
        # fp8 edge values
        C(T=8, H=4, specials=1.0, name="edge-values-only", seed=19),
        C(T=8, H=4, specials=1.0, fp8_format="e4m3fnuz", name="edge-values-only-fnuz", seed=20),
        C(T=8, H=4, scale=300.0, specials=0.0, name="overflow-heavy", seed=21),
        C(T=8, H=4, scale=300.0, specials=0.0, fp8_format="e4m3fnuz", name="overflow-heavy-fnuz", seed=22),
        C(T=8, H=4, scale=0.01, specials=0.0, name="subnormal-heavy", seed=23),
        C(T=8, H=4, scale=0.01, specials=0.0, fp8_format="e4m3fnuz", name="subnormal-heavy-fnuz", seed=24),
        # the "nan" policy (aten under torch 2.11): the fused kernel saturates, so it refuses these
        C(T=8, H=4, policy="nan", scale=300.0, name="nan-policy-overflow", seed=25),
        C(T=8, H=4, policy="nan", specials=1.0, fp8_format="e4m3fnuz", kv_descale=0.5, name="nan-policy-edges-fnuz",
          seed=26),
        # dispatch branches that must take the fallback (and still write exactly once)
        C(T=5, H=4, save_kv_cache=False, name="writes-off", seed=27),
        C(T=5, H=4, switch=False, name="switch-off", seed=28),
        C(T=5, H=4, q_layout="inner_strided", name="q-inner-strided-not-covered", seed=29),
        # layouts: contiguous inputs; non-power-of-two head dims (tile masks)
        C(T=5, H=4, q_layout="contiguous", k_layout="contiguous", name="contiguous-inputs", seed=30),
        C(T=5, H=3, Dn=100, R=28, name="non-pow2-dims", seed=31),
        # q rows (T·H) and KV rows (T) one past the interpreter's 512-row tile (a multiple of every
        # compiled BLOCK_ROWS too): a second, partial tile on both
        C(T=513, H=1, name="tile-boundary-plus-one", seed=32),
    ]
    if big:
        cases += [
            _verify("k3-verify-b64-l3-h128", 64, 3, 128, kv_descale=0.37, seed=40),
            _verify("k3-verify-b64-l4-h64", 64, 4, 64, seed=41),
            _verify("k3-verify-b64-l4-h64-fnuz", 64, 4, 64, fp8_format="e4m3fnuz", seed=42),
            C(T=1024, H=16, extra_slots=200_000, name="prefill-sized-large-pool", seed=43),
            _verify("k3-verify-b32-l4-h128-translated-no-capture", 32, 4, 128, capture_loc=False, seed=44),
        ]
    return cases


# ----------------------------------------------------------------------------- strategies

# 3 in 4 generated cases take the fused path; each fallback branch gets 1 in 16
DISPATCH = ("fused",) * 12 + ("writes-off", "switch-off", "no-capture-loc", "inner-strided")


@composite
def cases(draw, *, max_tokens: int = 12, max_heads: int = 8, head_dims=((512, 64), (64, 16), (100, 28), (17, 5)),
          formats=FP8_FORMATS, policies=("saturate",) * 3 + ("nan",)):
    """Generated cases, built bottom-up; shrink toward T=1, H=1, the Kimi-K3 dims, e4m3fn,
    saturate, the fused dispatch. ``policies`` repeats an entry to weight it; every region
    tests/test_reach.py lists holds >= 20 % of a profile's cases (no kv_descale, a full pool: 1 in 4)."""
    from hypothesis import strategies as st

    Dn, R = draw(st.sampled_from(head_dims))
    T = draw(st.integers(1, max_tokens))
    H = draw(st.integers(1, max_heads))
    path = draw(st.sampled_from(DISPATCH))
    return MlaFp8PrepareCase(
        T=T, H=H, Dn=Dn, R=R,
        fp8_format=draw(st.sampled_from(formats)),
        policy=draw(st.sampled_from(policies)),
        kv_descale=draw(st.sampled_from(DESCALES[:1] + DESCALES)),
        scale=draw(st.sampled_from((1.0, 30.0, 300.0, 0.01))),
        specials=draw(st.sampled_from((0.25, 0.0, 1.0))),
        padding=draw(st.integers(0, T)),
        extra_slots=0 if draw(st.sampled_from((False, False, False, True))) else draw(st.integers(0, 2 * T)),
        pool=draw(st.sampled_from(POOLS)),
        capture_loc=path != "no-capture-loc",
        save_kv_cache=path != "writes-off",
        switch=path != "switch-off",
        q_layout="inner_strided" if path == "inner-strided" else draw(st.sampled_from(Q_LAYOUTS[:2])),
        k_layout=draw(st.sampled_from(K_LAYOUTS)),
        loc_dtype=draw(st.sampled_from(("int64", "int32"))),
        seed=draw(st.integers(0, 2 ** 16)),
    )


# ----------------------------------------------------------------------------- values

def _bf16_bits(bits: list[int]) -> torch.Tensor:
    import torch

    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def _bf16_neighbours(x: torch.Tensor) -> torch.Tensor:
    """x (bf16, finite, non-negative) and the next bf16 values below and above."""
    import torch

    b = x.view(torch.int16).to(torch.int32)
    return torch.cat([x, (b - 1).clamp(min=0).to(torch.int16).view(torch.bfloat16),
                      (b + 1).to(torch.int16).view(torch.bfloat16)])


def edge_values(fmt: str) -> torch.Tensor:
    """bf16 values (both signs) where fp8 ``fmt`` rounding is decided; every one exactly a bf16."""
    import torch

    from reference.mla_fp8_prepare.encoder import fp8_code_values

    vals = fp8_code_values(fmt)
    pos = vals[:0x80][~torch.isnan(vals[:0x80])].sort().values  # finite non-negative codes
    mids = (pos[1:] + pos[:-1]) / 2  # ties between adjacent codes (incl. subnormal ones)
    fmax = float(pos[-1])
    tie = fmax + (fmax - float(pos[-2])) / 2  # the overflow tie: 464 (fn) / 248 (fnuz)
    extra = torch.tensor([tie, 2 * fmax, 1e4, float(pos[1]) / 4, 1e-30, 3.0e38], dtype=torch.float64)
    mags = torch.cat([pos, mids, extra]).to(torch.bfloat16)
    assert torch.equal(mags.double(), torch.cat([pos, mids, extra.to(torch.bfloat16).double()])), "not bf16-exact"
    mags = _bf16_neighbours(mags)
    special = _bf16_bits([0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x0000, 0x8000])  # +inf -inf +nan -nan +0 -0
    return torch.cat([mags, -mags, special])


def _values(shape, g, *, scale: float, specials: float, edges: torch.Tensor, mul: float) -> torch.Tensor:
    """bf16 tensor: randn·scale with a ``specials`` fraction replaced by ``edges``·mul."""
    import torch

    x = (torch.randn(shape, generator=g) * scale).bfloat16()
    pick = torch.rand(shape, generator=g) < specials
    idx = torch.randint(0, edges.numel(), shape, generator=g)
    # keep NaN bit patterns as built: torch's CPU fp32 -> bf16 turns every NaN into 0xFFFF
    e = torch.where(torch.isnan(edges), edges, (edges.float() * mul).bfloat16())[idx]
    return torch.where(pick, e, x)


def build_inputs(case: MlaFp8PrepareCase, device) -> dict:
    """Keyword arguments of a prepare step, on ``device`` (a harness.devices.Device)."""
    import torch

    from reference.mla_fp8_prepare.chain import FP8_DTYPES

    g = torch.Generator().manual_seed(case.seed)
    T, H, Dn, R = case.T, case.H, case.Dn, case.R
    edges = edge_values(case.fp8_format)
    q = _values((T, H, Dn + R), g, scale=case.scale, specials=case.specials, edges=edges, mul=1.0)
    k = _values((T, Dn + R), g, scale=case.scale, specials=case.specials, edges=edges,
                mul=case.kv_descale or 1.0)
    dev = device.torch_device
    q, k = q.to(dev), k.to(dev)
    if case.q_layout == "model":  # bmm output (H, T, Dn) transposed; q_rope a slice of a wider projection
        q_nope = q[..., :Dn].transpose(0, 1).contiguous().transpose(0, 1)
        proj = torch.zeros(T, H, Q_PROJ_PAD + R, dtype=torch.bfloat16, device=dev)
        proj[..., Q_PROJ_PAD:] = q[..., Dn:]
        q_rope = proj[..., Q_PROJ_PAD:]
    elif case.q_layout == "contiguous":
        q_nope, q_rope = q[..., :Dn].contiguous(), q[..., Dn:].contiguous()
    else:  # inner_strided: every other element of a twice-wide buffer
        wide = torch.zeros(T, H, 2 * (Dn + R), dtype=torch.bfloat16, device=dev)
        wide[..., ::2] = q
        q_nope, q_rope = wide[..., : 2 * Dn : 2], wide[..., 2 * Dn :: 2]
    if case.k_layout == "model":
        kv_a = torch.zeros(T, KV_A_PAD + Dn + R, dtype=torch.bfloat16, device=dev)
        kv_a[:, KV_A_PAD:] = k
        k_nope, k_rope = kv_a[:, KV_A_PAD: KV_A_PAD + Dn], kv_a[:, KV_A_PAD + Dn:]
    else:
        k_nope, k_rope = k[:, :Dn].contiguous(), k[:, Dn:].contiguous()

    S = 1 + T + case.extra_slots  # slot 0 reserved
    loc_dtype = torch.int64 if case.loc_dtype == "int64" else torch.int32
    out_cache_loc = 1 + torch.randperm(S - 1, generator=g)[:T]
    out_cache_loc[torch.randperm(T, generator=g)[: case.padding]] = -1
    slot_map = None
    phys = out_cache_loc
    if case.pool == "translated":
        slot_map = torch.cat([torch.zeros(1, dtype=torch.int64), 1 + torch.randperm(S - 1, generator=g)])
        phys = torch.where(out_cache_loc >= 0, slot_map[out_cache_loc.clamp(min=0)], -1)
    kv_buffer = torch.randint(0, 256, (S, Dn + R), generator=g, dtype=torch.uint8)  # stale bytes: the canary
    return dict(
        q_nope=q_nope, q_rope=q_rope, k_nope=k_nope, k_rope=k_rope,
        kv_buffer=kv_buffer.view(FP8_DTYPES[case.fp8_format]).to(dev),
        out_cache_loc=out_cache_loc.to(loc_dtype).to(dev),
        slot_map=None if slot_map is None else slot_map.to(dev),
        decode_kernel_loc=phys.to(loc_dtype).to(dev) if case.capture_loc else None,
        save_kv_cache=case.save_kv_cache, fused_switch=case.switch,
        kv_descale=case.kv_descale or None, fp8_policy=case.policy,
    )


def expected_path(case: MlaFp8PrepareCase) -> str:
    """Where the dispatch should send the case: "kernel", "fallback" (a gate branch is off), or
    "nan-policy" (the fallback, because the kernel saturates; the fused impl refuses these)."""
    if case.policy != "saturate":
        return "nan-policy"
    on = case.save_kv_cache and case.switch and case.capture_loc and case.q_layout != "inner_strided"
    return "kernel" if on else "fallback"


def case_from_display(display: str) -> MlaFp8PrepareCase:
    """The case behind a report row's ``case`` column (catalog name or full case id)."""
    named = {f"mla_fp8_prepare/{c.name}": c for c in catalog(big=True)}
    if display in named:
        return named[display]
    from cases.base import parse_case

    return parse_case(MlaFp8PrepareCase, display.split(":", 1)[1])


def written_rows(case: MlaFp8PrepareCase, inputs: dict) -> torch.Tensor:
    """Physical rows attention reads for this step's tokens: the only rows that may change."""
    import torch

    if not case.save_kv_cache:
        return torch.empty(0, dtype=torch.long)
    loc = inputs["out_cache_loc"].cpu().long()
    loc = loc[loc >= 0]
    sm = inputs["slot_map"]
    return loc if sm is None else sm.cpu().long()[loc]


# ----------------------------------------------------------------------------- reach (cases.reach)

def _reach_pow2(x: float) -> bool:
    return x > 0 and float(x).hex().startswith("0x1.0000000000000p")


def mla_tile_edge(rows: int) -> bool:
    from_compiled = 4  # fused.mla_fp8_prepare.wrapper.block_config(interpreted=False)[0]
    return rows >= from_compiled - 1 and rows % from_compiled in (from_compiled - 1, 0, 1)


REACH = {
    "e4m3fn": lambda c, f: c.fp8_format == "e4m3fn",
    "e4m3fnuz": lambda c, f: c.fp8_format == "e4m3fnuz",
    "dispatch: kernel": lambda c, f: expected_path(c) == "kernel",
    "dispatch: a gate off (fallback)": lambda c, f: not (c.save_kv_cache and c.switch and c.capture_loc
                                                         and c.q_layout != "inner_strided"),
    "policy nan (fused refuses)": lambda c, f: c.policy == "nan",
    "no kv_descale": lambda c, f: c.kv_descale == 0.0,
    "kv_descale a power of two": lambda c, f: _reach_pow2(c.kv_descale),
    "kv_descale not a power of two": lambda c, f: c.kv_descale != 0.0 and not _reach_pow2(c.kv_descale),
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
    "q rows (T·H) at a compiled tile edge ±1": lambda c, f: mla_tile_edge(c.T * c.H),
    "k rows (T) at a compiled tile edge ±1": lambda c, f: mla_tile_edge(c.T),
}

# ----------------------------------------------------------------------------- timeline families

# the store-timing families (cases.timelines) whose layers run this op as their prepare step
TIMELINE_FAMILIES = (
    # Kimi-K3 absorbed MLA, fp8 KV in a translating paged pool (seed 001): mla_fp8_prepare + MLA attention
    Family("k3-mla-fp8", "paged", "mla_fp8_prepare", H=2, Hkv=1, D=80, Dv=64, rope_dim=16,
           causal=True, model_family="kimi-k3", verify_store="pre", translated=True, kv_descale=2.0),
)
