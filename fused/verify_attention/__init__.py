"""``verify_attention``, target-verify attention over a paged prefix + drafts (seeds 002, 003): the Triton side (config, kernels, wrapper)."""
