"""Cases for ``verify_accept``: greedy chain acceptance over real vocabularies, with the inputs
where an argmax or an acceptance walk is decided.

Shapes: B requests of L drafts (L + 1 target rows each), vocabularies V up to 160K (Qwen3
151,936, Llama-3 128,256, DeepSeek 129,280 / 160K-class); the logits buffer holds B·(L + 1) rows,
as a CUDA graph captured for B requests sizes it, so padding requests (0 rows) leave rows at its
end that nobody may read. ``row_pad`` > 0: the logits are a (N, V) slice of a (N, V + row_pad)
LM-head output (row stride > V).

Values: ``randn``·scale in bf16 (ties at the top are common: bf16 keeps 8 bits), ``coarse``
(round(2·randn)/2: ties everywhere), ``constant`` (every logit equal: the argmax is 0),
``neginf`` (every logit −inf: still 0). ``ties``: the fraction of rows whose maximum is copied to
2–4 random columns (before and after the first one). ``nans``: the fraction of rows given 2–3
NaN of both signs and a +inf (NaN is the maximum: the first NaN wins). Pad columns and the
unread tail rows hold +inf, so a kernel that reads them picks them.

Drafts: per real request an accept length k (``accept``: ``mixed`` draws it in 0..L, ``all`` is
L, ``none`` is 0); drafts 0..k-1 are the target's argmax (the chain's rule), draft k (when k < L)
is a mismatch — with ``tie_drafts`` another index holding the row's maximum (the highest one:
an argmax that breaks ties upward would accept it) when the row has one, else a random other
token — and the drafts after it are random. Padding requests' drafts are −1 (never read).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cases.base import composite

if TYPE_CHECKING:  # annotations only: reading the declarations imports no torch (python -m harness list)
    import torch

ACCEPT = ("mixed", "all", "none")
VALUES = ("randn", "coarse", "constant", "neginf")
INDEX_DTYPES = ("int32", "int64")  # names in torch of the index dtypes a case may ask for
NAN_BITS = (0x7FC0, 0xFFC0, 0x7FA1)  # +NaN, -NaN, a NaN with a payload


@dataclass(frozen=True)
class VerifyAcceptCase:
    B: int  # requests (padding included)
    L: int = 4  # drafts per request
    V: int = 32000  # vocabulary
    row_pad: int = 0  # extra columns per logits row (0: contiguous rows)
    padding: int = 0  # requests with 0 rows
    accept: Literal["mixed", "all", "none"] = "mixed"
    values: Literal["randn", "coarse", "constant", "neginf"] = "randn"
    scale: float = 1.0
    ties: float = 0.0  # fraction of rows with their maximum copied to other columns
    nans: float = 0.0  # fraction of rows with NaNs (and a +inf) planted
    tie_drafts: bool = True  # a mismatching draft is another maximal index when there is one
    draft_dtype: Literal["int32", "int64"] = "int64"
    indptr_dtype: Literal["int32", "int64"] = "int32"
    seed: int = 0
    name: str = ""


def catalog(*, big: bool = False) -> list[VerifyAcceptCase]:
    C = VerifyAcceptCase
    cases = [
        # real vocabularies, a few requests (the interpreter streams them in 4K chunks)
        C(B=2, L=4, V=151936, row_pad=64, ties=0.5, name="qwen3-b2-l4-v151936-strided", seed=1),
        C(B=4, L=4, V=32000, name="llama2-b4-l4-v32000", seed=2),
        C(B=8, L=3, V=8192, ties=0.3, nans=0.1, name="b8-l3-v8192-mixed", seed=3),
        C(B=1, L=4, V=32000, name="one-request", seed=4),
        # L = 1; every draft accepted; none accepted
        C(B=8, L=1, V=4099, ties=0.5, name="l1", seed=5),
        C(B=6, L=4, V=5000, accept="all", ties=0.5, name="all-accepted", seed=6),
        C(B=6, L=4, V=5000, accept="none", ties=0.5, name="none-accepted", seed=7),
        C(B=4, L=7, V=3000, accept="all", name="all-accepted-l7", seed=8),
        # ties: bf16 coarse values, planted copies of the maximum, whole rows equal
        C(B=8, L=4, V=8192, values="coarse", name="ties-coarse", seed=9),
        C(B=8, L=4, V=4096, ties=1.0, name="ties-planted", seed=10),
        C(B=8, L=4, V=6000, ties=1.0, accept="all", name="ties-planted-all-accepted", seed=11),
        C(B=4, L=4, V=2048, values="constant", name="constant-rows", seed=12),
        C(B=4, L=4, V=2048, values="neginf", name="neginf-rows", seed=13),
        # NaN: the maximum, the first one wins (both signs, a payload); +inf beside them
        C(B=8, L=4, V=4096, nans=0.5, name="nan-rows", seed=14),
        C(B=6, L=4, V=4096, nans=1.0, accept="all", name="nan-every-row-all-accepted", seed=15),
        C(B=6, L=4, V=3000, nans=1.0, ties=1.0, name="nan-and-ties", seed=16),
        # V against the tile of fused.verify_accept.wrapper.split_config (the interpreter's 1024, the compiled
        # kernel's 2048): one past, one short (4097 = 4·1024 + 1 = 2·2048 + 1, 8193 = 4·2048 + 1), tiny
        C(B=4, L=4, V=4097, ties=0.5, name="v-block-plus-one", seed=17),
        C(B=4, L=4, V=4095, ties=0.5, name="v-block-minus-one", seed=18),
        C(B=4, L=4, V=8193, row_pad=7, name="v-two-blocks-plus-one-strided", seed=19),  # compiled tile x 4 + 1
        C(B=4, L=4, V=8191, ties=0.5, name="v-compiled-block-minus-one", seed=32),
        C(B=3, L=4, V=1, name="v-one", seed=20),
        C(B=4, L=3, V=17, values="coarse", name="v-17-coarse", seed=21),
        # padding requests (0 rows) among real ones; the unread tail of the logits buffer holds +inf
        C(B=8, L=4, V=4096, padding=3, ties=0.5, name="padding-requests", seed=22),
        C(B=4, L=4, V=4096, padding=3, name="all-padding-but-one", seed=23),
        C(B=3, L=4, V=1024, padding=3, name="all-padding", seed=24),
        # strided rows (an LM head sliced to the vocabulary), pad columns +inf
        C(B=6, L=4, V=5000, row_pad=1000, name="strided-rows", seed=25),
        C(B=6, L=4, V=4096, row_pad=3, ties=1.0, name="strided-rows-ties", seed=26),
        C(B=6, L=4, V=4096, row_pad=128, padding=2, nans=0.3, name="strided-rows-padding-nan", seed=27),
        # index dtypes
        C(B=5, L=4, V=3000, draft_dtype="int32", indptr_dtype="int64", name="int32-drafts-int64-indptr", seed=28),
        C(B=5, L=2, V=3000, draft_dtype="int32", indptr_dtype="int32", ties=0.5, name="int32-everything", seed=29),
        # mismatching drafts random (not tied maxima): the plain reject
        C(B=8, L=4, V=4096, ties=1.0, tie_drafts=False, name="ties-random-rejects", seed=30),
        C(B=8, L=4, V=4096, scale=30.0, name="wide-logits", seed=31),
    ]
    if big:
        cases += [
            C(B=64, L=4, V=160000, ties=0.3, name="b64-l4-v160k", seed=40),
            C(B=64, L=4, V=128256, row_pad=256, nans=0.05, name="b64-l4-v128256-strided", seed=41),
            C(B=32, L=7, V=151936, padding=9, ties=0.5, name="b32-l7-v151936-padding", seed=42),
            C(B=1, L=4, V=160000, accept="all", name="b1-l4-v160k-all", seed=43),
            C(B=64, L=4, V=32000, values="coarse", name="b64-l4-v32000-coarse", seed=44),
        ]
    return cases


# ----------------------------------------------------------------------------- strategies

VOCABS = (1, 2, 17, 100, 1000, 4095, 4096, 4097, 5000, 8193, 32000)


@composite
def cases(draw, *, max_batch: int = 8, max_drafts: int = 6, vocabs=VOCABS):
    """Generated cases; shrink toward B = 1, L = 1, the smallest vocabulary, contiguous rows, no
    padding, mixed acceptance of randn logits."""
    from hypothesis import strategies as st

    # one request and one draft are edges of their own (B 1: the widest split of its rows; a chain of one): drawn
    # three times as often as any other count, so each holds about a third of the draws (REACH)
    B = draw(st.sampled_from((1, 1, *range(1, max_batch + 1))))
    return VerifyAcceptCase(
        B=B, L=draw(st.sampled_from((1, 1, *range(1, max_drafts + 1)))), V=draw(st.sampled_from(vocabs)),
        row_pad=draw(st.sampled_from((0, 0, 3, 128))),
        padding=draw(st.sampled_from((0, 0)) | st.integers(0, B)),  # half the cases without
        accept=draw(st.sampled_from(ACCEPT + ("mixed",) * 3)),
        values=draw(st.sampled_from(("randn",) * 6 + ("coarse",) * 2 + ("constant", "neginf"))),
        scale=draw(st.sampled_from((1.0, 30.0))),
        ties=draw(st.sampled_from((0.0, 0.5, 1.0))),
        nans=draw(st.sampled_from((0.0, 0.0, 0.3))),
        tie_drafts=draw(st.sampled_from((True, True, False))),
        draft_dtype=draw(st.sampled_from(INDEX_DTYPES)),
        indptr_dtype=draw(st.sampled_from(INDEX_DTYPES)),
        seed=draw(st.integers(0, 2 ** 16)),
    )


# ----------------------------------------------------------------------------- inputs

def _bf16(bits: int) -> torch.Tensor:
    import torch

    return torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def _logits(case: VerifyAcceptCase, N: int, g: torch.Generator) -> torch.Tensor:
    """(N, V) bf16 values of the case (before the layout)."""
    import torch

    V = case.V
    if case.values == "constant":
        return torch.full((N, V), 1.5, dtype=torch.bfloat16)
    if case.values == "neginf":
        return torch.full((N, V), float("-inf"), dtype=torch.bfloat16)
    x = torch.randn(N, V, generator=g) * case.scale
    if case.values == "coarse":
        x = (2 * x).round() / 2
    x = x.bfloat16()
    for r in range(N):
        if torch.rand((), generator=g) < case.ties and V > 1:
            cols = torch.randint(0, V, (int(torch.randint(2, 5, (), generator=g)),), generator=g)
            x[r, cols] = x[r].float().max().bfloat16()
        if torch.rand((), generator=g) < case.nans and V > 1:
            cols = torch.randperm(V, generator=g)[:4]
            x[r, cols[-1]] = float("inf")
            for i, c in enumerate(cols[: 2 + int(V > 3)]):
                x[r, c] = _bf16(NAN_BITS[i % len(NAN_BITS)])  # kept as built: no fp32 round trip
    return x


def _mismatch(row: torch.Tensor, t: int, g: torch.Generator, tie_drafts: bool) -> int:
    """A draft token other than ``t`` for a row whose argmax is ``t``: the highest other index that
    ties it (the same maximum, or another NaN) when asked and there is one, else a random one."""
    import torch

    V = row.shape[0]
    if tie_drafts:
        x = row.float()
        same = torch.isnan(x) if torch.isnan(x[t]) else (x == x[t])
        same[t] = False
        if same.any():
            return int(torch.nonzero(same)[-1])
    d = int(torch.randint(0, V - 1, (), generator=g))
    return d + (d >= t)  # uniform over the other V - 1 tokens


def build_inputs(case: VerifyAcceptCase, device) -> dict:
    """Keyword arguments of ``verify_accept`` on ``device`` (a harness.devices.Device)."""
    import torch

    g = torch.Generator().manual_seed(case.seed)
    B, L, V = case.B, case.L, case.V
    N = B * (L + 1)
    real = torch.ones(B, dtype=torch.bool)
    real[torch.randperm(B, generator=g)[: case.padding]] = False
    sizes = real.long() * (L + 1)
    qo = torch.cat((torch.zeros(1, dtype=torch.long), sizes.cumsum(0)))
    x = _logits(case, N, g)
    x[int(qo[-1]):] = float("inf")  # the buffer's tail: never read
    storage = torch.full((N, V + case.row_pad), float("inf"), dtype=torch.bfloat16)
    storage[:, :V] = x
    target = torch.argmax(x, dim=-1)  # the chain's rule, only to craft the drafts
    drafts = torch.full((B, L), -1, dtype=torch.long)
    for b in range(B):
        if not real[b]:
            continue
        k = {"all": L, "none": 0}.get(case.accept)
        if k is None:  # mixed
            k = int(torch.randint(0, L + 1, (), generator=g))
        rows = int(qo[b]) + torch.arange(L + 1)
        drafts[b, :k] = target[rows[:k]]
        if k < L:
            if V == 1:  # no other token: the one draft there is, accepted
                drafts[b, k:] = 0
                continue
            drafts[b, k] = _mismatch(x[rows[k]], int(target[rows[k]]), g, case.tie_drafts)
            drafts[b, k + 1:] = torch.randint(0, V, (L - k - 1,), generator=g)
    dev = device.torch_device
    return dict(target_logits=storage.to(dev)[:, :V],
                draft_tokens=drafts.flatten().to(getattr(torch, case.draft_dtype)).to(dev),
                qo_indptr=qo.to(getattr(torch, case.indptr_dtype)).to(dev))


def case_from_display(display: str) -> VerifyAcceptCase:
    """The case behind a report row's ``case`` column (catalog name or full case id)."""
    named = {f"verify_accept/{c.name}": c for c in catalog(big=True)}
    if display in named:
        return named[display]
    from cases.base import parse_case

    return parse_case(VerifyAcceptCase, display.split(":", 1)[1])


