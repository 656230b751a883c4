"""Benchmarks (not tests): one script per op, run on a GPU."""
