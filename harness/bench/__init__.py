"""Benchmarks (not tests), run on a GPU: one module per op (``python -m harness.bench.<op>``),
all of them with ``python -m harness.bench``; shared parts in ``harness.bench.perf``. Tools beside
them: ``sweep`` (block configs of verify_attention) and ``wrapper_checks`` (the host cost of the
wrappers' argument checks)."""