# Regions of the case space the generated cases must each reach (cases/reach.py: a fifth of the ci
# profile's draws, tests/test_reach.py): acceptance patterns, vocab sizes on and across a chunk of the
# kernels (4096 interpreted, 8192 compiled), the value regimes where argmax is delicate, padding and
# row strides, both index dtypes
REACH = {
    "accept: mixed": lambda c, f: c.accept == "mixed",
    "accept: all or none": lambda c, f: c.accept in ("all", "none"),
    "one draft (L 1)": lambda c, f: c.L == 1,
    "several drafts (L >= 3)": lambda c, f: c.L >= 3,
    "one request": lambda c, f: c.B == 1,
    "several requests (B >= 4)": lambda c, f: c.B >= 4,
    "V under one chunk (< 4096)": lambda c, f: c.V < 4096,
    "V over one chunk (> 4096)": lambda c, f: c.V > 4096,
    "V not a multiple of 8": lambda c, f: c.V % 8 != 0,
    "tied logits": lambda c, f: c.ties > 0,
    "NaN logits": lambda c, f: c.nans > 0,
    "values not randn": lambda c, f: c.values != "randn",
    "padding entries": lambda c, f: c.padding > 0,
    "padded rows (row stride > V)": lambda c, f: c.row_pad > 0,
    "int32 drafts": lambda c, f: c.draft_dtype == "int32",
    "int64 drafts": lambda c, f: c.draft_dtype == "int64",
    "int32 indptr": lambda c, f: c.indptr_dtype == "int32",
    "int64 indptr": lambda c, f: c.indptr_dtype == "int64",
}
