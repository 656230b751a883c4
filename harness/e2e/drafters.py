"""Drafters: ``propose(r, prompt, out, L) -> L token ids`` for the tokens after ``out[-1]``.

``PromptLookup`` proposes real drafts: the continuation of the latest earlier occurrence of the
context's last n tokens (n = ngram .. 1), the prompt-lookup decoding used by serving engines;
GSM8K solutions copy numbers from the question and from their own annotations, so it hits.
``NGramLookup`` adds a table drafter: the most frequent continuation of the longest context
suffix (up to ``order`` tokens) seen in the train split's solutions (the n-gram / lookahead
drafters of serving engines), used where prompt lookup has no match of at least ``min_copy``
tokens; the solution's wording is templated, its numbers are copies, and each source covers the
other's gap.
``NoisyOracle`` proposes the known greedy continuation with each token replaced by a wrong one
with probability ``p_wrong`` (tests: p = 0 accepts everything, p = 1 nothing).
"""
from __future__ import annotations

import random

from harness.e2e import tokenizer as tok


def latest_match(ctx: list[int], n: int) -> int | None:
    """Where the continuation of the latest earlier occurrence of ctx's last n tokens starts."""
    key = ctx[-n:]
    for j in range(len(ctx) - n - 1, -1, -1):
        if ctx[j: j + n] == key:
            return j + n
    return None


class PromptLookup:
    def __init__(self, ngram: int = 3):
        self.ngram = ngram

    def propose(self, r: int, prompt: list[int], out: list[int], L: int) -> list[int]:
        ctx = list(prompt) + list(out)
        for n in range(min(self.ngram, len(ctx) - 1), 0, -1):
            j = latest_match(ctx, n)
            if j is not None:
                d = ctx[j: j + L]
                return d + [tok.PAD] * (L - len(d))
        return [tok.PAD] * L


class NGramLookup:
    def __init__(self, corpus: list[list[int]], *, order: int = 8, min_copy: int = 3):
        self.order, self.min_copy = order, min_copy
        counts: dict[tuple, dict[int, int]] = {}
        for ids in corpus:
            for i in range(1, len(ids)):
                for k in range(1, min(order, i) + 1):
                    c = counts.setdefault(tuple(ids[i - k: i]), {})
                    c[ids[i]] = c.get(ids[i], 0) + 1
        self.table = {key: max(c, key=c.get) for key, c in counts.items()}

    @classmethod
    def from_train_split(cls, limit: int | None = 2000, **kw) -> "NGramLookup":
        """Table built from the solutions (answer + EOS) of the shipped train split."""
        from cases import gsm8k_synth as g

        return cls([tok.encode(r["answer"], bos=False) + [tok.EOS] for r in g.load("train", limit=limit)], **kw)


    def _table(self, ctx: list[int]) -> int:
        for k in range(min(self.order, len(ctx)), 0, -1):
            t = self.table.get(tuple(ctx[-k:]))
            if t is not None:
                return t
        return tok.PAD

    def propose(self, r: int, prompt: list[int], out: list[int], L: int) -> list[int]:
        ctx, d = list(prompt) + list(out), []
        for _ in range(L):
            j = latest_match(ctx, self.min_copy) if len(ctx) > self.min_copy else None
            t = ctx[j] if j is not None else self._table(ctx)
            d.append(t)
            ctx.append(t)
        return d


class NoisyOracle:
    def __init__(self, reference: list[list[int]] | tuple, p_wrong: float, *, vocab: int = tok.VOCAB, seed: int = 0):
        self.ref, self.p, self.vocab = [list(x) for x in reference], p_wrong, vocab
        self.rng = random.Random(seed)

    def propose(self, r: int, prompt: list[int], out: list[int], L: int) -> list[int]:
        truth = self.ref[r][len(out): len(out) + L]
        truth += [tok.PAD] * (L - len(truth))
        d = []
        for t in truth:
            if self.rng.random() < self.p:
                t = (t + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab  # any other token
            d.append(t)
        return d
