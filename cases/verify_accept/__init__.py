"""``verify_accept``, greedy chain acceptance after the target forward: its spec and registrations and what the harness checks it with (bad_inputs, bench, catalog, mutants, spec)."""
