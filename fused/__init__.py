"""Triton kernels, their launch wrappers, and the dispatch gates (pure functions).

Importing this package decides interpreter vs compiler for every kernel below it (Triton
makes that choice when ``@triton.jit`` runs), so it asks ``harness.devices`` first.
"""
from harness.devices import prepare_triton as _prepare_triton

_prepare_triton()
