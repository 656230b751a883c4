"""Mutants of verify_accept: the acceptance bugs a greedy verify can ship, and the argmax bugs
that only ties and strided rows show.

Two are the real fused kernel with one planted change (what it is told, or the order it sees);
two are the reference chain with one launch replaced (the acceptance walk lives in a few integer
ops, so the chain is where such a bug would be written). ``catches`` names the checks that flag
each; ``tests/test_verify_accept.py`` names the catalog case that shows it and the one that hides it.
"""
from __future__ import annotations

from harness.registry import Impl

OP = "verify_accept"


def _fused():
    from fused.verify_accept import wrapper as f

    return f


def _chain(*, target_logits, draft_tokens, qo_indptr, accept_fn=None, bonus_fn=None):
    """The reference chain with ``accept_fn`` / ``bonus_fn`` in place of its ``accept_lengths`` /
    ``bonus_tokens`` (None: the chain's own)."""
    from reference.verify_accept import chain as ref

    accept_fn, bonus_fn = accept_fn or ref.accept_lengths, bonus_fn or ref.bonus_tokens

    B, L, _ = ref.validate(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr)
    rows, real = ref.request_rows(qo_indptr, L)
    target = ref.gather_targets(ref.row_argmax(target_logits), rows, real)
    drafts = draft_tokens.view(B, L)
    n = accept_fn(ref.match(target, drafts), real)
    return {"output_ids": ref.output_ids(drafts, bonus_fn(target, n), n, real), "accept_length": n}


def _accepts_first_mismatch(**kw):
    """The accept length counts the first mismatching draft too (``cumprod`` of the match shifted
    by one: an off-by-one in the walk); the rejected draft lands in the output, the bonus comes
    from the row after it."""
    import torch

    from reference.verify_accept import chain as ref

    def accept(matched, real):
        shifted = torch.cat((torch.ones_like(matched[:, :1]), matched[:, :-1]), dim=1)  # BUG: match[j-1] gates j
        n = torch.cumprod(shifted.int(), dim=1).sum(dim=1)
        return torch.where(real, n, torch.zeros_like(n)).to(ref.OUT_DTYPE)

    return _chain(**kw, accept_fn=accept)


def _bonus_wrong_row(**kw):
    """The bonus token read one row too late: the target's argmax after the mismatching draft
    (a prediction conditioned on a token that was rejected) — or past the last row, clamped."""
    def bonus(target, n):
        row = (n.long() + 1).clamp(max=target.shape[1] - 1)  # BUG: n, not n + 1
        return target.gather(1, row[:, None])[:, 0]

    return _chain(**kw, bonus_fn=bonus)


def _ties_to_highest(*, target_logits, draft_tokens, qo_indptr):
    """The real kernel run on each row reversed, ids mapped back: the argmax keeps the HIGHEST
    index among equal maxima (and the last NaN), what a max-reduction that breaks ties with >=,
    or a split that combines partials in the wrong order, gives."""
    import torch

    from reference.verify_accept import chain as ref

    f = _fused()
    B, L, V = ref.validate(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr)
    flipped = target_logits.flip(-1)
    out = f.verify_accept(target_logits=flipped, draft_tokens=torch.where(draft_tokens >= 0, V - 1 - draft_tokens,
                                                                          draft_tokens), qo_indptr=qo_indptr)
    ids = out["output_ids"]
    out["output_ids"] = torch.where(ids >= 0, V - 1 - ids, ids)
    return out


def _row_stride_ignored(*, target_logits, draft_tokens, qo_indptr):
    """The real kernel told that rows are V apart (``stride_row = V``: the logits assumed
    contiguous): on an LM head's output sliced to the vocabulary it reads the wrong rows."""
    import torch

    from reference.verify_accept import chain as ref

    f = _fused()
    B, L, V = ref.validate(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr)
    out = torch.empty((B, L + 1), dtype=ref.OUT_DTYPE, device=target_logits.device)
    n = torch.empty((B,), dtype=ref.OUT_DTYPE, device=target_logits.device)
    f.launch(output_ids=out, accept_length=n, target_logits=target_logits, draft_tokens=draft_tokens,
             qo_indptr=qo_indptr, stride_row=V)  # BUG: target_logits.stride(0)
    return {"output_ids": out, "accept_length": n}


MUTANTS = [
    Impl(OP, "mutant-accepts-first-mismatch", "mutant", _accepts_first_mismatch,
         doc="acceptance off by one: the first mismatching draft is accepted too (accept length + 1, the "
             "rejected draft emitted, the bonus from the next row)",
         catches=("exact:accept_length", "exact:output_ids")),
    Impl(OP, "mutant-bonus-wrong-row", "mutant", _bonus_wrong_row,
         doc="bonus token from the row after the first mismatch instead of the mismatch row itself",
         catches=("exact:output_ids",)),
    Impl(OP, "mutant-ties-to-highest-index", "mutant", _ties_to_highest,
         doc="vocab argmax breaks ties to the highest index (and takes the last NaN) instead of torch.argmax's "
             "lowest; invisible without equal maxima, so the cases plant bf16 ties and tied drafts",
         catches=("exact:output_ids", "exact:accept_length")),
    Impl(OP, "mutant-row-stride-ignored", "mutant", _row_stride_ignored,
         doc="kernel assumes contiguous logits (row stride = V): on a strided LM-head slice it reads other "
             "rows and the +inf pad columns",
         catches=("exact:output_ids",)),
]
