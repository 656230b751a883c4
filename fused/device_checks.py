"""Value checks on the device: ``checked="device"`` of the fused wrappers.

The host checks (``checked=True``, the default) read the index tensors' values before anything is
written, in one host sync per call. On the hot path that sync is most of a call's cost, and under
CUDA-graph replay it cannot run at all. ``checked="device"`` moves them into the kernels: the
wrapper checks every shape, dtype, stride, device and scalar on the host as always (no sync), and
the kernels check the values they are about to use, each kind of bad value a bit of this device's
**error record** (``FLAG_WORDS`` int64: the bits, then each kind's words: one offending value and
what it broke). The record is read by ``raise_pending()``, one sync at a point the caller picks
(the end of a decode step, after a graph replay): it raises the error the host check would have
raised (its type, naming the same argument), the first kind in ``KINDS`` order (the host checks'
order), and clears the record. Nothing is read or written outside a tensor; what each op leaves
in the outputs its bad values touch is in its wrapper's docstring. What is weaker than the host
checks, and only that: the error comes at that point instead of at the call, and the call's valid
parts were computed and written.

The kinds (``KINDS``; a wrapper's docstring says which it records):

- ``qk_norm_rope`` (its kv programs): a position outside the cos/sin table (``POSITIONS``); with a
  store, a slot past the store target (``SLOT_PAST``) and a slot another token names too
  (``SLOT_TWICE``, each kv program scans ``loc``).
- ``mla_fp8_prepare`` (its k programs): the same two slot kinds, naming ``loc``.
- ``verify_accept`` (its combine programs): qo_indptr not starting at 0 (``QO_START``), a request
  of neither 0 nor L + 1 rows (``QO_SIZE``), rows outside target_logits (``QO_ROWS``), a real
  request's draft outside [0, V) (``DRAFT``).
- ``verify_tree_accept`` (each request's program, over its whole block): the five layout rules of
  ``reference.verify_tree_accept.chain.tree_faults``, in its order (``TREE_CANDIDATES`` ...).
- ``spec_sampling`` (a check launch before the op's, one program per row): a draft outside [0, V)
  (``DRAFT``), a temperature not finite and > 0 (``TEMPERATURE``), a draft probability not finite
  and >= 0 (``DRAFT_PROBS``), a NaN or +inf logit (``LOGITS_NAN``), a row of all −inf
  (``LOGITS_ROW``), a uniform outside [0, 1) (``UNIFORMS``).
- ``verify_attention`` (its combine programs, qo_indptr; its prefix programs, the KV slots), in the
  host check's order: qo_indptr not rising from 0 to T (``ATT_QO_RISE``), a request without a draft
  (``ATT_QO_EMPTY``), kv_indptr not rising from 0 to at most len(kv_indices) (``ATT_KV_INDPTR``), a
  slot outside the pool (``ATT_KV_INDICES``), then a request whose rows are not the uniform width's
  (``ATT_QO_WIDTH``: the width the call was planned with).
- ``mla_fp8_prepare_step`` (fused path), in the host check's order: a slot_map entry outside the pool
  (``MAP_PAST``) or named twice (``MAP_TWICE``), an out_cache_loc entry outside the logical pool
  (``OCL_PAST``) or named twice (``OCL_TWICE``): a check launch, one pass over both with a per-call
  counter per row; then a decode_kernel_loc row past kv_buffer (``DKL_PAST``) or named twice
  (``DKL_TWICE``): the kernel's k programs, as for ``mla_fp8_prepare``'s loc.

A kernel records a kind through ``note``: the first program to set its bit (``atomic_or`` returns
the old bits) writes the kind's words, so they describe one offence, not a mix of several.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from reference.checks import DUPLICATE_MESSAGE, RangeError, UnsupportedError, VerifyParityInputError
from reference.verify_tree_accept.chain import TREE_FAULTS

# the kinds, as the kernels name them (a kind's bit is 1 << kind; its words: ``word_of``)
POSITIONS_KIND = tl.constexpr(0)
SLOT_PAST_KIND = tl.constexpr(1)
SLOT_TWICE_KIND = tl.constexpr(2)
QO_START = tl.constexpr(3)
QO_SIZE = tl.constexpr(4)
QO_ROWS = tl.constexpr(5)
DRAFT = tl.constexpr(6)
TREE_CANDIDATES = tl.constexpr(7)  # then TREE_INDEX, TREE_NEXT_TOKEN, TREE_NEXT_SIBLING, TREE_TWO_PARENTS
TREE_INDEX = tl.constexpr(8)
TREE_NEXT_TOKEN = tl.constexpr(9)
TREE_NEXT_SIBLING = tl.constexpr(10)
TREE_TWO_PARENTS = tl.constexpr(11)
TEMPERATURE = tl.constexpr(12)
DRAFT_PROBS = tl.constexpr(13)
LOGITS_NAN = tl.constexpr(14)
LOGITS_ROW = tl.constexpr(15)
UNIFORMS = tl.constexpr(16)
ATT_QO_RISE = tl.constexpr(17)
ATT_QO_EMPTY = tl.constexpr(18)
ATT_KV_INDPTR = tl.constexpr(19)
ATT_KV_INDICES = tl.constexpr(20)
ATT_QO_WIDTH = tl.constexpr(21)
MAP_PAST = tl.constexpr(22)  # mla_fp8_prepare_step: slot_map, out_cache_loc, decode_kernel_loc (its order)
MAP_TWICE = tl.constexpr(23)
OCL_PAST = tl.constexpr(24)
OCL_TWICE = tl.constexpr(25)
DKL_PAST = tl.constexpr(26)
DKL_TWICE = tl.constexpr(27)
N_KINDS = 28

# qk_norm_rope's bits, as its kernel sets them (``fused.qk_norm_rope.kernels._check_values``)
POSITIONS, SLOT_PAST, SLOT_TWICE = 1, 2, 4
# [bits, a bad position, n_pos, a slot past the store, n_slots, a slot named twice], then 4 words per later kind
LEGACY_WORDS = {0: (1, 2), 1: (3, 2), 2: (5, 1)}
WORDS_PER_KIND = 4
FLAG_WORDS = 6 + WORDS_PER_KIND * (N_KINDS - 3)


def word_of(kind: int) -> tuple[int, int]:
    """(first word, number of words) of ``kind`` in the record."""
    if kind in LEGACY_WORDS:
        return LEGACY_WORDS[kind]
    return 6 + WORDS_PER_KIND * (kind - 3), WORDS_PER_KIND


@dataclass(frozen=True)
class Kind:
    """One kind of bad value: the argument its error names and the message made of its words."""
    arg: str
    message: Callable[[list[int]], str]
    error: type = RangeError


def _tree(rule: int) -> Kind:
    arg, what = TREE_FAULTS[rule]

    def message(w):
        b, i, v, n_or_v = w
        return f"request {b}: " + what.format(i=i, v=v, V=n_or_v, lo=b * n_or_v, hi=b * n_or_v + n_or_v - 1)
    return Kind(arg, message)


DEVICE = " (checked on the device)"


def _fp32(bits: int) -> float:
    """The fp32 value whose bits a kernel stored (as an int64 word)."""
    return struct.unpack("f", struct.pack("I", bits & 0xFFFFFFFF))[0]

KINDS: dict[int, Kind] = {
    0: Kind("positions", lambda w: f"entry {w[0]} outside [0, {w[1]}){DEVICE}"),
    1: Kind("loc", lambda w: f"entry {w[0]} outside [0, {w[1]}){DEVICE}"),
    2: Kind("loc", lambda w: f"{DUPLICATE_MESSAGE}: slot {w[0]}{DEVICE}"),
    3: Kind("qo_indptr", lambda w: f"must start at 0, got qo_indptr[0] = {w[0]}{DEVICE}"),
    4: Kind("qo_indptr", lambda w: f"request {w[0]} has {w[1]} rows; every request has L + 1 = {w[2]} "
                                   f"(or 0: padding){DEVICE}"),
    5: Kind("qo_indptr", lambda w: f"request {w[0]}'s rows [{w[1]}, {w[2]}) are not inside the {w[3]} rows "
                                   f"of target_logits{DEVICE}"),
    6: Kind("draft_tokens", lambda w: f"entry {w[0]} outside [0, {w[1]}) (V = vocabulary){DEVICE}"),
    **{7 + r: _tree(r) for r in range(len(TREE_FAULTS))},
    12: Kind("temperature", lambda w: f"must be finite and > 0 (temperature 0 is greedy: verify_accept), got "
                                      f"{_fp32(w[1])} at request {w[0]}{DEVICE}"),
    13: Kind("draft_probs", lambda w: f"must be finite and >= 0, got {_fp32(w[3])} at [{w[0]}, {w[1]}, {w[2]}]"
                                      f"{DEVICE}"),
    14: Kind("target_logits", lambda w: f"has NaN or +inf: {_fp32(w[3])} at [{w[0]}, {w[1]}, {w[2]}]{DEVICE}"),
    15: Kind("target_logits", lambda w: f"a row is all -inf: no token has target probability (row [{w[0]}, "
                                        f"{w[1]}]){DEVICE}"),
    16: Kind("uniforms", lambda w: f"must lie in [0, 1), got {_fp32(w[2])} at [{w[0]}, {w[1]}]{DEVICE}"),
    # verify_attention: the host check's types (reference.verify_attention.chain.validate)
    17: Kind("qo_indptr", lambda w: f"must rise from 0 to num_tokens {w[3]}, got request {w[0]}'s rows "
                                    f"[{w[1]}, {w[2]}){DEVICE}", VerifyParityInputError),
    18: Kind("qo_indptr", lambda w: f"every request needs at least one draft token, got request {w[0]}'s rows "
                                    f"[{w[1]}, {w[1]}){DEVICE}", VerifyParityInputError),
    19: Kind("kv_indptr", lambda w: f"must rise from 0 to at most len(kv_indices) {w[3]}, got request {w[0]}'s "
                                    f"slots [{w[1]}, {w[2]}){DEVICE}", VerifyParityInputError),
    20: Kind("kv_indices", lambda w: f"entry {w[0]} outside [0, {w[1]}){DEVICE}"),
    21: Kind("qo_indptr", lambda w: f"request {w[0]}'s rows [{w[1]}, {w[2]}) are not [{w[0]}·{w[3]}, "
                                    f"({w[0]} + 1)·{w[3]}) of its uniform width {w[3]}{DEVICE}"),
    # mla_fp8_prepare_step: reference.mla_fp8_prepare.chain.validate_pool's checks, in its order
    22: Kind("slot_map", lambda w: f"entry {w[0]} outside [0, {w[1]}){DEVICE}"),
    23: Kind("slot_map", lambda w: f"{DUPLICATE_MESSAGE}: slot {w[0]}{DEVICE}"),
    24: Kind("out_cache_loc", lambda w: f"entry {w[0]} outside [0, {w[1]}){DEVICE}"),
    25: Kind("out_cache_loc", lambda w: f"{DUPLICATE_MESSAGE}: slot {w[0]}{DEVICE}"),
    26: Kind("decode_kernel_loc", lambda w: f"entry {w[0]} outside [0, {w[1]}){DEVICE}"),
    27: Kind("decode_kernel_loc", lambda w: f"{DUPLICATE_MESSAGE}: slot {w[0]}{DEVICE}"),
}
assert sorted(KINDS) == list(range(N_KINDS))


@triton.jit
def note(flag_ptr, KIND: tl.constexpr, hit, w0, w1, w2, w3):
    """Record kind ``KIND`` when the scalar ``hit`` holds: set its bit; the first program to set it
    (since the record was last cleared) also writes its words ``w0..w3`` (as many as the kind has)."""
    bit = tl.full((), 1, tl.int64) << KIND
    old = tl.atomic_or(flag_ptr, bit, mask=hit)
    first = hit & ((old & bit) == 0)
    if KIND == 0:
        at = flag_ptr + 1
    elif KIND == 1:
        at = flag_ptr + 3
    elif KIND == 2:
        at = flag_ptr + 5
    else:
        at = flag_ptr + 6 + 4 * (KIND - 3)
    tl.store(at, tl.cast(w0, tl.int64), mask=first)
    if KIND != 2:
        tl.store(at + 1, tl.cast(w1, tl.int64), mask=first)
    if KIND > 2:
        tl.store(at + 2, tl.cast(w2, tl.int64), mask=first)
        tl.store(at + 3, tl.cast(w3, tl.int64), mask=first)


_records: dict[torch.device, torch.Tensor] = {}


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def record(device: torch.device) -> torch.Tensor:
    """This device's error record (allocated zeroed on first use, then the same tensor: a captured
    CUDA graph keeps writing the one it captured). Allocated inside a capture, its zeroing would be
    captured too and rerun by every replay: a graph's first device-checked call must come after one
    outside it (or after ``record(device)``)."""
    rec = _records.get(device)
    if rec is None:
        if _capturing():
            raise UnsupportedError("checked", "the first checked='device' call on a device is being captured "
                                              "into a CUDA graph: call fused.device_checks.record(device) (or "
                                              "the op once) before capturing")
        rec = _records[device] = torch.zeros(FLAG_WORDS, dtype=torch.int64, device=device)
    return rec


def pending(device: torch.device | None = None) -> list[RangeError]:
    """The errors recorded on ``device`` (every device used so far when None), in ``KINDS`` order,
    and the record cleared. One host sync per device; none while a CUDA graph is being captured (the
    record cannot be read then: it keeps what it holds for the next call outside the capture)."""
    errors = []
    if _capturing():
        return errors
    for dev, rec in list(_records.items()):
        if device is not None and torch.device(device) != dev:
            continue
        words = rec.tolist()
        bits = words[0]
        if not bits:
            continue
        rec.zero_()
        for k, kind in KINDS.items():
            if bits & (1 << k):
                at, n = word_of(k)
                errors.append(kind.error(kind.arg, kind.message(words[at:at + n])))
    return errors


def raise_pending(device: torch.device | None = None) -> None:
    """Raise the first error the kernels recorded since the last call (``pending``), if any."""
    errors = pending(device)
    if errors:
        raise errors[0]
