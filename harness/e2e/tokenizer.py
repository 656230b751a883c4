"""Character tokenizer: a fixed alphabet (not learned from data, so a model file never depends
on which problems it saw). Ids 0-2 are special; any character outside the alphabet maps to UNK."""
from __future__ import annotations

PAD, BOS, EOS, UNK = 0, 1, 2, 3
ALPHABET = ("\n abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
            ".,?!$'\"%:;-+*/=<>#()&")
_ID = {c: i + 4 for i, c in enumerate(ALPHABET)}
VOCAB = 4 + len(ALPHABET)


def encode(text: str, *, bos: bool = True) -> list[int]:
    return ([BOS] if bos else []) + [_ID.get(c, UNK) for c in text]


def decode(ids) -> str:
    out = []
    for i in ids:
        i = int(i)
        if i == EOS:
            break
        if i >= 4:
            out.append(ALPHABET[i - 4])
        elif i == UNK:
            out.append("?")
    return "".join(out)


def prompt(question: str) -> str:
    """The micro-models' own format: question, newline, then the GSM8K-style solution."""
    return f"Q: {question}\nA: "
