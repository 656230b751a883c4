"""Known failures of vLLM 0.34.0's kernels (``harness.adapters.vllm``): real defects, each with a standalone
repro that fails without the harness, kept as data so that ``nox -s vllm`` fails on anything else.

Empty: on the CPU (2 cores, triton 3.9, the ci catalog) no adapter fails. The one candidate, the one-head
MLA decode path's bf16 products (docs/vllm.md, the one-head MLA finding), fails on some cases only, depending on
the data (q's scale, the sum's cancellation): a case-only condition cannot list it exactly, and it awaits
the H200 run of ``.gpu/vllm.sh`` and a ledger entry whose condition sees the inputs.
"""
from __future__ import annotations

LEDGER = ()
