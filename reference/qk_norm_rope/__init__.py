"""``qk_norm_rope``, qk RMSNorm + RoPE (DeepSeek-V4 MQA; seed 000): the pure-PyTorch side (chain, swa)."""
