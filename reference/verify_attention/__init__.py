"""``verify_attention``, target-verify attention over a paged prefix + drafts (seeds 002, 003): the pure-PyTorch side (batched, chain, masks, oracle, sdpa)."""
