"""``verify_tree_accept``, greedy acceptance of a draft tree after the target forward: its spec and registrations and what the harness checks it with (bad_inputs, bench, catalog, mutants, spec)."""
