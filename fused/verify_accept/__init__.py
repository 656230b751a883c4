"""``verify_accept``, greedy chain acceptance after the target forward: the Triton side (wrapper)."""
