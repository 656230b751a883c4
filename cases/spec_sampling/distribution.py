"""The distributional check of ``spec_sampling`` (``OpSpec.distribution``; the statistics are
``harness.parity.distribution``'s): for implementations that draw their own randomness.

Trials. A distributional case's B requests are repeated, ``case.trials`` times each, over calls of
at most ``MAX_REQUESTS`` requests; every repeat draws its drafts afresh from q (as a drafter does:
the guarantee "emitted tokens follow p" holds for drafts drawn from q, not for fixed ones) and
every call gets its own seed. With p_j, q_j fixed per row and x_j ~ q_j independent, the walk
gives, per request and position j, among the trials that reach j (accept length >= j):

  * the emitted token at j follows p_j exactly (accepted x_j with mass min(p_j, q_j), the residual
    the rest: min(p, q) + (p − min(p, q)) = p; at j = L the bonus is p_L);
  * draft j is accepted with probability α_j = Σ_v min(p_j(v), q_j(v)).

Tests (exact binomial, Bonferroni; ``harness.parity.distribution``):
  * ``distribution:output_ids`` — per (request, position j <= L) the count of each token whose
    expected count N · Π_{k<j} α_k · p_j(v) is at least ``MIN_EXPECTED`` (at most ``MAX_BINS`` of
    them, the most probable), and of all other tokens pooled, each against its share of the
    trials that reached j; and the structure of every trial (drafts before n, a token in [0, V) at
    n, −1 after: any violation fails the record outright — a correct kernel never makes one);
  * ``distribution:accept_length`` — per (request, draft j) the count of trials accepting draft j
    among those reaching it, against α_j.
Each record's family has K tests, each at alpha / K two-sided: a correct implementation fails a
record with probability at most alpha = 1e-6 (``OpSpec.distribution.alpha``), exactly (no
asymptotic approximation). The bins are fixed from p and α before any trial is seen.
"""
from __future__ import annotations

import numpy as np
import torch

from cases.spec_sampling import catalog as c
from harness import compare
from harness.parity import distribution as hd
from reference.spec_sampling import oracle
from reference.spec_sampling.chain import SEED_MAX

MAX_REQUESTS = 1 << 14  # requests per call
MIN_EXPECTED = 5.0  # a token is its own bin when its expected count is at least this
MAX_BINS = 64  # tokens tested one by one per (request, position), the most probable first


def applies(case) -> bool:
    return case.mode == "distribution"


def _tables(case):
    """(logits, temperature, draft_probs) of the case, as build_inputs makes them (same generator)."""
    return c.target_and_draft(case, torch.Generator().manual_seed(case.seed))


def call_seed(case, i: int) -> int:
    """The seed of call ``i`` of a case's trials: distinct per call and per case."""
    return (case.seed * 1_000_003 + i * 7919 + 17) % SEED_MAX


