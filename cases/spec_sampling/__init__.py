"""``spec_sampling``, chain speculative sampling after the target forward: its spec and registrations and what the harness checks it with (bad_inputs, catalog, distribution, mutants, spec)."""
