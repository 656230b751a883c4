"""The DeepSeek-V4 shape of qk_norm_rope's benchmarks (``cases.qk_norm_rope.bench`` and its ``--vs-sglang``
table, ``cases.qk_norm_rope.bench_vs_sglang``) and the reference chain at that shape, shared by both."""
from __future__ import annotations

D, R, ROPE_STYLE, EPS = 512, 64, "interleaved", 1e-6  # DeepSeek-V4


def reference_chain(q, kv, kv_norm_weight, cos, sin, positions):
    """The reference chain's two launches (what torch.compile gets); no validation."""
    from reference.qk_norm_rope import chain as r

    q_out = r.q_norm_rope(q, None, EPS, cos, sin, positions, R, ROPE_STYLE)
    return q_out, r.kv_norm_rope(kv, kv_norm_weight, EPS, cos, sin, positions, R, ROPE_STYLE)
