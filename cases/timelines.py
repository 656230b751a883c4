"""Store-timing timelines (DESIGN.md): model families, named timelines and a hypothesis strategy.

A timeline is a script of batches, each one forward mode over some of the requests:
  ``P:r.c``  prefill (extend) a chunk of c tokens for request r
  ``D:r``    decode one token (1-source: store, then attend over the ring)
  ``V:r.a``  target-verify L tokens (2-source) and accept the first a of them, 0 <= a <= L;
             the rest are rejected and rolled back: their KV must never be visible again. On a
             tree family (``Family.topk`` > 1) the L tokens are a draft tree of ``Family.depth``
             levels and the accepted ones a root-to-node path of a nodes, 0 <= a <= depth
             (``harness.timelines.tree``).
Batches are ``;``-separated, requests inside one batch ``+``-separated, e.g.
``P:0.5+1.2;V:0.3+1.0;D:0+1``. A request in no batch idles; requests at different positions
share a batch ("mixed"); ``pad`` padded tokens (loc = -1) ride along in every prepare launch.
The string form keeps the case id parseable (``cases.base.case_id``), so every generated
timeline re-runs from its id.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from cases.base import composite
from cases.timeline_family import Family
from harness.ops import BUILTIN

MODES = {"P": "extend", "D": "decode", "V": "target_verify"}


# every family: first those of a fused prepare step, declared by their op (``TIMELINE_FAMILIES`` of
# cases/<op>/catalog.py, in harness.ops.BUILTIN order), then those with plain q/k/v projections
FAMILIES: dict[str, Family] = {f.name: f for op in BUILTIN
                               for f in getattr(importlib.import_module(f"cases.{op}.catalog"), "TIMELINE_FAMILIES", ())}
FAMILIES |= {
    # Qwen3.5 GQA, one local KV head: shared-KV kernel (seed 002), post-attention store. The
    # nightly's lightest family (one layer, no prepare kernel; 128-136 s for 505 runs on two workers
    # of the H200 host, against 336-358 s for dsv4-mqa-mixed's 1,002 on one): half the workers, so
    # that the mixed step can have two within the same process count
    "qwen35-gqa": Family("qwen35-gqa", "paged", "projection", H=4, Hkv=1, D=64, Dv=64, rope_dim=0,
                         causal=True, model_family="qwen3.5", verify_store="post", nightly_weight=0.5),
    # DSpark draft attention: several KV heads, non-causal drafts (seed 003), ring
    "dspark-noncausal": Family("dspark-noncausal", "ring", "projection", H=8, Hkv=4, D=64, Dv=64, rope_dim=0,
                               causal=False, model_family="dspark-draft", verify_store="pre"),
    # Qwen3.5 GQA under an EAGLE draft tree (top-k 2, depth 3; SGLang's EAGLE-2/3 default is a tree): the
    # verify chunk's L nodes attend under the tree mask (verify_attention's custom_mask; its gate takes the
    # generic path at topk > 1), the tree acceptance op picks a root-to-node path and the backend keeps
    # exactly that path's slots in path order. Paged (a ring would put siblings in one slot: Family). In
    # qwen35-gqa's nightly step: one layer's worth of work, a twin's
    "qwen35-gqa-tree": Family("qwen35-gqa-tree", "paged", "projection", H=4, Hkv=1, D=64, Dv=64, rope_dim=0,
                              causal=True, model_family="qwen3.5", verify_store="post", topk=2, depth=3,
                              nightly_with="qwen35-gqa"),
}


@dataclass(frozen=True)
class Timeline:
    family: str = "dsv4-mqa-ring"
    steps: str = "P:0.4;V:0.2"  # see the module docstring
    L: int = 3  # verify width (uniform: the kernels index drafts as b·L + i)
    window: int = 8  # W: committed history each chunk attends to
    pad: int = 0  # padded tokens per prepare launch
    translated: bool = True  # only where the family has a pool that translates (k3)
    resolve_loc: bool = True  # k3: the capture-stable physical write loc resolves (else the fallback writes)
    act_scale: float = 1.0  # activation magnitude (1e-3 puts mean(x²) near eps: the eps-placement bug shows)
    seed: int = 0
    name: str = ""


def parse_steps(steps: str) -> list[tuple[str, list[tuple[int, int]]]]:
    """``P:0.5+1.2;D:0`` -> [("extend", [(0, 5), (1, 2)]), ("decode", [(0, 0)])]."""
    out = []
    for batch in filter(None, steps.split(";")):
        kind, colon, reqs = batch.partition(":")
        if not colon or kind not in MODES:
            raise ValueError(f"timeline batch {batch!r}: expected KIND:requests with KIND one of {', '.join(MODES)}")
        items = []
        for it in reqs.split("+"):
            r, _, a = it.partition(".")
            try:
                items.append((int(r), int(a or 0)))
            except ValueError:
                raise ValueError(f"timeline batch {batch!r}: {it!r} is not REQUEST or REQUEST.TOKENS") from None
        if len({r for r, _ in items}) != len(items):
            raise ValueError(f"timeline batch {batch!r}: a request appears twice")
        out.append((MODES[kind], items))
    return out


def num_requests(t: Timeline) -> int:
    return 1 + max(r for _, items in parse_steps(t.steps) for r, _ in items)


def max_len(t: Timeline) -> int:
    """Longest position count any request reaches (chunk included)."""
    n = [0] * num_requests(t)
    top = 0
    for mode, items in parse_steps(t.steps):
        for r, a in items:
            c = a if mode == "extend" else 1 if mode == "decode" else t.L
            top = max(top, n[r] + c)
            n[r] += a if mode == "target_verify" else c
    return top


def validate(t: Timeline) -> None:
    if t.family not in FAMILIES:
        raise ValueError(f"family: expected one of {sorted(FAMILIES)}, got {t.family!r}")
    fam = FAMILIES[t.family]
    if fam.tree and not fam.depth <= t.L <= fam.max_nodes():
        raise ValueError(f"L: family {fam.name} verifies trees of depth {fam.depth}, top-k {fam.topk}: "
                         f"{fam.depth} <= L <= {fam.max_nodes()}, got {t.L}")
    seen = set()
    for mode, items in parse_steps(t.steps):
        for r, a in items:
            if mode == "extend":
                if a < 1 or r in seen:
                    raise ValueError(f"request {r}: prefill once, with at least one token")
                seen.add(r)
            elif r not in seen:
                raise ValueError(f"request {r}: {mode} before its prefill")
            if mode == "target_verify" and not 0 <= a <= t.L:
                raise ValueError(f"request {r}: accepted {a} outside [0, L={t.L}]")
            if mode == "target_verify" and fam.tree and a > fam.depth:
                raise ValueError(f"request {r}: accepted {a} past the tree's depth {fam.depth} (family {fam.name})")


# ----------------------------------------------------------------------------- named timelines

_SCRIPTS = {
    # every accept count 0..L once, rollback after each partial accept, decode in between
    "accept-0-to-L": ("P:0.5;V:0.0;V:0.1;D:0;V:0.2;V:0.3;D:0", 3, 6),
    # the ring wraps (C = W + L = 7) several times; verify right at the window edge
    "wrap-around": ("P:0.4;V:0.3;V:0.3;D:0;V:0.2;V:0.3;V:0.1;D:0;V:0.3;V:0.0;V:0.3", 3, 4),
    # three requests at different positions in one batch, padded launches, one idle at times
    "mixed-padded": ("P:0.6;P:1.1;V:0.2+1.3;P:2.3;D:0+1+2;V:0.0+1.3+2.1;V:1.2+2.3;D:0+2", 3, 5),
    # width 1 (a verify is a 2-source decode) and width 4
    "width-1": ("P:0.3;V:0.1;V:0.0;V:0.1;D:0", 1, 4),
    "width-4-reject": ("P:0.2+1.7;V:0.4+1.0;V:0.1+1.2;D:0+1;V:0.3+1.4", 4, 5),
}


# a tree family's (top-k 2, depth 3): V:r.a accepts a root-to-node path of a nodes, 0 <= a <= depth
_TREE_SCRIPTS = {
    # every accepted depth 0..3 once (the path mutants' timeline: ``cases.mutants.timelines.PATH_TIMELINE``),
    # a decode between (it reads the committed path as history), L = 6 nodes of a possible 14
    "accept-0-to-L": ("P:0.5;V:0.0;V:0.1;D:0;V:0.2;V:0.3;D:0", 6, 6),
    # the fullest tree (14 nodes: every node has top-k children), two requests
    "full-tree": ("P:0.4+1.3;V:0.3+1.2;D:0+1;V:0.1+1.3;V:0.3+1.0", 14, 6),
    # a chain-shaped tree (L = depth: the spine only, one child a node)
    "spine-only": ("P:0.2;V:0.3;V:0.1;D:0;V:0.2", 3, 4),
    # three requests at different positions, padding, prefill and decode between verify batches, the
    # window shorter than the history
    "mixed-padded": ("P:0.6;P:1.1;V:0.2+1.3;P:2.3;D:0+1+2;V:0.0+1.3+2.1;V:1.2+2.3;D:0+2", 5, 5),
}


def _named(family: str) -> list[Timeline]:
    out = []
    if FAMILIES[family].tree:
        for name, (steps, L, W) in _TREE_SCRIPTS.items():
            out.append(Timeline(family=family, steps=steps, L=L, window=W, pad=2 if name == "mixed-padded" else 0,
                                seed=len(out), name=f"{family}/{name}"))
        return out
    for name, (steps, L, W) in _SCRIPTS.items():
        if FAMILIES[family].q_weight and name != "accept-0-to-L":
            continue  # a q-weighted twin's one script (every accept count, decode between): the rest is its twin's
        if FAMILIES[family].non_unified_layers and not FAMILIES[family].q_weight and name != "mixed-padded":
            continue  # a mixed stack's one script (3 requests, padding, accepts 0..L, decode): CI time
        pad = 2 if name == "mixed-padded" else 0
        out.append(Timeline(family=family, steps=steps, L=L, window=W, pad=pad, seed=len(out),
                            name=f"{family}/{name}"))
    return out


def catalog() -> list[Timeline]:
    """Named timelines: every script in every family, plus family-specific ones."""
    out = [t for f in FAMILIES for t in _named(f)]
    out += [
        # eps inside vs outside the square root only shows when mean(x²) ~ eps
        Timeline(family="dsv4-mqa-ring", steps="P:0.3;D:0;V:0.2;D:0", L=2, window=4, act_scale=1e-3,
                 name="dsv4-mqa-ring/tiny-activations"),
        # no resolvable capture-stable write loc: the fallback chain must write every row once
        Timeline(family="k3-mla-fp8", steps="P:0.3+1.2;V:0.1+1.3;D:0+1;V:0.0+1.2", L=3, window=5,
                 resolve_loc=False, pad=1, name="k3-mla-fp8/fallback-write"),
        # the same pool without translation (identity slot map)
        Timeline(family="k3-mla-fp8", steps="P:0.4;V:0.2;V:0.3;D:0", L=3, window=5, translated=False,
                 name="k3-mla-fp8/untranslated-pool"),
    ]
    for t in out:
        validate(t)
    return out


# ----------------------------------------------------------------------------- strategy

@composite
def timelines(draw, *, family: str | None = None, max_requests: int = 3, max_batches: int = 6,
              max_width: int = 4) -> Timeline:
    """A random valid timeline: requests prefilled at different times, then decode/verify
    batches over random subsets of the prefilled requests with random accept counts."""
    from hypothesis import strategies as st

    fam = family or draw(st.sampled_from(sorted(FAMILIES)))
    B = draw(st.integers(1, max_requests))
    tree = FAMILIES[fam]
    if tree.tree:  # L nodes (depth … its widest); accepts 0 … depth
        L = draw(st.integers(tree.depth, min(tree.max_nodes(), max(tree.depth, 2 * max_width))))
    else:
        L = draw(st.integers(1, max_width))
    top = tree.depth if tree.tree else L
    W = draw(st.integers(2, 9))
    order = list(range(B))
    batches, live = [], []
    pending = order[:]
    n_batches = draw(st.integers(2, max_batches))
    for i in range(n_batches + B):
        if pending and (not live or draw(st.booleans())):
            r = pending.pop(0)
            batches.append(f"P:{r}.{draw(st.integers(1, 7))}")
            live.append(r)
            continue
        if i >= n_batches + B - 1 and pending:
            continue
        subset = draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        if draw(st.integers(0, 3)) == 0:
            batches.append("D:" + "+".join(str(r) for r in sorted(subset)))
        else:
            batches.append("V:" + "+".join(f"{r}.{draw(st.integers(0, top))}" for r in sorted(subset)))
    if not any(b.startswith("V") for b in batches):
        batches.append("V:" + f"{live[0]}.{draw(st.integers(0, top))}")
    t = Timeline(family=fam, steps=";".join(batches), L=L, window=W, pad=draw(st.integers(0, 2)),
                 translated=draw(st.booleans()), resolve_loc=draw(st.integers(0, 3)) > 0,
                 seed=draw(st.integers(0, 2 ** 16)))
    validate(t)
    return t
