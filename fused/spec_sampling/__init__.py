"""``spec_sampling``, chain speculative sampling after the target forward: the Triton side (wrapper)."""
