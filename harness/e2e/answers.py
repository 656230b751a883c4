"""Answer extraction compatible with lm-eval's ``gsm8k`` task (its two filters and its
normalisation), used by the engine gate and the server client alike.

  strict-match     the number after ``#### `` (regex ``#### (\\-?[0-9\\.\\,]+)``), else "[invalid]"
  flexible-extract the last number-like match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)``, else "[invalid]"
Both sides are normalised like lm-eval's exact_match: ``,`` and ``$`` removed, everything up to
``#### `` removed, a trailing ``.`` removed.
"""
from __future__ import annotations

import re

INVALID = "[invalid]"
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEX = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def strict(text: str) -> str:
    m = _STRICT.search(text)
    return m.group(1).strip() if m else INVALID


def flexible(text: str) -> str:
    matches = _FLEX.findall(text)
    if not matches:
        return INVALID
    a, b = matches[-1]
    return (a or b).strip()


def normalize(s: str) -> str:
    for rx in _IGNORE:
        s = rx.sub("", s)
    return s.strip()


def correct(extracted: str, gold_answer: str) -> bool:
    """``gold_answer``: a GSM8K answer field (``... #### 72``) or the bare number."""
    return extracted != INVALID and normalize(extracted) == normalize(gold_answer)
