"""Fused greedy chain acceptance: the vocabulary argmax of every target row, split over the row, and
the acceptance walk of every request, in two launches (``fused.verify_accept.kernels``: what each
does, and why the argmax rule survives the split).

Why split the vocabulary: one program per request (the kernel of trees up to 5f017f8 (2026-12-07), timed as
``--before`` by ``cases/verify_accept/bench.py``) streams a request's (L + 1)·V logits on one SM: at
B 1 one SM walks 800K entries, and at B 64 one wave of 64 programs cannot keep the memory busy. Here
every row is cut into ``n_chunks`` chunks of ``chunk_len`` columns (``split_config``), so a launch
has B·(L + 1)·n_chunks programs; the price is a small workspace of partials (written before read,
no zeroing) and a second launch of B programs, and that every row of a real request is read (the
walk no longer stops reading at the first mismatch; the chain reads them all too).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from fused import device_checks
from fused.compile_specs import variant
from fused.verify_accept import kernels as k
from reference.checks import value_check_mode
from reference.verify_accept import chain as ref

# compiled: programs launch 1 aims at (H100/H200: 132 SMs x 16 programs of 4 warps resident is 2112):
# enough to fill the GPU at B 1 (5 rows), few enough that each keeps several tiles in flight at B 64
TARGET_PROGRAMS = 2048
# the interpreter pays per program and per op, hardly per element: few programs, but still several
# chunks per row at the catalog's vocabularies (the 5 rows of a B 1 request at V 4097: 5 chunks of 1024 each)
TARGET_PROGRAMS_INTERPRETED = 32


@dataclass(frozen=True)
class SplitConfig:
    block_v: int  # columns per tile (launch 1's lanes)
    chunk_len: int  # columns per launch-1 program, a multiple of block_v
    n_chunks: int  # launch-1 programs per row: cdiv(V, chunk_len)
    num_warps: int
    num_stages: int


def split_config(rows: int, V: int, interpreted: bool) -> SplitConfig:
    """Launch 1's tiling of ``rows`` target rows of V columns: as many chunks per row as bring the
    programs to the target (``TARGET_PROGRAMS``), at most one tile each, and whole tiles per chunk.
    Compiled: 2048-column tiles over 128 threads (16 contiguous bf16, two 16-byte loads, per thread)
    and 3 tiles in flight. B 1 x L 4 x V 160K: 79 chunks of 2048, 395 programs of one tile; B 64:
    7 chunks of 24576 (12 tiles), 2240 programs; B 256: 2 chunks, 2560 programs. Not tuned on a GPU
    yet: ``cases/verify_accept/bench.py``."""
    block_v, warps, stages = (1024, 1, 1) if interpreted else (2048, 4, 3)
    target = TARGET_PROGRAMS_INTERPRETED if interpreted else TARGET_PROGRAMS
    tiles = triton.cdiv(V, block_v)
    want = min(tiles, max(1, triton.cdiv(target, max(rows, 1))))
    chunk_len = triton.cdiv(tiles, want) * block_v
    return SplitConfig(block_v, chunk_len, triton.cdiv(V, chunk_len), warps, stages)


def launch(*, output_ids, accept_length, target_logits, draft_tokens, qo_indptr, stride_row: int | None = None,
           config: SplitConfig | None = None, flags: torch.Tensor | None = None) -> None:
    """The two launches. Arguments already validated. ``stride_row``: the row stride the kernels are
    told (default: the tensor's own); ``config``: launch 1's tiling (default ``split_config``'s);
    ``flags``: the device's error record (``fused.device_checks``): the kernels check the values."""
    B, Lp1 = output_ids.shape
    V = target_logits.shape[1]
    cfg = config or split_config(B * Lp1, V, os.environ.get("TRITON_INTERPRET") == "1")
    part_v = torch.empty((B * Lp1, cfg.n_chunks), dtype=torch.float32, device=target_logits.device)
    part_i = torch.empty((B * Lp1, cfg.n_chunks), dtype=torch.int32, device=target_logits.device)
    k.verify_accept_partial_kernel[(B * Lp1, cfg.n_chunks)](
        part_v_ptr=part_v, part_i_ptr=part_i, logits_ptr=target_logits, qo_ptr=qo_indptr, V=V, L=Lp1 - 1,
        chunk_len=cfg.chunk_len, n_chunks=cfg.n_chunks,
        stride_row=target_logits.stride(0) if stride_row is None else stride_row,
        BLOCK_V=cfg.block_v, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        **({"n_logit_rows": target_logits.shape[0], "CHECK_VALUES": True} if flags is not None else {}),
    )
    k.verify_accept_combine_kernel[(B,)](
        out_ptr=output_ids, len_ptr=accept_length, part_v_ptr=part_v, part_i_ptr=part_i, draft_ptr=draft_tokens,
        qo_ptr=qo_indptr, L=Lp1 - 1, n_chunks=cfg.n_chunks, stride_out=output_ids.stride(0),
        BLOCK_L=triton.next_power_of_2(Lp1), BLOCK_C=triton.next_power_of_2(cfg.n_chunks), num_warps=4,
        **({"flag_ptr": flags, "n_logit_rows": target_logits.shape[0], "V": V, "CHECK_VALUES": True}
           if flags is not None else {}),
    )


def verify_accept(*, target_logits, draft_tokens, qo_indptr, checked=None):
    """Same contract as ``reference.verify_accept.chain.verify_accept``, in two launches.

    Shapes: target_logits (N, V) bf16, any row stride with a unit innermost one; draft_tokens
    (B·L,) int; qo_indptr (B + 1,) int, each request L + 1 rows or 0 (padding).
    Returns {"output_ids": (B, L + 1) int32, "accept_length": (B,) int32}.

    Checks: shapes, dtypes, strides and devices on every call (no sync). The values of qo_indptr
    (starts at 0, every request 0 or L + 1 rows, inside target_logits) and of the real requests'
    drafts (in [0, V)) by ``checked`` (None: ``VP_CHECK_VALUES``; ``reference.checks.value_check_mode``):

    - True (the default): on the host, one sync, before the launch; a bad one is a RangeError naming it.
    - ``"device"``: by the kernels, no sync (``fused.device_checks``): a request whose qo_indptr
      entries do not give it L + 1 rows inside target_logits reads nothing and gets the padding
      outputs (−1, length 0); a draft outside [0, V) matches no token (the walk stops at it); and
      ``fused.device_checks.raise_pending()`` raises the host check's RangeError later.
    - False: the caller guarantees them (a bad qo_indptr is then read past target_logits) and
      nothing waits on the device.
    """
    mode = value_check_mode(checked)
    B, L, _ = ref.validate(target_logits=target_logits, draft_tokens=draft_tokens, qo_indptr=qo_indptr,
                           check_values=mode == "host")
    dev = target_logits.device
    out = torch.empty((B, L + 1), dtype=ref.OUT_DTYPE, device=dev)
    n = torch.empty((B,), dtype=ref.OUT_DTYPE, device=dev)
    launch(output_ids=out, accept_length=n, target_logits=target_logits, draft_tokens=draft_tokens,
           qo_indptr=qo_indptr, flags=device_checks.record(dev) if mode == "device" else None)
    return {"output_ids": out, "accept_length": n}


def compile_specs():
    """Signatures for the ahead-of-time compile check (``python -m harness compile``): launch 1 for
    both index dtypes of qo_indptr, launch 2 for both of the drafts and of qo_indptr at B 1 x L 4 x
    V 160K's tile (79 chunks: BLOCK_C 128) and B 64's (7: BLOCK_C 8) (``fused.compile_specs``), each
    also with ``checked="device"``'s checks (CHECK_VALUES)."""
    cfg = split_config(5, 160000, interpreted=False)
    specs = [variant(f"qo={qo[1:]}{',checked' if chk else ''}", k.verify_accept_partial_kernel,
                     {"part_v_ptr": "*fp32", "part_i_ptr": "*i32", "logits_ptr": "*bf16", "qo_ptr": qo},
                     {"BLOCK_V": cfg.block_v, "NUM_STAGES": cfg.num_stages, "CHECK_VALUES": chk}, cfg.num_warps)
             for qo in ("*i32", "*i64") for chk in (False, True)]
    for rows in (5, 320):
        n_chunks = split_config(rows, 160000, interpreted=False).n_chunks
        specs += [variant(f"draft={d[1:]},qo={qo[1:]},chunks={n_chunks}{',checked' if chk else ''}",
                          k.verify_accept_combine_kernel,
                          {"out_ptr": "*i32", "len_ptr": "*i32", "part_v_ptr": "*fp32", "part_i_ptr": "*i32",
                           "draft_ptr": d, "qo_ptr": qo, "flag_ptr": "*i64"},
                          {"BLOCK_L": 8, "BLOCK_C": triton.next_power_of_2(n_chunks), "CHECK_VALUES": chk}, 4)
                  for d in ("*i32", "*i64") for qo in ("*i32", "*i64") for chk in (False, True)]
    return specs
