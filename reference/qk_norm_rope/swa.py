"""The non-unified layer's paged fp8 SWA cache of ``qk_norm_rope`` (launch 3' of the chain,
``reference.qk_norm_rope.chain``): its byte layout (``SwaLayout``), the store's quantisation
(``swa_encode``) and scatter (``swa_paged_store``), and the rows as attention reads them back
(``swa_decode``). Pure torch, like every reference module.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.checks import RangeError, ShapeError, check_contiguous, check_dtype, check_int, check_rank
from reference.mla_fp8_prepare import chain as mla_chain

SWA_TILE = 64  # nope values sharing one scale
SWA_FP8 = torch.float8_e4m3fn  # the value format (OCP e4m3, max 448; NVIDIA's and the CPU's fp8)
SWA_FP8_MAX = float(torch.finfo(SWA_FP8).max)
SWA_AMAX_FLOOR = 1e-8  # a tile's |max| is raised to this before the scale is taken (all-zero tiles)
SWA_SCALE_BIAS = 127  # ue8m0: the scale byte is the exponent + 127, the scale 2**(byte - 127)


@dataclass(frozen=True)
class SwaLayout:
    """Byte layout of a non-unified layer's paged SWA cache (DeepSeek-V4's ``KVLayout.V4``).

    The cache is ``(num_pages, page_bytes)`` uint8; a page holds ``page_size`` tokens, block-split:
    first ``page_size`` value records of ``value_bytes = nope + 2·R`` bytes (the ``nope = D − R``
    values as fp8 e4m3fn codes, then the R rotated dims as bf16, little-endian), then
    ``page_size`` scale records of ``scale_bytes = nope/64 + 1`` bytes (one ue8m0 exponent byte per
    64-value tile, then one pad byte the store never writes). Token ``loc`` lives in page
    ``loc // page_size`` at slot ``loc % page_size``. Bytes past ``page_size · token_bytes`` pad
    the page to a whole number of value records (``page_bytes``), as the attention reader wants.
    DeepSeek-V4 (D = 512, R = 64): 448 fp8 + 128 bf16 = 576 value bytes, 7 scales + 1 pad.
    """
    head_dim: int
    rope_dim: int
    page_size: int

    @property
    def nope(self) -> int:
        return self.head_dim - self.rope_dim

    @property
    def tiles(self) -> int:
        return self.nope // SWA_TILE

    @property
    def value_bytes(self) -> int:
        return self.nope + 2 * self.rope_dim

    @property
    def scale_bytes(self) -> int:
        return self.tiles + 1

    @property
    def token_bytes(self) -> int:
        return self.value_bytes + self.scale_bytes

    @property
    def min_page_bytes(self) -> int:
        return self.page_size * self.token_bytes

    @property
    def page_bytes(self) -> int:
        """The page stride a pool is allocated with: ``min_page_bytes`` padded to whole value records."""
        return -(-self.min_page_bytes // self.value_bytes) * self.value_bytes

    def value_offset(self, slot: torch.Tensor) -> torch.Tensor:
        """Byte offset, inside its page, of slot ``slot``'s value record. Shape: like slot."""
        return slot * self.value_bytes

    def scale_offset(self, slot: torch.Tensor) -> torch.Tensor:
        """Byte offset, inside its page, of slot ``slot``'s scale record. Shape: like slot."""
        return self.page_size * self.value_bytes + slot * self.scale_bytes

    def written_bytes(self, slot: torch.Tensor) -> torch.Tensor:
        """(n, page_bytes_min) bool: the bytes of slot ``slot[i]``'s page the store writes for it
        (value record and the scale bytes; not the pad byte). Shape: slot (n,)."""
        cols = torch.arange(self.min_page_bytes, device=slot.device)
        v0, s0 = self.value_offset(slot)[:, None], self.scale_offset(slot)[:, None]
        return ((cols >= v0) & (cols < v0 + self.value_bytes)) | ((cols >= s0) & (cols < s0 + self.tiles))


def validate_swa(swa_cache, swa_page_size, head_dim: int, rope_dim: int) -> SwaLayout:
    """The paged SWA cache and its page size (both given): the layout they describe.

    D − R must be a whole number of 64-value tiles (RangeError naming rope_dim); swa_page_size an int
    ≥ 1; swa_cache a contiguous (num_pages, page_bytes) uint8 tensor whose pages hold
    ``SwaLayout.min_page_bytes`` (ShapeError otherwise)."""
    if (head_dim - rope_dim) % SWA_TILE:
        raise RangeError("rope_dim", f"the paged fp8 store quantises head_dim - rope_dim = {head_dim - rope_dim} "
                                     f"values in tiles of {SWA_TILE}: not a multiple (head_dim {head_dim}, "
                                     f"rope_dim {rope_dim})")
    lay = SwaLayout(head_dim, rope_dim, check_int("swa_page_size", swa_page_size, low=1))
    check_rank("swa_cache", swa_cache, 2)
    check_dtype("swa_cache", swa_cache, (torch.uint8,))
    check_contiguous("swa_cache", swa_cache)
    if swa_cache.shape[1] < lay.min_page_bytes:
        raise ShapeError("swa_cache", f"pages of {swa_cache.shape[1]} bytes cannot hold {lay.page_size} tokens of "
                                      f"{lay.token_bytes} bytes ({lay.min_page_bytes}); shape {tuple(swa_cache.shape)}")
    return lay


