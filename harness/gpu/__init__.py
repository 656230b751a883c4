"""What only a GPU can check, and what a GPU run needs first: ``checks`` (``python -m harness gpu``:
launch counts, CUDA/HIP graph replay, full-size determinism) over ``runners``; the GPU-only mutants'
loader ``mutants``; measurement primitives ``profiling``; ``compile`` (every kernel compiled for
NVIDIA/AMD targets, no GPU needed) and ``warmup`` (every kernel variant of a plan compiled up front)."""
