"""Cases for ``spec_sampling``: chain speculative sampling at temperature > 0, with the inputs where
an acceptance test or a residual sample is decided.

Shapes: B requests of L drafts (L + 1 target rows each, dense: (B, L + 1, V)), vocabularies up to
Qwen3's 151,936 (Llama-2 32,000, Llama-3 128,256), EAGLE/MTP chain lengths 1–7.

Target logits: ``randn``·``scale`` (scale 3 is an LLM's peaked row, 0.5 a flat one), in fp32 or
bf16; ``topk`` > 0 keeps each row's k largest and masks the rest to −inf (a top-k sampler ahead of
verify); ``row_pad`` > 0: a slice of a wider buffer (row stride V + row_pad). Temperature: the
case's ``temperature`` for every request, or with ``temp_spread`` one per request in [0.3, 1.5].

Draft probabilities q (``draft``): ``near`` = softmax((target logits + noise)/T), a good drafter
(high acceptance); ``far`` = an unrelated softmax (frequent rejections); ``equal`` = p itself in
fp32 (every draft accepted: the bonus row); ``onehot`` = a greedy drafter's q(x) = 1 (accepted
with probability p(x); the residual is p without x); ``sparse`` = ``near`` cut to its 4 largest
entries (a top-k drafter: q = 0 almost everywhere). Drafts are drawn from q, as a drafter does.

Randomness (``mode``): ``exact`` cases give the uniforms (B, L + 1), drawn and then moved at least
1e-4 away from every decision boundary of the fp64 walk (``clear_of_boundaries``: u_j from p/q,
u_L to the middle of its token's CDF interval when that interval is narrower than ``MARGIN`` · S),
so implementations that round differently still decide alike; ``distribution`` cases give none
(the implementation draws its own from ``seed``) and the distributional check runs ``trials``
trials of each request (``cases/spec_sampling/distribution.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cases.base import composite

if TYPE_CHECKING:  # annotations only: reading the declarations imports no torch (python -m harness list)
    import numpy as np
    import torch

DRAFTS = ("near", "far", "equal", "onehot", "sparse")
MODES = ("exact", "distribution")
INDEX_DTYPES = ("int32", "int64")  # names in torch of the index dtypes a case may ask for
LOGIT_DTYPES = ("float32", "bfloat16")  # names in torch
MARGIN = 1e-4  # every uniform this far (relative) from a decision boundary of the fp64 walk


@dataclass(frozen=True)
class SpecSamplingCase:
    B: int  # requests
    L: int = 4  # drafts per request
    V: int = 32000  # vocabulary
    temperature: float = 0.7
    temp_spread: bool = False  # one temperature per request in [0.3, 1.5]
    scale: float = 3.0  # target logits' standard deviation
    draft: Literal["near", "far", "equal", "onehot", "sparse"] = "near"
    topk: int = 0  # > 0: target rows masked to their k largest logits
    row_pad: int = 0  # extra columns per target row (0: contiguous)
    logit_dtype: Literal["float32", "bfloat16"] = "float32"
    draft_dtype: Literal["int32", "int64"] = "int64"
    mode: Literal["exact", "distribution"] = "exact"
    trials: int = 0  # distribution: trials per request
    seed: int = 0
    name: str = ""


def catalog(*, big: bool = False) -> list[SpecSamplingCase]:
    C = SpecSamplingCase
    cases = [
        # real vocabularies and chain lengths (EAGLE chains of 3–7 drafts, MTP of 1–2)
        C(B=2, L=4, V=151936, row_pad=64, name="qwen3-b2-l4-v151936-strided", seed=1),
        C(B=4, L=4, V=32000, name="llama2-b4-l4-v32000", seed=2),
        C(B=3, L=3, V=128256, logit_dtype="bfloat16", name="llama3-b3-l3-v128256-bf16", seed=3),
        C(B=8, L=1, V=4099, name="mtp-l1", seed=4),
        C(B=4, L=7, V=3000, name="eagle-l7", seed=5),
        # the drafter's q: far (rejections), equal (bonus row always), one-hot, sparse
        C(B=8, L=4, V=5000, draft="far", scale=1.0, name="far-drafts", seed=6),
        C(B=6, L=4, V=5000, draft="equal", name="equal-drafts-all-accepted", seed=7),
        C(B=8, L=4, V=4096, draft="onehot", name="onehot-drafts", seed=8),
        C(B=8, L=4, V=4096, draft="sparse", name="sparse-drafts", seed=9),
        # temperature: per request, low, high; flat and masked (top-k) target rows
        C(B=8, L=3, V=4096, temp_spread=True, name="temperature-per-request", seed=10),
        C(B=6, L=4, V=2048, temperature=0.3, draft="far", name="low-temperature", seed=11),
        C(B=6, L=4, V=2048, temperature=1.5, scale=1.0, name="high-temperature-flat", seed=12),
        C(B=6, L=4, V=3000, topk=20, name="topk-masked-targets", seed=13),
        # V against the chunk (4096): one past, one short, tiny; index dtypes
        C(B=4, L=4, V=4097, draft="far", name="v-block-plus-one", seed=14),
        C(B=4, L=4, V=4095, name="v-block-minus-one", seed=15),
        C(B=3, L=2, V=1, name="v-one", seed=16),
        C(B=5, L=3, V=17, draft="far", draft_dtype="int32", name="v-17-int32-drafts", seed=17),
        C(B=1, L=4, V=32000, draft="far", name="one-request", seed=18),
        # distributional: the implementation's own randomness, many trials of small vocabularies
        # (every named mutant's skew is a share of a few bins: docs/spec_sampling.md states the power)
        C(B=2, L=3, V=8, temperature=0.8, scale=1.5, draft="far", mode="distribution", trials=20000,
          name="dist-far-v8", seed=20),
        C(B=2, L=2, V=16, temperature=0.6, scale=1.0, draft="near", mode="distribution", trials=20000,
          name="dist-near-v16", seed=21),
        C(B=2, L=3, V=8, temperature=1.3, scale=1.0, draft="onehot", mode="distribution", trials=20000,
          name="dist-onehot-v8", seed=22),
    ]
    if big:
        cases += [
            C(B=64, L=4, V=151936, name="b64-l4-v151936", seed=40),
            C(B=32, L=7, V=128256, draft="far", logit_dtype="bfloat16", name="b32-l7-v128256-bf16", seed=41),
        ]
    return cases


# ----------------------------------------------------------------------------- strategies

VOCABS = (1, 2, 17, 100, 1000, 4095, 4096, 4097, 5000)


@composite
def cases(draw, *, max_batch: int = 6, max_drafts: int = 5, vocabs=VOCABS):
    """Generated exact-mode cases; shrink toward B = 1, L = 1, the smallest vocabulary, near drafts."""
    from hypothesis import strategies as st

    return SpecSamplingCase(
        B=draw(st.sampled_from((1, 1, *range(1, max_batch + 1)))),
        L=draw(st.sampled_from((1, 1, *range(1, max_drafts + 1)))),
        V=draw(st.sampled_from(vocabs)),
        temperature=draw(st.sampled_from((0.7, 0.3, 1.0, 1.5))),
        temp_spread=draw(st.booleans()),
        scale=draw(st.sampled_from((3.0, 1.0, 0.5))),
        draft=draw(st.sampled_from(DRAFTS)),
        topk=draw(st.sampled_from((0, 0, 5))),
        row_pad=draw(st.sampled_from((0, 0, 3))),
        logit_dtype=draw(st.sampled_from(LOGIT_DTYPES)),
        draft_dtype=draw(st.sampled_from(INDEX_DTYPES)),
        seed=draw(st.integers(0, 2 ** 16)),
    )


# ----------------------------------------------------------------------------- inputs

def temperatures(case: SpecSamplingCase, g: torch.Generator) -> torch.Tensor:
    """(B,) fp32."""
    import torch

    if case.temp_spread:
        return (0.3 + 1.2 * torch.rand(case.B, generator=g)).float()
    return torch.full((case.B,), case.temperature, dtype=torch.float32)


def target_and_draft(case: SpecSamplingCase, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits (B, L + 1, V) in the case's dtype, temperature (B,), draft_probs (B, L, V) fp32)."""
    import torch

    B, L, V = case.B, case.L, case.V
    x = (torch.randn(B, L + 1, V, generator=g) * case.scale).to(getattr(torch, case.logit_dtype))
    if 0 < case.topk < V:
        kth = x.float().topk(case.topk, dim=-1).values[..., -1:]
        x = x.masked_fill(x.float() < kth, float("-inf"))
    t = temperatures(case, g)
    p = torch.softmax(x.float() / t[:, None, None], dim=-1)[:, :L]
    if case.draft == "equal":
        q = p.clone()
    elif case.draft == "far":
        q = torch.softmax(torch.randn(B, L, V, generator=g) * case.scale / t[:, None, None], dim=-1)
    else:
        noisy = x.float()[:, :L].clamp(min=-1e4) + 0.5 * torch.randn(B, L, V, generator=g)
        q = torch.softmax(noisy / t[:, None, None], dim=-1)
        if case.draft == "sparse" and V > 4:
            kth = q.topk(4, dim=-1).values[..., -1:]
            q = torch.where(q >= kth, q, 0.0)
            q = q / q.sum(dim=-1, keepdim=True)
        elif case.draft == "onehot":
            q = torch.nn.functional.one_hot(torch.multinomial(q.reshape(-1, V), 1, generator=g)[:, 0], V)
            q = q.reshape(B, L, V).float()
    return x, t, q.contiguous()


