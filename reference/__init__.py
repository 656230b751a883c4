"""Pure-PyTorch unfused reference chains and fp64 oracles (no Triton import anywhere here)."""