def swa_scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """A tile's ue8m0 exponent ``e = ceil(log2(max(amax, 1e-8) / 448))``, so that ``amax · 2**-e``
    fits the fp8 range: the quotient is rounded once in fp32, the ceiling taken exactly (``frexp``:
    q = m·2**k, m in [0.5, 1), is 2**(k-1) iff m = 0.5). Shape: amax (...) fp32 -> (...) int32."""
    quot = amax.clamp_min(SWA_AMAX_FLOOR) / SWA_FP8_MAX  # fp32, one rounding
    m, k = torch.frexp(quot)
    return (k - (m == 0.5).to(k.dtype)).to(torch.int32)


def swa_encode(kv_out: torch.Tensor, lay: SwaLayout, *, exponent=swa_scale_exponent
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The store's quantisation of bf16 rows (launch 3', first half): per 64-value nope tile the
    exponent ``e`` (``swa_scale_exponent``) of its |max|, the codes ``fp8_e4m3fn(clamp(x · 2**-e,
    ±448))`` (round to nearest even, subnormals kept; x · 2**-e is exact), the rope dims' bf16 bytes.
    Shape: kv_out (T, D) bf16 -> (codes (T, nope) uint8, scale bytes (T, tiles) uint8 = e + 127,
    rope bytes (T, 2·R) uint8, little-endian). ``exponent``: the tile exponent rule (a planted bug
    passes another)."""
    T = kv_out.shape[0]
    nope = kv_out[:, : lay.nope].float().view(T, lay.tiles, SWA_TILE)  # bf16 -> fp32, exact
    e = exponent(nope.abs().amax(dim=-1) if lay.tiles else nope.new_zeros(T, 0))  # (T, tiles)
    inv = torch.exp2(-e.double()).float()  # 2**-e, exact (an integer power of two in the fp32 range)
    codes = mla_chain.cast_fp8(nope * inv[..., None], SWA_FP8, "saturate").view(torch.uint8).reshape(T, lay.nope)
    rope = kv_out[:, lay.nope:].contiguous().view(torch.uint8)  # (T, 2R): bf16 bytes, little-endian
    return codes, (e + SWA_SCALE_BIAS).to(torch.uint8), rope


def swa_paged_store(kv_out: torch.Tensor, swa_cache: torch.Tensor, loc: torch.Tensor, lay: SwaLayout, *,
                    exponent=swa_scale_exponent) -> None:
    """Launch 3' (non-unified KV, every mode): quantise (``swa_encode``) and scatter token t's
    records into page ``loc[t] // page_size``, slot ``loc[t] % page_size`` (``SwaLayout``); loc < 0
    is padding. The pad byte of each scale record and every other byte keep theirs. ``exponent``:
    ``swa_encode``'s. Shape: kv_out (T, D) bf16, swa_cache (num_pages, page_bytes) uint8, loc (T,) int."""
    valid = loc >= 0
    codes, scales, rope = swa_encode(kv_out[valid], lay, exponent=exponent)
    slot_id = loc[valid].long()
    page, slot = slot_id // lay.page_size, slot_id % lay.page_size
    v0 = lay.value_offset(slot)[:, None]
    vcols = v0 + torch.arange(lay.value_bytes, device=loc.device)  # (n, value_bytes)
    scols = lay.scale_offset(slot)[:, None] + torch.arange(lay.tiles, device=loc.device)  # (n, tiles)
    swa_cache[page[:, None], vcols] = torch.cat((codes, rope), dim=-1)
    swa_cache[page[:, None], scols] = scales


def swa_decode(pages: torch.Tensor, slot: torch.Tensor, lay: SwaLayout) -> torch.Tensor:
    """The rows the cache holds, as attention reads them: fp8 codes × 2**(scale byte − 127) and
    the bf16 rope dims, exactly (fp64). ``pages[i]`` is the page of token record ``slot[i]``.
    Shape: pages (n, page_bytes) uint8, slot (n,) int -> (n, D) fp64."""
    n = slot.shape[0]
    slot = slot.long().to(pages.device)
    rows = torch.arange(n, device=pages.device)[:, None]
    vals = pages[rows, lay.value_offset(slot)[:, None] + torch.arange(lay.value_bytes, device=pages.device)]
    sc = pages[rows, lay.scale_offset(slot)[:, None] + torch.arange(lay.tiles, device=pages.device)]
    scale = torch.exp2(sc.double() - SWA_SCALE_BIAS)  # exact for every byte
    nope = vals[:, : lay.nope].contiguous().view(SWA_FP8).double().view(n, lay.tiles, SWA_TILE) * scale[..., None]
    rope = vals[:, lay.nope:].contiguous().view(torch.bfloat16).double()
    return torch.cat((nope.reshape(n, lay.nope), rope), dim=-1)