def draw_drafts(q: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """(B, L) int64 drafts drawn from q (B, L, V), as the drafter drew them."""
    import torch

    B, L, V = q.shape
    return torch.multinomial(q.reshape(-1, V).double(), 1, generator=g).reshape(B, L)


def clear_of_boundaries(u: np.ndarray, p: np.ndarray, q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The uniforms moved at least ``MARGIN`` (relative) from every boundary of the fp64 walk: u_j
    off p_j(x_j)/q_j(x_j); u_L to the middle of its token's CDF interval when that interval is
    narrower than ``3 · MARGIN`` of the total, or to the widest interval's middle."""
    import numpy as np

    u = u.copy()
    B, L = d.shape
    for b in range(B):
        k = 0
        while k < L:
            r = p[b, k, d[b, k]] / q[b, k, d[b, k]]
            if abs(u[b, k] - r) < MARGIN * max(1.0, r):
                u[b, k] = r - 2 * MARGIN if r - 2 * MARGIN >= 0 else r + 2 * MARGIN
            if not u[b, k] * q[b, k, d[b, k]] < p[b, k, d[b, k]]:
                break
            k += 1
        w = np.maximum(p[b, k] - (q[b, k] if k < L else 0.0), 0.0)
        if w.sum() <= 0:
            w = p[b, k]
        c = np.cumsum(w)
        S = c[-1]
        t = int(np.searchsorted(c, u[b, L] * S, side="right"))
        t = min(t, int(np.nonzero(w > 0)[0][-1]))
        lo = c[t - 1] if t else 0.0
        if w[t] < 3 * MARGIN * S or min(u[b, L] * S - lo, c[t] - u[b, L] * S) < MARGIN * S:
            if w[t] < 3 * MARGIN * S:
                t = int(np.argmax(w))
                lo = c[t - 1] if t else 0.0
            u[b, L] = (lo + c[t]) / 2 / S
    return np.clip(u, 0.0, np.nextafter(np.float32(1), np.float32(0)))


def build_inputs(case: SpecSamplingCase, device) -> dict:
    """Keyword arguments of ``spec_sampling`` on ``device`` (a harness.devices.Device)."""
    import torch

    from reference.spec_sampling import oracle

    g = torch.Generator().manual_seed(case.seed)
    B, L, V = case.B, case.L, case.V
    x, t, q = target_and_draft(case, g)
    d = draw_drafts(q, g)
    storage = torch.full((B, L + 1, V + case.row_pad), float("nan"), dtype=x.dtype)  # pad columns: never read
    storage[..., :V] = x
    dev = device.torch_device
    kw = dict(target_logits=storage.to(dev)[..., :V], temperature=t.to(dev), draft_probs=q.to(dev),
              draft_tokens=d.to(getattr(torch, case.draft_dtype)).to(dev))
    if case.mode == "distribution":
        return {**kw, "uniforms": None, "seed": case.seed}
    p64, _ = oracle.sampling_tables(x, t, q)
    u = torch.rand(B, L + 1, generator=g).double().numpy()
    u = clear_of_boundaries(u, p64, q.double().numpy(), d.numpy())
    return {**kw, "uniforms": torch.from_numpy(u).float().to(dev), "seed": None}


def case_from_display(display: str) -> SpecSamplingCase:
    """The case behind a report row's ``case`` column (catalog name or full case id)."""
    named = {f"spec_sampling/{c.name}": c for c in catalog(big=True)}
    if display in named:
        return named[display]
    from cases.base import parse_case

    return parse_case(SpecSamplingCase, display.split(":", 1)[1])


# Regions of the case space the generated cases must each reach (cases/reach.py, tests/test_reach.py)
REACH = {
    "one draft (L 1)": lambda c, f: c.L == 1,
    "several drafts (L >= 3)": lambda c, f: c.L >= 3,
    "one request": lambda c, f: c.B == 1,
    "several requests (B >= 4)": lambda c, f: c.B >= 4,
    "V under one chunk (< 4096)": lambda c, f: c.V < 4096,
    "V over one chunk (> 4096)": lambda c, f: c.V > 4096,
    "drafts near the target": lambda c, f: c.draft in ("near", "equal"),
    "drafts far or one-hot or sparse": lambda c, f: c.draft in ("far", "onehot", "sparse"),
    "temperature per request": lambda c, f: c.temp_spread,
    "masked target rows": lambda c, f: c.topk > 0,
    "bf16 logits": lambda c, f: c.logit_dtype == "bfloat16",
    "int32 drafts": lambda c, f: c.draft_dtype == "int32",
}
