"""GPU-only mutants of ``verify_attention`` (``harness.gpu.mutants``): the right numbers computed the wrong way."""
from __future__ import annotations

import itertools

from harness.gpu.mutants import LAUNCHES, gate_flips_per_call
from harness.registry import Impl


# ----------------------------------------------------------------------------- verify_attention

def _verify_falls_through(**kw):
    """The backend's routed kernel, then the split-KV kernel again into a fresh ``o``."""
    from fused.verify_attention import wrapper as f

    out = f.verify_attention(**kw)
    if kw.get("topk", 1) == 1 and f.can_handle("split_kv", **kw) is True:
        out = f.verify_split_kv(**kw)  # BUG: no return after the first kernel succeeded
    return out


# ----------------------------------------------------------------------------- a gate that flips per call

_VERIFY_CALLS = itertools.count()


def flipping_verify_gate(*, model_family, topk, use_mla, splitkv_switch, num_local_kv_heads):
    """``fused.verify_attention.wrapper.gate`` whose shared-KV choice is dropped on every other call."""
    from fused.verify_attention import wrapper as f

    route = f.gate(model_family=model_family, topk=topk, use_mla=use_mla, splitkv_switch=splitkv_switch,
                   num_local_kv_heads=num_local_kv_heads)
    if route.shared_kv and next(_VERIFY_CALLS) % 2:  # BUG: a switch read at call time
        return f.VerifyRoute(shared_kv=False, split_kv=route.split_kv)
    return route


MUTANTS = [
    Impl("verify_attention", "mutant-dispatch-falls-through", "mutant", _verify_falls_through,
         doc="the backend runs the routed kernel, then the split-KV kernel too (missing return): same o, "
             "twice the launches", catches=(LAUNCHES,)),
    gate_flips_per_call("verify_attention", "verify_attention", flipping_verify_gate,
                        "shared-KV vs split-KV decided by a switch read at call time (a counter): capture and "
                        "replay-time eager disagree"),
]
