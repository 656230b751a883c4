"""``mla_fp8_prepare``, fp8 KV/Q prepare for Kimi-K3 absorbed MLA (seed 001): the pure-PyTorch side (chain, encoder)."""
