"""The verify masks: which keys each draft of a request sees (the whole prefix, then the draft rule:
causal, all, or a tree mask when topk > 1), for the chain, the oracle and the SDPA baseline."""
from __future__ import annotations

import torch


def draft_mask(L: int, is_causal: bool, tree: torch.Tensor | None, device) -> torch.Tensor:
    """(L, L) bool: may draft i see draft j. A tree mask (topk > 1) replaces the causal rule."""
    if tree is not None:
        return tree.view(L, L).to(device)
    if is_causal:
        return torch.ones(L, L, dtype=torch.bool, device=device).tril()
    return torch.ones(L, L, dtype=torch.bool, device=device)


def tree_masks(custom_mask, qo: list[int]) -> list[torch.Tensor | None]:
    """Per request: its (L_b²,) slice of the flat tree mask, or None when there is none."""
    if custom_mask is None:
        return [None] * (len(qo) - 1)
    out, off = [], 0
    for b in range(len(qo) - 1):
        n = (qo[b + 1] - qo[b]) ** 2
        out.append(custom_mask[off: off + n])
        off += n
    return out


def dense_mask(n: int, L: int, is_causal: bool, tree: torch.Tensor | None, device) -> torch.Tensor:
    """(L, n + L) bool: the whole prefix, then the draft rule."""
    return torch.cat((torch.ones(L, n, dtype=torch.bool, device=device), draft_mask(L, is_causal, tree, device)), 1)
