"""Mutants of spec_sampling: the sampler bugs that keep a plausible acceptance rate and still skew
the emitted distribution. Each is the reference chain with one launch replaced, so
it runs with given uniforms (``exact:``) and with its own (``distribution:``); ``catches`` names
the checks that flag it, ``tests/test_spec_sampling.py`` the catalog cases.
"""
from __future__ import annotations

from harness.registry import Impl

OP = "spec_sampling"


def _chain(*, target_logits, temperature, draft_probs, draft_tokens, uniforms=None, seed=None,
           probs_fn=None, accept_fn=None, weights_fn=None, cdf_fn=None, after_fn=None):
    """The reference chain with launches replaced (None: the chain's own): ``probs_fn``, ``accept_fn``,
    ``cdf_fn`` the chain's ``target_probs``, ``accept_drafts``, ``inverse_cdf``; ``weights_fn(p, q, n) -> (B, V)``
    the sampling weights; ``after_fn(ids, p, n, u) -> ids`` a change to the written ids."""
    from reference.spec_sampling import chain as ref

    probs_fn, accept_fn = probs_fn or ref.target_probs, accept_fn or ref.accept_drafts
    cdf_fn = cdf_fn or ref.inverse_cdf

    B, L, V = ref.validate(target_logits=target_logits, temperature=temperature, draft_probs=draft_probs,
                           draft_tokens=draft_tokens, uniforms=uniforms, seed=seed)
    u = uniforms if uniforms is not None else ref.draw_uniforms(B, L, seed, target_logits.device)
    p = probs_fn(target_logits, temperature)
    px, qx = ref.draft_token_probs(p, draft_probs, draft_tokens)
    n = ref.accept_lengths(accept_fn(u, px, qx))
    if weights_fn is None:
        w = ref.residual_weights(*ref.stop_rows(p, draft_probs, n))
    else:
        w = weights_fn(p, draft_probs, n)
    ids = ref.output_ids(draft_tokens, cdf_fn(w, u[:, -1]), n)
    if after_fn is not None:
        ids = after_fn(ids, p, n, u)
    return {"output_ids": ids, "accept_length": n}


def _residual_from_q(**kw):
    """After a rejection the token is sampled from q_n itself (max(q, 0)), not max(p − q, 0); the bonus
    after a full chain stays p_L (q_L = 0: no weight, so p_L as the reference takes it)."""
    import torch

    from reference.spec_sampling import chain as ref

    def weights(p, q, n):
        pn, qn = ref.stop_rows(p, q, n)
        return torch.where((qn.sum(dim=-1) > 0)[:, None], qn, pn)  # BUG: q_n; row L (q_L = 0): p_L as before
    return _chain(**kw, weights_fn=weights)


def _unnormalised_residual(**kw):
    """The inverse CDF compares the running sum of max(p − q, 0) with u, not u · S: the residual's
    total is taken as 1, so a u past S falls off the end (the last token with weight)."""
    import torch

    def cdf(w, u):
        c = torch.cumsum(w, dim=-1)
        t = (c <= u[:, None]).sum(dim=-1)  # BUG: u, not u * c[:, -1]
        last = w.shape[-1] - 1 - torch.argmax((w.flip(-1) > 0).int(), dim=-1)
        return torch.minimum(t, last)
    return _chain(**kw, cdf_fn=cdf)


def _p_q_swapped(*, target_logits, temperature, draft_probs, **kw):
    """p and q swapped: accepted with min(1, q/p), the residual max(q − p, 0)."""
    from reference.spec_sampling import chain as ref

    def accept(u, px, qx):
        return u[:, :-1] * px < qx  # BUG
    def weights(p, q, n):
        pn, qn = ref.stop_rows(p, q, n)
        return _swap_residual(pn, qn, n, q.shape[1])
    return _chain(target_logits=target_logits, temperature=temperature, draft_probs=draft_probs, **kw,
                  accept_fn=accept, weights_fn=weights)


def _swap_residual(pn, qn, n, L):
    """max(q − p, 0) after a rejection (BUG), p itself at row L (there is no q_L to swap with)."""
    import torch

    w = torch.clamp(qn - pn, min=0)
    w = torch.where((w.sum(-1) > 0)[:, None], w, pn)
    return torch.where((n.long() == L)[:, None], pn, w)


def _bonus_after_rejection(**kw):
    """After a rejection at n < L a bonus token from p_{n+1} is written at n + 1 too (the bonus
    path taken whatever the walk did); the accept length is unchanged."""
    import torch

    from reference.spec_sampling import chain as ref

    def after(ids, p, n, u):
        B, Lp1 = ids.shape
        rows = torch.arange(B, device=ids.device)
        nxt = (n.long() + 1).clamp(max=Lp1 - 1)
        extra = ref.inverse_cdf(p[rows, nxt], u[:, -1]).to(ids.dtype)
        hit = n.long() < Lp1 - 1
        out = ids.clone()
        out[rows[hit], nxt[hit]] = extra[hit]  # BUG
        return out
    return _chain(**kw, after_fn=after)


def _temperature_twice(**kw):
    """The temperature applied twice: softmax(logits / T / T) (once by the sampler's caller, once inside)."""
    from reference.spec_sampling import chain as ref

    def probs(logits, t):
        return ref.target_probs(logits.float() / t[:, None, None], t)  # BUG
    return _chain(**kw, probs_fn=probs)


def _bonus_wrong_row(**kw):
    """After a fully accepted chain the bonus is sampled from row L − 1 (the last draft's row), not row L."""
    import torch

    from reference.spec_sampling import chain as ref

    def weights(p, q, n):
        L = q.shape[1]
        pn, qn = ref.stop_rows(p, q, n)
        rows = torch.arange(p.shape[0], device=p.device)
        full = (n.long() == L)[:, None]
        return torch.where(full, p[rows, L - 1], ref.residual_weights(pn, qn))  # BUG: row L - 1
    return _chain(**kw, weights_fn=weights)


CATCHES = ("exact:output_ids", "distribution:output_ids")
MUTANTS = [
    Impl(OP, "mutant-residual-from-q", "mutant", _residual_from_q,
         doc="after a rejection the token is sampled from q instead of the normalised max(p - q, 0)",
         catches=CATCHES),
    Impl(OP, "mutant-unnormalised-residual", "mutant", _unnormalised_residual,
         doc="inverse CDF over max(p - q, 0) against u instead of u * S (the residual's total taken as 1)",
         catches=CATCHES),
    Impl(OP, "mutant-p-q-swapped", "mutant", _p_q_swapped,
         doc="p and q swapped: accepted with min(1, q/p), residual max(q - p, 0)",
         catches=CATCHES + ("exact:accept_length", "distribution:accept_length")),
    Impl(OP, "mutant-bonus-after-rejection", "mutant", _bonus_after_rejection,
         doc="a bonus token from p_{n+1} written after the residual token of a rejection",
         catches=CATCHES),
    Impl(OP, "mutant-temperature-twice", "mutant", _temperature_twice,
         doc="temperature applied twice: softmax(logits / T^2)",
         catches=CATCHES + ("exact:accept_length", "distribution:accept_length")),
    Impl(OP, "mutant-bonus-wrong-row", "mutant", _bonus_wrong_row,
         doc="bonus after a fully accepted chain sampled from row L - 1 instead of row L",
         catches=CATCHES),
]
