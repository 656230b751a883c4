"""Drafters: ``propose(r, prompt, out, L) -> L token ids`` for the tokens after ``out[-1]``.

``PromptLookup`` proposes real drafts: the continuation of the latest earlier occurrence of the
context's last n tokens (n = ngram .. 1), the prompt-lookup decoding used by serving engines;
GSM8K solutions copy numbers from the question and from their own annotations, so it hits.
``NoisyOracle`` proposes the known greedy continuation with each token replaced by a wrong one
with probability ``p_wrong`` (tests: p = 0 accepts everything, p = 1 nothing).
"""
from __future__ import annotations

import random

from harness.e2e import tokenizer as tok


class PromptLookup:
    def __init__(self, ngram: int = 3):
        self.ngram = ngram

    def propose(self, r: int, prompt: list[int], out: list[int], L: int) -> list[int]:
        ctx = list(prompt) + list(out)
        for n in range(min(self.ngram, len(ctx) - 1), 0, -1):
            key = ctx[-n:]
            for j in range(len(ctx) - n - 1, -1, -1):
                if ctx[j: j + n] == key:
                    d = ctx[j + n: j + n + L]
                    return d + [tok.PAD] * (L - len(d))
        return [tok.PAD] * L


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
