"""``verify_tree_accept``, greedy acceptance of a draft tree after the target forward: the Triton side (wrapper)."""
