"""Known failures of SGLang 0.5.23's kernels (``harness.adapters.sglang``): real defects the harness found,
kept as data so that ``nox -s sglang`` fails on anything else, and on either of these disappearing.

Both were found on the H200 (compiled) and on the CPU (interpreter); neither is filed upstream yet, so
``upstream`` names the release, file and function where the defect lives.
"""
from __future__ import annotations

from cases.verify_attention import catalog as va
from harness.ledger import KnownFailure

# SGLang's split-KV partition (verify_splitkv.py): N_SPLITS from the batch's average prefix length,
# each split a multiple of 32 keys.
_MIN_BLOCK_KV = 32


def _splitkv_splits(avg: float) -> int:
    return 4 if avg < 4096 else 8 if avg < 8192 else 16


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _has_unwritten_split(case) -> bool:
    """Some request with a prefix (n > 0) leaves its last split without keys: with split_len =
    cdiv(cdiv(n, S), 32)·32, split S − 1 starts at split_len·(S − 1) >= n."""
    lens = va.prefix_lengths(case.prefix, case.B, case.seed)
    S = _splitkv_splits(sum(lens) / case.B)
    return any(n > 0 and _cdiv(_cdiv(n, S), _MIN_BLOCK_KV) * _MIN_BLOCK_KV * (S - 1) >= n for n in lens)


def _has_empty_prefix(case) -> bool:
    return 0 in va.prefix_lengths(case.prefix, case.B, case.seed)


LEDGER = (
    KnownFailure(
        id="sglang-splitkv-stale-scratch", op="verify_attention", impls=("sglang-split-kv",),
        checks=("finite:o*", "determinism"), when=_has_unwritten_split,
        pattern="a request whose prefix leaves one of the N_SPLITS splits (4/8/16 by average prefix, multiples of "
                "32 keys) without keys",
        cause="a split with no keys stores only its -inf LSE; the combine loads that split's partial output, "
              "never written, and weights it by exp(-inf) = 0: 0 x NaN (or Inf) left in the scratch is NaN. "
              "Seen or not depending on leftover memory; always under the poisoned allocator",
        upstream="sglang 0.5.23 sglang/kernels/ops/attention/verify_splitkv.py::_verify_prefix_stage1 "
                 "(else branch: LSE only) and ::_verify_combine_stage2 (loads Att_Out of every split)"),
    KnownFailure(
        id="sglang-empty-prefix-nan", op="verify_attention", impls=("sglang-split-kv", "sglang-shared-kv"),
        checks=("finite:o*",), when=_has_empty_prefix,
        pattern="a request with an empty prefix (n = 0) in the batch",
        cause="0/0: with no prefix key the prefix part's LSE is -inf and its weight exp(-inf - -inf) is NaN "
              "(split-KV: the split combine; shared-KV: the split's acc / e_sum = 0/0). SGLang's backend never "
              "sends prefix 0, but the kernels accept it",
        upstream="sglang 0.5.23 sglang/kernels/ops/attention/verify_splitkv.py::_verify_combine_stage2 (m_p = "
                 "-inf) and verify_mla.py::_verify_mla_prefix_stage1 (acc / e_sum with e_sum = 0)"),
)