def batches(case, device):
    """The calls of the check: the case's requests repeated (request r·B + b is request b), drafts drawn from q."""
    x, t, q = _tables(case)
    B = case.B
    per_call = max(1, MAX_REQUESTS // B)
    done, i = 0, 0
    dev = device.torch_device
    while done < case.trials:
        r = min(per_call, case.trials - done)
        g = torch.Generator().manual_seed(call_seed(case, i) + 1)
        qr = q.repeat(r, 1, 1)
        d = c.draw_drafts(qr, g)
        yield dict(target_logits=x.repeat(r, 1, 1).to(dev), temperature=t.repeat(r).to(dev), draft_probs=qr.to(dev),
                   draft_tokens=d.to(getattr(torch, case.draft_dtype)).to(dev), uniforms=None, seed=call_seed(case, i))
        done, i = done + r, i + 1


def structure_violations(ids: torch.Tensor, n: torch.Tensor, d: torch.Tensor, V: int) -> tuple[int, str]:
    """(trials whose output is not drafts-then-one-token-then-−1, the first one described)."""
    T, Lp1 = ids.shape
    L = Lp1 - 1
    j = torch.arange(Lp1)[None, :]
    nn = n.long()[:, None]
    body = torch.cat((d.long(), torch.full((T, 1), -2)), dim=1)
    ids = ids.long()
    bad = (n < 0) | (n > L)
    bad = bad | ((j < nn) & (ids != body)).any(dim=1)
    at = ids.gather(1, nn.clamp(0, L))[:, 0]
    bad = bad | (at < 0) | (at >= V)
    bad = bad | ((j > nn) & (ids != -1)).any(dim=1)
    k = int(bad.sum())
    if not k:
        return 0, ""
    i = int(torch.nonzero(bad)[0])
    return k, f"trial {i}: accept_length {int(n[i])}, output_ids {ids[i].tolist()}, drafts {d[i].tolist()}"


def verdict(case, pairs: list, alpha: float) -> list[compare.Record]:
    """The two records (module docstring) from every call's (inputs, outputs)."""
    x, t, q = _tables(case)
    p, acc = oracle.sampling_tables(x, t, q)
    B, L, V = case.B, case.L, case.V
    ids = torch.cat([o["output_ids"] for _, o in pairs]).long()
    n = torch.cat([o["accept_length"] for _, o in pairs]).long()
    d = torch.cat([i["draft_tokens"] for i, _ in pairs]).long()
    req = torch.cat([torch.arange(i["draft_tokens"].shape[0]) % B for i, _ in pairs])
    broken, first = structure_violations(ids, n, d, V)
    # counts[b, j, v]: trials of request b that reached position j and emitted v there; reached[b, j]; accepted[b, j]
    j = torch.arange(L + 1)[None, :]
    hit = n[:, None] >= j  # (T, L + 1)
    key = (req[:, None] * (L + 1) + j) * V + ids.clamp(0, V - 1)
    counts = torch.bincount(key[hit], minlength=B * (L + 1) * V).reshape(B, L + 1, V).numpy()
    reached = torch.zeros(B, L + 1, dtype=torch.long).index_put_((req,), hit.long(), accumulate=True).numpy()
    accepted = torch.zeros(B, L + 1, dtype=torch.long).index_put_((req,), (n[:, None] > j).long(),
                                                                  accumulate=True).numpy()
    per_request = np.bincount(req.numpy(), minlength=B)
    tok_tests, acc_tests = [], []
    for b in range(B):
        reach_p = 1.0
        for jj in range(L + 1):
            m = int(reached[b, jj])
            order = np.argsort(-p[b, jj], kind="stable")[:MAX_BINS]
            own = order[per_request[b] * reach_p * p[b, jj, order] >= MIN_EXPECTED]
            tok_tests += [hd.Test(f"request {b} position {jj} token {v}", int(counts[b, jj, v]), m, float(p[b, jj, v]))
                          for v in own]
            rest = np.ones(V, bool)
            rest[own] = False
            if rest.any():
                tok_tests.append(hd.Test(f"request {b} position {jj} other tokens", int(counts[b, jj, rest].sum()), m,
                                      float(p[b, jj, rest].sum())))
            if jj < L:
                acc_tests.append(hd.Test(f"request {b} draft {jj} accepted", int(accepted[b, jj]), m, float(acc[b, jj])))
                reach_p *= float(acc[b, jj])
    trials = f"{ids.shape[0] // B} trials per request over {len(pairs)} calls"
    tok = hd.binomial_tests("distribution:output_ids", tok_tests, alpha, detail=trials)
    if broken:
        tok = compare.Record(tok.check, False, err=float("inf"), allowed=tok.allowed, worst=first,
                             detail=f"{broken} trials not drafts, one token, then -1; {tok.detail}", extra=tok.extra)
    return [tok, hd.binomial_tests("distribution:accept_length", acc_tests, alpha, detail=trials)]
