"""What a timeline's backend hands the launches, against the logical request (``harness.timelines.runner``):
the truth here comes from the timeline script and the KV layout only — the request's positions, its
committed tokens, the script's accept counts — never from the backend under test."""
from __future__ import annotations

import torch

from harness import compare
from harness.timelines.prepare import exact_check


def launch_checks(kv, mode: str, owners: list[tuple[int, int]], committed: list[int], truth_pos: torch.Tensor,
                  pos_t: torch.Tensor, loc_logical: torch.Tensor, loc_phys: torch.Tensor,
                  logical_host: list[int] | None = None) -> list[compare.Record | compare.Check]:
    """One forward's positions and slots, recorded at every layer that launches with them:
      input:positions      ``pos_t`` (T,) is ``truth_pos`` (T,), the request's own positions;
      input:out_cache_loc  ``loc_logical`` (T,): on a ring, request r's position p at r·C + p mod C (a
                           prefill longer than the ring keeps its last C, the rest -1); in a paged
                           pool, fresh slots: none holds a committed row (``committed[r]`` entries of
                           each request's table), none twice, all inside the pool;
      input:loc-physical   ``loc_phys`` (T,) is the pool's own translation of ``loc_logical``.
    ``owners``: (request, width) per chunk, in batch order; ``logical_host``: ``loc_logical`` as a
    host list when the caller has it. Records, or checks staged for ``compare.Batch``."""
    out = [exact_check("input:positions", pos_t, truth_pos)]
    if kv.spec.layout == "ring":
        C, want, off = kv.spec.ring_capacity, [], 0
        for r, c in owners:
            slot = r * C + truth_pos[off: off + c] % C
            if mode == "extend":
                slot = torch.where(torch.arange(c, device=slot.device) >= c - C, slot, torch.full_like(slot, -1))
            want.append(slot)
            off += c
        out.append(exact_check("input:out_cache_loc", loc_logical, torch.cat(want)))
    else:
        live = {s for r, n in enumerate(committed) for s in kv.table[r][:n]}
        new = [s for s in (loc_logical.tolist() if logical_host is None else logical_host) if s >= 0]
        clash = sorted(set(new) & live)
        dup = len(new) != len(set(new))
        ok = not clash and not dup and all(0 <= s < kv.buffers[0].shape[0] for s in new)
        out.append(compare.Record("input:out_cache_loc", ok, detail="" if ok else (
            f"slots {clash[:4]} hold committed rows" if clash else "a slot twice in one launch" if dup
            else "a slot outside the pool")))
    out.append(exact_check("input:loc-physical", loc_phys, kv.physical(loc_logical)))
    return out


def accept_inputs(accepts: list[int], L: int, vocab: int, g: torch.Generator, device) -> dict:
    """The acceptance op's inputs for one verify batch whose greedy acceptance is ``accepts`` (one a
    per request, 0 <= a <= L): random drafts and target logits whose row argmax is the draft at rows
    j < a and another token at row a (the draft's logit the row's minimum), one maximum per row.
    Shapes: target_logits (B·(L+1), vocab) bf16, draft_tokens (B·L,) int32, qo_indptr (B+1,) int32."""
    B = len(accepts)
    drafts = torch.randint(0, vocab, (B, L), generator=g)
    logits = torch.randn(B, L + 1, vocab, generator=g)
    for b, a in enumerate(accepts):
        for j in range(L):
            logits[b, j, drafts[b, j]] = 8.0 if j < a else -8.0
    return dict(target_logits=logits.view(B * (L + 1), vocab).to(torch.bfloat16).to(device),
                draft_tokens=drafts.view(-1).to(torch.int32).to(device),
                qo_indptr=(torch.arange(B + 1, dtype=torch.int32) * (L + 1)).to(device))
