"""``spec_sampling``, chain speculative sampling after the target forward: the pure-PyTorch side (chain, oracle)."""
