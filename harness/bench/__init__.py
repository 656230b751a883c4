"""Benchmarks (not tests), run on a GPU: each op's in ``cases/<op>/bench.py`` (``python -m cases.<op>.bench``),
all of them with ``python -m harness.bench``; shared parts in ``harness.bench.perf`` (the driver; the
PerfRows and tables from timings are ``perf_rows``, the wide rows' shared columns ``wide_rows``). Tools
beside them: ``sweep`` (block configs of verify_attention) and ``wrapper_checks`` (the host cost of the
wrappers' argument checks)."""
