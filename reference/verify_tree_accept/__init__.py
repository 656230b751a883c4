"""``verify_tree_accept``, greedy acceptance of a draft tree after the target forward: the pure-PyTorch side (chain, oracle)."""
