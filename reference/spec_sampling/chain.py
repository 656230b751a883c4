"""Chain speculative sampling (temperature > 0) after the target forward — the unfused reference chain.

A verify batch holds B requests, each with L drafts ``draft_tokens[b]`` drawn by the drafter from
its distributions ``draft_probs[b, j]`` (row j: the drafter's distribution of draft j), and L + 1
target rows ``target_logits[b, j]`` (row j: the target's logits after the prefix and drafts
0..j-1; row L: after the last draft). The target distribution of row j is
``p_j = softmax(target_logits[b, j] / temperature[b])``; ``q_j = draft_probs[b, j]`` (q of row L is
taken as all zeros). The rule (Leviathan et al. 2023, Chen et al. 2023) keeps every emitted token
distributed exactly as p:

  * draft j is accepted with probability min(1, p_j(x_j) / q_j(x_j)); the walk stops at the first
    rejected draft, n = the drafts accepted before it (0..L);
  * at row n one token is sampled from the normalised residual max(p_n − q_n, 0) — which is p_L
    itself at n = L (q_L = 0): the *bonus* token after a fully accepted chain.

The randomness (``uniforms`` (B, L + 1) fp32 in [0, 1), when given) is consumed exactly so:
  * draft j (j < L) is accepted iff ``uniforms[b, j] · q_j(x_j) < p_j(x_j)``;
  * the one sampled token is the inverse CDF of ``uniforms[b, L]`` over the weights w = max(p_n − q_n, 0)
    (w = p_n when every weight is 0, which only rounding can make): the smallest index i whose
    running sum C_i = w_0 + … + w_i exceeds ``uniforms[b, L] · S`` with S = C_{V−1}; when rounding
    leaves none, the last index with w_i > 0.
So the same uniforms give the same accepted length and tokens on every implementation, as long
as no uniform lies within rounding of a decision boundary (``cases/spec_sampling/catalog.py`` builds
its uniforms at least 1e-4 away from every one; the contract then is exact). Without ``uniforms``
an implementation draws its own: this chain from ``torch.Generator`` seeded with ``seed``; only the
distribution of its outputs is then the contract (``cases/spec_sampling/distribution.py``).

Launches of the chain (one op each):
  1. ``target_probs``      p = softmax(target_logits.float() / temperature)         (B, L + 1, V) fp32
  2. ``draft_token_probs`` p_j(x_j), q_j(x_j)                                      (B, L) fp32 each
  3. ``accept_drafts``     accept[b, j] = u[b, j] · q_j(x_j) < p_j(x_j)            (B, L) bool
  4. ``accept_lengths``    n[b] = sum_j cumprod(accept[b])[j]                      (B,) int32 in [0, L]
  5. ``residual_weights``  w[b] = max(p_n − q_n, 0) (q_L = 0; w = p_n if all 0)     (B, V) fp32
  6. ``inverse_cdf``       token[b] from u[b, L] over w[b] (above)                 (B,) int64
  7. ``output_ids``        drafts j < n, the sampled token at n, −1 after          (B, L + 1) int32

Contract: exact where the uniforms are inputs (``output_ids``, ``accept_length``); distributional
where an implementation draws its own (``docs/spec_sampling.md``).
"""
from __future__ import annotations

import numbers

import torch

from reference.checks import (
    INDEX_DTYPES,
    DTypeError,
    RangeError,
    ShapeError,
    UnsupportedError,
    check_contiguous,
    check_dtype,
    check_index,
    check_inner_contiguous,
    check_rank,
    check_same_device,
    check_shape,
)

LOGIT_DTYPES = (torch.float32, torch.bfloat16)
PROB_DTYPES = (torch.float32,)
OUT_DTYPE = torch.int32
PAD_ID = -1
SEED_MAX = 2 ** 31 - 1


# ----------------------------------------------------------------------------- validation

