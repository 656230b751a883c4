"""Registry entry for ``verify_tree_accept``: its OpSpec and built-in implementations.

Contract: exact. ``predicts`` (B·N,), ``accept_index`` (B, S) and ``accept_token_num`` (B,) int32
equal the reference chain's element for element (``reference.verify_tree_accept.chain``: the walk,
the tie rule between siblings, the bonus, padding requests). No buffer is written in place, so
there are no effects; every input must keep its bytes.
"""
from __future__ import annotations

import functools

from harness.ops import stem_spec
from harness.registry import Deferred, GpuPlan, Impl, KillPlan, OpSpec, OutputSpec, Registry

OP = "verify_tree_accept"

# kill matrix: the targeted catalog subset, one case per mutant's bug (a later duplicate sibling, the
# accepted child last in its list, a path through non-consecutive nodes, cousins carrying the target
# token, rows permuted within their block), and the draft-tree timeline (role tree-accept)
KILL = KillPlan(clean=("reference", "fused"),
                cases=("duplicate-siblings", "match-last-sibling", "bfs-path-any-sibling", "cousin-decoys",
                       "shuffled-rows"),
                # the tree family's accept step: the path its backend commits (a path through a later sibling)
                timelines=("qwen35-gqa-tree/accept-0-to-L",))

STAGES = ("row_argmax", "gather_targets", "tree_parents", "match", "first_matches", "accept_path", "write_predicts")


# GPU-only checks (harness.gpu.runners): one program per request; the chain's seven launch functions
# (tree_parents and accept_path loop over slots and levels inside one call). Both are captured: the
# only sync is validate's host copy, which ``capture_safe`` turns off. No dispatch gate
GPU = GpuPlan(("eagle-k8-d5-n64-v32000",), "b64-k8-d5-n64-v128256", 1, STAGES, lambda c, kw: len(STAGES),
              "verify_tree_accept")


def _no_effects(case, inputs, oracle):
    return []


def _fused(**kw):
    from fused.verify_tree_accept import wrapper as f

    return f.verify_tree_accept(**kw)


def chain_body(target_logits, candidates, retrive_index, retrive_next_token, retrive_next_sibling, S: int):
    """The chain's seven launches without validation (what torch.compile gets, and the benchmark)."""
    from reference.verify_tree_accept import chain as r

    predict = r.row_argmax(target_logits, candidates.numel())
    target = r.gather_targets(predict, retrive_index)
    parent, rank = r.tree_parents(retrive_next_token, retrive_next_sibling)
    chosen = r.first_matches(r.match(candidates, target, parent), parent, rank)
    acc, n = r.accept_path(chosen, parent, retrive_index, S)
    return r.write_predicts(predict, acc), acc, n


@functools.cache
def compiled_chain():
    """torch.compile of ``chain_body`` (dynamic shapes; N and S, loop bounds, specialise)."""
    import torch

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(chain_body, dynamic=True)


def _compiled(*, target_logits, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
              num_speculative_tokens):
    """torch.compile of the reference chain's seven launches (validation outside: it reads values)."""
    from reference.verify_tree_accept import chain as r

    kw = dict(candidates=candidates, retrive_index=retrive_index, retrive_next_token=retrive_next_token,
              retrive_next_sibling=retrive_next_sibling)
    *_, S = r.validate(target_logits=target_logits, num_speculative_tokens=num_speculative_tokens, **kw)
    p, acc, n = compiled_chain()(target_logits, *kw.values(), S)
    return {"predicts": p, "accept_index": acc, "accept_token_num": n}


def _spec() -> OpSpec:
    return stem_spec(
        OP, case_type="VerifyTreeAcceptCase", reference="verify_tree_accept",
        outputs=(OutputSpec("predicts", "exact"), OutputSpec("accept_index", "exact"),
                 OutputSpec("accept_token_num", "exact")),
        effects=_no_effects,
        inputs=("target_logits", "candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling",
                "num_speculative_tokens"),
        doc="greedy acceptance of a draft tree (first-child / next-sibling layout, SGLang's verify_tree_greedy): "
            "the first matching child in sibling-list order at each level, the bonus at the last accepted row, "
            "accept_index padded with -1",
        kill=KILL,
        gpu=GPU,
        role="tree-accept",  # the accept step of the tree timeline families (cases.timelines): the path committed
        nightly_group="acceptance",  # a light acceptance op: one parity step for the group
        parity_weight=0.5,  # integer outputs compared exactly, like verify_accept: cheap per case
        interpreter_generated=150,
    )


def register(reg: Registry) -> None:
    reg.add_op(_spec())
    reg.add(Impl(OP, "reference", "reference", Deferred("reference.verify_tree_accept.chain:verify_tree_accept"),
                 doc="seven launches: argmax, gather per node, parents and sibling ranks, match, first match "
                     "among siblings, the level walk, predicts"))
    reg.add(Impl(OP, "fused", "fused", _fused,
                 doc="one Triton launch: a program per request walks the tree, argmax only of the rows on its path"))
    reg.add(Impl(OP, "compiled", "compiled", _compiled,
                 doc="torch.compile(dynamic=True) of the reference chain's seven launches"))
