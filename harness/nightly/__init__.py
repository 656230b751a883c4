"""``python -m harness nightly``: ``run`` (the command), ``plan`` (its steps, pure), ``steps`` (the
subprocesses, their time limits and the report step) and ``mps`` (a private CUDA MPS daemon)."""