def validate_tensors(*, target_logits, temperature, draft_probs, draft_tokens, uniforms=None, seed=None
                     ) -> tuple[int, int, int]:
    """Ranks, dtypes, layouts, devices and the shapes that tie the inputs together; reads no
    values (no device sync). Returns (B, L, V).

    Shapes: target_logits (B, L + 1, V) fp32/bf16, unit innermost stride; temperature (B,) fp32
    contiguous; draft_probs (B, L, V) fp32, unit innermost stride; draft_tokens (B, L) int32/int64
    contiguous, L >= 1; uniforms (B, L + 1) fp32 contiguous or None; seed an int in [0, 2**31 − 1]
    or None (only without uniforms).
    """
    check_rank("target_logits", target_logits, 3)
    check_dtype("target_logits", target_logits, LOGIT_DTYPES)
    check_inner_contiguous("target_logits", target_logits)
    B, Lp1, V = target_logits.shape
    if B < 1 or Lp1 < 2 or V < 1:
        raise ShapeError("target_logits", f"expected (B >= 1, L + 1 >= 2, V >= 1), got {tuple(target_logits.shape)}")
    L = Lp1 - 1
    check_shape("draft_probs", draft_probs, (B, L, V))
    check_dtype("draft_probs", draft_probs, PROB_DTYPES)
    check_inner_contiguous("draft_probs", draft_probs)
    check_index("draft_tokens", draft_tokens, (B, L), INDEX_DTYPES)
    check_shape("temperature", temperature, (B,))
    check_dtype("temperature", temperature, PROB_DTYPES)
    check_contiguous("temperature", temperature)
    if uniforms is not None:
        check_shape("uniforms", uniforms, (B, L + 1))
        check_dtype("uniforms", uniforms, PROB_DTYPES)
        check_contiguous("uniforms", uniforms)
        if seed is not None:
            raise UnsupportedError("seed", "give uniforms or a seed, not both (the uniforms are the randomness)")
    elif seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise DTypeError("seed", f"must be an int, got {type(seed).__name__} {seed!r}")
        if not 0 <= int(seed) <= SEED_MAX:
            raise RangeError("seed", f"must lie in [0, {SEED_MAX}], got {seed}")
    check_same_device(target_logits=target_logits, temperature=temperature, draft_probs=draft_probs,
                      draft_tokens=draft_tokens, uniforms=uniforms)
    return B, L, V


def validate(*, target_logits, temperature, draft_probs, draft_tokens, uniforms=None, seed=None,
             check_values: bool = True) -> tuple[int, int, int]:
    """``validate_tensors``, then the values (one host sync, only with ``check_values``): drafts in
    [0, V); temperature finite and > 0; draft_probs finite and >= 0; target_logits neither NaN nor
    +inf, every row with a finite maximum (−inf entries are masked tokens); uniforms in [0, 1).
    Returns (B, L, V)."""
    B, L, V = validate_tensors(target_logits=target_logits, temperature=temperature, draft_probs=draft_probs,
                               draft_tokens=draft_tokens, uniforms=uniforms, seed=seed)
    if not check_values or (target_logits.is_cuda and torch.cuda.is_current_stream_capturing()):
        return B, L, V
    d = draft_tokens.long()
    x = target_logits.float()
    flags = [d.min(), d.max(), temperature.min(), (~torch.isfinite(temperature)).any(),
             (~torch.isfinite(draft_probs)).any(), (draft_probs < 0).any(),
             (torch.isnan(x) | torch.isposinf(x)).any(), torch.isneginf(x).all(dim=-1).any()]
    if uniforms is not None:
        flags += [(~((uniforms >= 0) & (uniforms < 1))).any()]
    got = torch.stack([f.double() for f in flags]).tolist()  # the one sync
    lo, hi, tmin, tbad, qbad, qneg, xbad, xrow = got[:8]
    if lo < 0 or hi >= V:
        raise RangeError("draft_tokens", f"entry {int(lo if lo < 0 else hi)} outside [0, {V}) (V = vocabulary)")
    if tbad or tmin <= 0:
        raise RangeError("temperature", f"must be finite and > 0 (temperature 0 is greedy: verify_accept), "
                                        f"got min {tmin}")
    if qbad or qneg:
        raise RangeError("draft_probs", "must be finite and >= 0" + (" (has NaN/inf)" if qbad else " (has < 0)"))
    if xbad:
        raise RangeError("target_logits", "has NaN or +inf")
    if xrow:
        raise RangeError("target_logits", "a row is all -inf: no token has target probability")
    if uniforms is not None and got[8]:
        raise RangeError("uniforms", "must lie in [0, 1)")
    return B, L, V


# ----------------------------------------------------------------------------- the chain

