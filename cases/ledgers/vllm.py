"""Known failures of vLLM 0.34.0's kernels (``harness.adapters.vllm``): real defects, each with a standalone
repro that fails without the harness, kept as data so that ``nox -s vllm`` fails on anything else.

Empty for now. The one known candidate, the one-head MLA decode path's bf16 products and bf16 sum
(docs/vllm.md, "One query head"), fails 5 of 7 one-head cases on the CPU (the interpreter shim computes bf16
as compiled Triton does), depending on the data: its entry waits for a standalone repro on a GPU and a
condition that sees the inputs (``harness.ledger.KnownFailureOnInputs``).
"""
from __future__ import annotations

LEDGER = ()
