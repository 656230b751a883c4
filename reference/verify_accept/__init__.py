"""``verify_accept``, greedy chain acceptance after the target forward: the pure-PyTorch side (chain)."""