def target_probs(target_logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Launch 1. (B, L + 1, V) logits, (B,) temperature -> (B, L + 1, V) fp32 probabilities."""
    return torch.softmax(target_logits.float() / temperature[:, None, None], dim=-1)


def draft_token_probs(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch 2. p (B, L + 1, V), q (B, L, V), drafts (B, L) -> (p_j(x_j), q_j(x_j)), (B, L) fp32 each."""
    idx = drafts.long()[..., None]
    return p[:, :-1].gather(-1, idx)[..., 0], q.gather(-1, idx)[..., 0]


def accept_drafts(u: torch.Tensor, px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
    """Launch 3. (B, L + 1) uniforms -> (B, L) bool: u_j · q_j(x_j) < p_j(x_j)."""
    return u[:, :-1] * qx < px


def accept_lengths(accept: torch.Tensor) -> torch.Tensor:
    """Launch 4. (B, L) bool -> (B,) int32: the drafts before the first rejection."""
    return torch.cumprod(accept.int(), dim=1).sum(dim=1).to(OUT_DTYPE)


def stop_rows(p: torch.Tensor, q: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_n, q_n), (B, V) each: the rows where the walk stopped; q_L = 0."""
    rows = torch.arange(p.shape[0], device=p.device)
    q0 = torch.cat((q, q.new_zeros(q.shape[0], 1, q.shape[2])), dim=1)  # (B, L + 1, V): q_L = 0
    return p[rows, n.long()], q0[rows, n.long()]


def residual_weights(pn: torch.Tensor, qn: torch.Tensor) -> torch.Tensor:
    """Launch 5. (B, V) each -> (B, V) fp32: max(p_n − q_n, 0); p_n where that is all 0."""
    w = torch.clamp(pn - qn, min=0)
    return torch.where((w.sum(dim=-1) > 0)[:, None], w, pn)


def inverse_cdf(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Launch 6. (B, V) weights >= 0, (B,) uniforms -> (B,) int64: the smallest i with C_i > u · C_{V−1}
    (C the running sum); when rounding leaves none, the last i with w_i > 0."""
    c = torch.cumsum(w, dim=-1)
    t = (c <= (u * c[:, -1])[:, None]).sum(dim=-1)  # C is non-decreasing: the count below is the index
    V = w.shape[-1]
    last = V - 1 - torch.argmax((w.flip(-1) > 0).int(), dim=-1)
    return torch.minimum(t, last)


def output_ids(drafts: torch.Tensor, token: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Launch 7. -> (B, L + 1) int32: drafts j < n, the sampled token at n, −1 after."""
    B, L = drafts.shape
    j = torch.arange(L + 1, device=drafts.device)[None, :]
    nn = n.long()[:, None]
    body = torch.cat((drafts.long(), drafts.new_full((B, 1), PAD_ID).long()), dim=1)
    out = torch.where(j < nn, body, torch.where(j == nn, token[:, None], torch.full_like(body, PAD_ID)))
    return out.to(OUT_DTYPE)


def draw_uniforms(B: int, L: int, seed, device) -> torch.Tensor:
    """(B, L + 1) fp32 in [0, 1): the chain's own randomness without ``uniforms``, from a
    ``torch.Generator`` on ``device`` seeded with ``seed`` (None: a seed from torch's global generator)."""
    if seed is None:
        seed = int(torch.randint(0, SEED_MAX, ()))
    g = torch.Generator(device=device).manual_seed(int(seed))
    return torch.rand((B, L + 1), generator=g, device=device)


def sample_chain(p, q, drafts, u):
    """Launches 2–7 on probabilities p (B, L + 1, V) and uniforms u (B, L + 1): (output_ids, accept_length)."""
    px, qx = draft_token_probs(p, q, drafts)
    n = accept_lengths(accept_drafts(u, px, qx))
    pn, qn = stop_rows(p, q, n)
    token = inverse_cdf(residual_weights(pn, qn), u[:, -1])
    return output_ids(drafts, token, n), n


def spec_sampling(*, target_logits, temperature, draft_probs, draft_tokens, uniforms=None, seed=None):
    """The seven-launch reference chain. Returns {"output_ids": (B, L + 1) int32, "accept_length": (B,) int32}."""
    B, L, V = validate(target_logits=target_logits, temperature=temperature, draft_probs=draft_probs,
                       draft_tokens=draft_tokens, uniforms=uniforms, seed=seed)
    u = uniforms if uniforms is not None else draw_uniforms(B, L, seed, target_logits.device)
    out, n = sample_chain(target_probs(target_logits, temperature), draft_probs, draft_tokens, u)
    return {"output_ids": out, "accept_length": n}
