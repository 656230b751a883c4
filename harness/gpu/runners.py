"""The GPU-only checks on one (implementation, case), and what makes a call capturable
(``harness.gpu.checks`` runs them over the ops and writes the rows).

  launches     device kernels of one call (``harness.gpu.profiling.count_launches``) against the
               design (each op's ``OpSpec.gpu``, called as a graph runs it). Fused: qk_norm_rope 1 (one grid (cdiv(T, BLOCK_T), H + 1) for q and kv,
               ``fused/qk_norm_rope/wrapper.py``); mla_fp8_prepare 1 (one grid for q8 and the KV rows,
               ``fused/mla_fp8_prepare/wrapper.py``); verify_attention 2 on every path — a prefix kernel
               (split-KV grid (B, H, S) or shared-KV grid (B, H/BLOCK_H, S)) plus one combine
               kernel, and the backend runs exactly one path (``fused/verify_attention/wrapper.py``).
               The reference chains are pure torch, where one launch of the unfused chain is
               several aten kernels; for them the check counts calls of the chain's launch
               functions listed in ``reference/<op>/chain.py`` — qk 2 (target-verify), mla 5, verify 3
               per request — and requires at least one device kernel per launch.
  graph        one call captured with ``torch.cuda.graph`` on static buffers; NEW inputs (another
               seed, same shapes) copied into them; replay. Outputs and the buffers the op writes
               (ring, KV pool) must be byte-identical to an eager call on those new inputs, the
               new inputs must change the outputs (else a stale graph would pass), and the gate's
               decision at capture must equal its decision for the replay inputs: a gate that
               reads a counter, a Python global or an environment switch at call time bakes one
               branch into the graph while eager takes the other.
  determinism  the fused op twice at full size on identical fresh inputs: bitwise equal outputs
               and buffers (the mla pool's write counts too).

"One call" is the implementation as a CUDA graph runs it (``capture_safe``): every call is
first made eagerly with full validation on the same inputs; after that, argument checks that
read tensor data (index ranges, uniqueness: a device→host sync, illegal in capture, with
kernels of their own) are off; the mla pool model's write counter (harness bookkeeping that
selects rows with a boolean mask, a sync) is off and the pool's bytes are compared instead; the
fp8 descale reciprocal is made once per value (a layer constant); the verify backend's host
metadata (uniform widths, prefix tokens) is that of the batch being captured, as SGLang's is.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass

import torch

from reference import checks, launches

REPLAY_SEED_OFFSET = 7919  # replay inputs: the case's seed + this + the run's seed


# ----------------------------------------------------------------------------- making a call capturable

@contextlib.contextmanager
def capture_safe(spec, inputs: dict):
    """Calls of the implementations of op ``spec`` (an ``OpSpec`` with a GPU plan) on ``inputs`` as a
    CUDA graph runs them (module docstring): the value checks off (``reference.checks.values_unchecked``)
    and the op's own capture context (``spec.gpu.capture``). Enter it only after a validated eager call
    on the same inputs."""
    with checks.values_unchecked(), spec.gpu.capture(inputs):
        yield


def gate_decisions():
    """A context that yields the list of decisions the dispatch gates take while the block runs
    (``fused.gates.recorded``: every call of the op's backend step, whatever ``gate_fn`` the caller
    passes). An op with no dispatch gate yields an empty list."""
    from fused import gates  # importing fused picks interpreter or compiler: after the device is chosen

    return gates.recorded()


def stage_calls():
    """A context that yields the list of the reference chain's launches called while the block runs
    (``reference.launches.counted``; ``OpSpec.gpu.stages`` names the op's)."""
    return launches.counted()


# ----------------------------------------------------------------------------- the checks

@dataclass(frozen=True)
class Outcome:
    check: str
    expected: str
    got: str
    passed: bool | None
    detail: str = ""


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Inputs:
    """Inputs of an op's cases, each built once (host RNG, then the transfer) and handed out as
    deep copies on the device: same bytes, strides and aliasing (MLA's V is a view of K)."""

    def __init__(self, spec, dev):
        self.spec, self.dev, self.built = spec, dev, {}

    def __call__(self, case) -> dict:
        if case not in self.built:
            self.built[case] = self.spec.build_inputs(case, self.dev)
        return copy.deepcopy(self.built[case])


def _snapshot(spec, out: dict, inputs: dict) -> dict:
    """Outputs and written buffers, on the host (taken right away: graph memory gets reused)."""
    snap = {f"out:{k}": (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else None)
            for k, v in out.items() if v is None or isinstance(v, torch.Tensor)}
    snap.update({f"buffer:{b}": inputs[b].detach().cpu().clone() for b in spec.writable
                 if isinstance(inputs.get(b), torch.Tensor)})
    return snap


def _copy_into(static: dict, new: dict) -> None:
    for k, t in static.items():
        n = new[k]
        if isinstance(t, torch.Tensor):
            if (t.shape, t.stride(), t.dtype) != (n.shape, n.stride(), n.dtype):
                raise ValueError(f"replay input {k}: {tuple(n.shape)}/{n.stride()}/{n.dtype} does not fit the "
                                 f"captured buffer {tuple(t.shape)}/{t.stride()}/{t.dtype}")
            t.copy_(n)
        elif t != n:
            raise ValueError(f"replay input {k}: {n!r} != captured {t!r} (host arguments are baked into the graph)")


def check_launches(spec, impl, case, dev, *, inputs=None, count=None, names=None) -> Outcome:
    """``count(fn)`` / ``names(fn)``: kernels of one call of ``fn`` and their names (default
    ``harness.gpu.profiling``; the tests pass an interpreter launch counter). ``inputs``: an
    ``Inputs`` to draw from (default: a fresh one)."""
    from harness.gpu import profiling

    count, names = count or profiling.count_launches, names or profiling.kernel_names
    plan = spec.gpu
    inputs = (inputs or Inputs(spec, dev))(case)
    impl.fn(**inputs)  # validated, compiles
    with capture_safe(spec, inputs):
        fn = lambda: impl.fn(**inputs)  # noqa: E731
        kernels = count(fn)
        if impl.kind == "reference":
            with stage_calls() as calls:
                fn()
                _sync()
            want = plan.expected_stages(case, inputs)
            got = f"{len(calls)} launches ({', '.join(sorted(set(calls)))}); {kernels} device kernels"
            return Outcome("gpu:launches", f"{want} launches of the chain, each >= 1 kernel", got,
                           len(calls) == want and kernels >= len(calls))
        launched = names(fn) if kernels != plan.fused_launches else []
    detail = "kernels: " + ", ".join(n[:60] for n in launched[:8]) if launched else ""
    return Outcome("gpu:launches", f"{plan.fused_launches} kernel(s)", f"{kernels} kernel(s)",
                   kernels == plan.fused_launches, detail)


def cuda_graph_capture(fn, before_capture):
    """Warm ``fn`` up on a side stream, call ``before_capture()``, capture one call of ``fn`` in a
    CUDA/HIP graph. Returns (the captured call's outputs, replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # allocator warm-up, kernels compiled, caches filled
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return out, graph.replay


def check_graph(spec, impl, case, dev, seed: int, *, inputs=None, capture=cuda_graph_capture) -> list[Outcome]:
    """``capture(fn, before_capture) -> (outputs, replay)``: ``cuda_graph_capture`` (the tests
    pass a stand-in that replays the captured gate decision on the CPU)."""
    op = spec.name
    if impl.kind == "reference" and spec.gpu.reference_not_capturable:
        why = f"reference chain not capturable: {spec.gpu.reference_not_capturable}"
        return [Outcome("gpu:graph-replay", "-", "-", None, why), Outcome("gpu:graph-gate", "-", "-", None, why)]
    inputs = inputs or Inputs(spec, dev)
    replay_case = dataclasses.replace(case, seed=case.seed + REPLAY_SEED_OFFSET + seed)
    static = inputs(case)
    before = _snapshot(spec, impl.fn(**static), static)  # validated; the capture inputs' own outputs
    impl.fn(**inputs(replay_case))  # validated: the replay inputs are legal too
    new, eager_in = inputs(replay_case), inputs(replay_case)
    _sync()
    with capture_safe(spec, static), gate_decisions() as log:
        mark = []
        graph_out, replay = capture(lambda: impl.fn(**static), lambda: mark.append(len(log)))
        at_capture = log[mark[0]:]
    _copy_into(static, new)
    replay()
    _sync()
    replayed = _snapshot(spec, graph_out, static)
    del graph_out, replay
    with capture_safe(spec, eager_in), gate_decisions() as eager_log:
        eager = _snapshot(spec, impl.fn(**eager_in), eager_in)
    _sync()
    return graph_outcomes(op, before=before, replayed=replayed, eager=eager, at_capture=at_capture,
                          at_eager=eager_log, step=spec.gpu.step)


def graph_outcomes(op: str, *, before: dict, replayed: dict, eager: dict, at_capture: list, at_eager: list,
                   step: str = "step") -> list[Outcome]:
    """The two graph rows from snapshots (``_snapshot``) and gate logs: replay vs eager on the
    new inputs, bytewise, and not vacuous (the new inputs change the outputs); the gate's
    decisions at capture vs for the new inputs."""
    from harness import compare

    rec = compare.bitwise_equal("gpu:graph-replay", replayed, eager)
    outs = [k for k in eager if k.startswith("out:") and eager[k] is not None]
    live = not compare.bitwise_equal("", {k: before.get(k) for k in outs}, {k: eager[k] for k in outs}).passed
    detail = rec.detail + (f" [{rec.worst}]" if rec.worst else "")
    if not live:
        detail = "the replay inputs gave the capture inputs' outputs: a stale graph would pass. " + detail
    compared = ", ".join(k for k in sorted(eager) if eager[k] is not None)
    replay = Outcome("gpu:graph-replay", f"replay == eager on the new inputs (bytes of {compared})",
                     "equal" if rec.passed else "differs", rec.passed and live, detail.strip())
    if not at_capture and not at_eager:
        why = (f"no gate decision observed (the implementation does not call fused.{op}.{step}, "
               f"or the op has no dispatch gate)")
        return [replay, Outcome("gpu:graph-gate", "-", "-", None, why)]
    same = at_capture == at_eager
    return [replay, Outcome("gpu:graph-gate", f"at capture: {_decisions(at_capture)}",
                            f"replay inputs: {_decisions(at_eager)}", same,
                            "" if same else "the graph runs a branch the gate no longer picks")]


def _decisions(log: list) -> str:
    return "; ".join(repr(d) for d in log) or "none"


def check_determinism(spec, impl, case, dev, *, inputs=None) -> Outcome:
    from harness import compare

    inputs = inputs or Inputs(spec, dev)
    a, b = inputs(case), inputs(case)
    first = _snapshot(spec, impl.fn(**a), a)
    second = _snapshot(spec, impl.fn(**b), b)
    rec = compare.bitwise_equal("gpu:determinism", first, second)
    compared = ", ".join(k for k in sorted(first) if first[k] is not None)
    return Outcome("gpu:determinism", f"two runs byte-identical ({compared})", "equal" if rec.passed else "differs",
                   rec.passed, rec.detail + (f" [{rec.worst}]" if rec.worst else ""))


