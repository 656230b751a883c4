"""The per-arch launch configuration of ``verify_attention``'s kernels (``fused.verify_attention.wrapper``
launches them): tile sizes, warps and stages per head_dim (``BLOCK_CONFIG``, the table
``harness.bench.sweep`` tunes), the head block a KV group allows, the combine's head block, the
padded draft rows ``tl.dot`` needs.
"""
from __future__ import annotations

import triton

# arch -> head_dim -> (BLOCK_H, BLOCK_N, num_warps, num_stages). BLOCK_H is an upper bound: the
# wrapper takes the largest power of two <= min(BLOCK_H, KV_GROUP_NUM) and refuses a group it
# does not divide. The interpreter pays per program and per op, hardly per element: wide head
# blocks, few programs, and key tiles of 512 (one tile per split for any micro-model window of the
# end-to-end gate). Its BLOCK_N = 512 is what the catalog's tile-boundary cases (511/512/513,
# 1023/1024/1025) straddle; being multiples of 512, they straddle every compiled BLOCK_N too.
BLOCK_CONFIG = {
    "interpreter": {64: (16, 512, 1, 1), 128: (16, 512, 1, 1), 256: (16, 512, 1, 1), 576: (16, 512, 1, 1)},
    # sm90 256 / 576: the sweep's best on the H200 (harness.bench.sweep, B 64, H 16, L 4, prefix 16K, 8 and 24
    # splits): D 256 (16, 32, 4, 3) 413 us, 62 % of copy (was (16, 32, 8, 2), slower than the top 8 at > 625 us);
    # MLA (8, 32, 4, 2) 1540 us, 19 % of copy (was (8, 32, 8, 1)). 64 / 128: not swept yet
    "sm90": {64: (16, 64, 4, 2), 128: (16, 64, 4, 2), 256: (16, 32, 4, 3), 576: (8, 32, 4, 2)},
    "gfx942": {64: (4, 256, 4, 1), 128: (4, 128, 4, 1), 256: (4, 64, 8, 1), 576: (4, 32, 8, 1)},
    "gfx950": {64: (4, 256, 4, 1), 128: (4, 128, 4, 1), 256: (4, 64, 8, 1), 576: (4, 32, 8, 1)},
}
# the arch whose table an arch without one of its own takes (``block_config``)
DEFAULT_ARCH = "sm90"
# arch -> rows (query heads x padded drafts) per combine program by default; an arch not listed combines
# with the prefix kernel's BLOCK_H. The combine is latency-bound (per row: S partials, one draft tile): on
# the H200 (B 64, H 16, L 4; harness.bench.sweep --combine-block-h, devjobs explore of 2026-11-29) 16 rows
# (4 heads) instead of 64 took GQA prefix 16K from 413.8 to 390.8 us at 8 splits and 386.8 to 376.3 at 4,
# MLA prefix 4K from 462.8 to 438.7 us at 8 splits. The interpreter pays per program: not listed
COMBINE_ROWS = {"sm90": 16}


def arch() -> str:
    """``"interpreter"`` or the GPU's arch: the key of the per-arch tables above."""
    from harness.devices import kernel_arch

    return kernel_arch()


def block_config(head_dim: int, arch_name: str | None = None) -> tuple[int, int, int, int]:
    table = BLOCK_CONFIG.get(arch_name or arch(), BLOCK_CONFIG[DEFAULT_ARCH])
    key = min((d for d in table if d >= head_dim), default=max(table))
    return table[key]


def block_h_for(group: int, head_dim: int, arch_name: str | None = None) -> int:
    """Largest power of two <= the table's BLOCK_H and <= the group (KV_GROUP_NUM)."""
    cap = block_config(head_dim, arch_name)[0]
    bh = 1
    while bh * 2 <= min(cap, group):
        bh *= 2
    return bh


def combine_block_h_for(L: int, block_h: int, arch_name: str | None = None) -> int:
    """Query heads per combine program by default: the fewest whose padded rows fill
    ``COMBINE_ROWS`` (tl.dot needs 16), at most ``block_h`` (so it divides the KV group whenever
    ``block_h`` does); ``block_h`` itself on an arch without an entry."""
    rows = COMBINE_ROWS.get(arch_name or arch())
    if rows is None:
        return block_h
    return max(1, min(block_h, rows // triton.next_power_of_2(max(1, L))))


def l_pad_for(L: int, block_h: int) -> int:
    """Drafts per head padded so that BLOCK_H·L_PAD >= 16 rows (tl.dot); next_power_of_2(0) is
    0 in Triton, so L >= 1 is required (the validator guarantees it)."""
    return max(triton.next_power_of_2(triton.cdiv(16, block_h)), triton.next_power_of_2(max(1, L)))
