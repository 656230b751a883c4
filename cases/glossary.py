"""Axis glossary: one name per axis, used by every op's cases, shapes and reports.

| axis          | symbol | meaning                                                          |
|---------------|--------|------------------------------------------------------------------|
| num_tokens    | T      | tokens in the launch; a verify batch has T = B·(L+1) or B·L       |
| num_heads     | H      | query heads local to one rank after tensor parallelism           |
| num_kv_heads  | Hkv    | KV heads local to one rank                                       |
| head_dim      | D      | q/k head dimension (MLA: 576 = 512 latent + 64 rope)             |
| v_head_dim    | Dv     | value head dimension (MLA: 512, the latent)                       |
| rope_dim      | R      | rotated dims, always the last R of D                              |
| batch         | B      | requests in a verify batch                                        |
| verify_width  | L      | draft tokens verified per request (topk = 1 chains)               |
| num_slots     | S      | rows of a KV pool or ring                                         |
"""
AXES = {
    "T": "num_tokens", "H": "num_heads", "Hkv": "num_kv_heads", "D": "head_dim", "Dv": "v_head_dim",
    "R": "rope_dim", "B": "batch", "L": "verify_width", "S": "num_slots",
}
