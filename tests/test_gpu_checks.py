"""``harness.gpu.checks`` / ``harness.gpu.runners`` and the GPU-only mutants, on any machine.

The CPU cannot count device kernels or capture a CUDA graph, so the checks run here with two
stand-ins passed through their hooks: an interpreter launch counter (every Triton kernel launch
under ``TRITON_INTERPRET``) and a capture that replays the captured gate decision (what a graph
does: the branch taken at capture is the one replayed). The real run is the GPU test at the end.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib

import pytest
import torch

from harness import ops
from harness.gpu import mutants as gpu_mutants
from cases.qk_norm_rope import gpu_mutants as qk_gpu_mutants
from cases.verify_attention import gpu_mutants as va_gpu_mutants
from harness.gpu import checks as gc
from harness.gpu import runners as gr
from harness.parity import runners
from harness.registry import Impl
from reports.rows import Provenance, columns

NO_GPU = not torch.cuda.is_available()
SMALL = {"qk_norm_rope": "dsv4-verify-b1-l3-h8", "mla_fp8_prepare": "k3-verify-b4-l3-h16",
         "verify_attention": "qwen35-tp-h4-l2"}


@pytest.fixture(scope="module")
def reg():
    return gc.registry()


def _case(reg, op, name=None):
    return {c.name: c for c in reg.ops[op].catalog(big=True)}[name or SMALL[op]]


@contextlib.contextmanager
def _interpreter_launches():
    """Counts Triton kernel launches (grids run by the interpreter) while the block runs."""
    from triton.runtime.interpreter import InterpretedFunction

    launched: list[str] = []
    orig = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kw):
        if not warmup:
            launched.append(self.__name__)
        return orig(self, *args, grid=grid, warmup=warmup, **kw)

    InterpretedFunction.run = run
    try:
        yield launched
    finally:
        InterpretedFunction.run = orig


def _count(fn) -> int:
    fn()  # warm-up, as profiling.count_launches does
    with _interpreter_launches() as launched:
        fn()
    return len(launched)


def _names(fn) -> list[str]:
    with _interpreter_launches() as launched:
        fn()
    return launched


def _baked_capture(op):
    """Stand-in for ``cuda_graph_capture``: 'replay' reruns the call with the gate decisions
    recorded at capture forced (a graph never calls the gate again) and writes the results into
    the captured outputs' buffers."""
    from fused import gates

    def capture(fn, before_capture):
        fn()
        before_capture()
        with gr.gate_decisions() as baked:
            out = fn()

        def replay():
            with gates.forced(baked):
                again = fn()
            for k, v in out.items():
                if isinstance(v, torch.Tensor):
                    v.copy_(again[k])

        return out, replay

    return capture


# ----------------------------------------------------------------------------- command line

def test_parser_defaults_and_choices():
    a = gc.build_parser().parse_args([])
    assert (a.out, a.op, a.impl, a.check, a.seed) == (None, None, None, None, 0)
    a = gc.build_parser().parse_args(["--op", "qk_norm_rope", "--impl", "fused", "--impl", "mutant-two-launches",
                                      "--check", "launches", "--check", "graph", "--out", "d"])
    assert a.op == ["qk_norm_rope"] and a.impl == ["fused", "mutant-two-launches"] and a.check == ["launches", "graph"]
    for bad in (["--check", "speed"], ["--op", "attention"]):
        with pytest.raises(SystemExit) as e:
            gc.build_parser().parse_args(bad)
        assert e.value.code == 2


def test_unknown_impl_is_refused_on_any_machine(capsys):
    assert gc.main(["--impl", "no-such-impl"]) == 2  # a usage error: one line, exit 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "error: --impl: unknown implementation(s) no-such-impl" in line


@pytest.mark.skipif(not NO_GPU, reason="the no-GPU path: this machine has a GPU")
def test_without_a_gpu_nothing_is_checked_and_exit_is_0(tmp_path, capsys):
    assert gc.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no GPU" in out and "checked nothing" in out
    assert not list(tmp_path.iterdir()), "no CSV may claim checks that never ran"


def test_default_selection_is_clean_impls_plus_gpu_mutants(reg):
    impls = gc._select(reg, gc.build_parser().parse_args([]), ops.BUILTIN)
    keys = {i.key for i in impls}
    assert {m.key for m in gpu_mutants.MUTANTS} <= keys
    assert {"qk_norm_rope/fused", "mla_fp8_prepare/reference", "verify_attention/fused-shared-kv"} <= keys
    assert not [i for i in impls if i.kind == "mutant" and not gpu_mutants.is_gpu_mutant(i)]
    assert not [i for i in impls if i.kind in ("compiled", "external")]


# ----------------------------------------------------------------------------- the mutants

def test_gpu_mutants_stay_out_of_the_cpu_registry(registry):
    """The CPU kill matrix must never judge them: they compute the right numbers."""
    for m in gpu_mutants.MUTANTS:
        assert m.key not in registry.impls
        assert m.kind == "mutant" and m.doc and m.catches and all(c.startswith("gpu:") for c in m.catches)
        assert set(m.catches) <= {c for cs in gc.ROW_CHECK.values() for c in cs}


def test_cpu_kill_matrix_says_it_skips_them(registry, device):
    from harness.mutants import killmatrix

    class Stop(Exception):
        pass

    seen = []

    def progress(msg):
        seen.append(msg)
        raise Stop

    with pytest.raises(Stop):
        killmatrix.build(registry, device, progress=progress)
    assert seen[0].startswith("skipped") and "GPU-only" in seen[0]
    assert all(m.key in seen[0] for m in gpu_mutants.MUTANTS)


def test_flipping_gates_flip_between_two_identical_calls():
    qk = dict(unified=True, forward_mode="target_verify", verify_switch=True)
    assert qk_gpu_mutants.flipping_qk_gate(**qk) != qk_gpu_mutants.flipping_qk_gate(**qk)
    va = dict(model_family="qwen3.5", topk=1, use_mla=False, splitkv_switch=True, num_local_kv_heads=1)
    assert va_gpu_mutants.flipping_verify_gate(**va) != va_gpu_mutants.flipping_verify_gate(**va)


@pytest.mark.parametrize("op,mutant,cases", [
    ("qk_norm_rope", "mutant-two-launches", ("dsv4-verify-b1-l3-h8", "decode-padding-slots", "neox-decode-q-weight")),
    ("mla_fp8_prepare", "mutant-two-launches", ("k3-verify-b1-l3-h8", "padding-entries", "descale-0.37")),
    ("verify_attention", "mutant-dispatch-falls-through", ("qwen35-tp-h4-l2", "dspark-hkv2-h8-noncausal")),
])
def test_launch_mutants_pass_the_whole_parity_suite(reg, device, op, mutant, cases):
    """Right numbers (oracle, bytes, untouched rows, determinism, poisoned outputs): only a
    launch count can tell them from the fused op."""
    for name in cases:
        res = runners.run_case(reg.ops[op], reg.impls[f"{op}/{mutant}"], _case(reg, op, name), device)
        assert not res.refused and res.records
        assert all(r.passed for r in res.records), [(r.check, r.detail) for r in res.records if not r.passed]


@pytest.mark.parametrize("op,mutant,fused,extra", [
    ("qk_norm_rope", "mutant-two-launches", 1, 1),
    ("mla_fp8_prepare", "mutant-two-launches", 1, 1),
    ("verify_attention", "mutant-dispatch-falls-through", 2, 2),
])
def test_launch_check_passes_fused_and_flags_the_mutant(reg, device, op, mutant, fused, extra):
    spec, case = reg.ops[op], _case(reg, op)
    # the interpreter's launches on the CPU; on a GPU the profiler's kernels (the defaults)
    counters = dict(count=_count, names=_names) if device.interpreted else {}
    ok = gr.check_launches(spec, reg.impls[f"{op}/fused"], case, device, **counters)
    assert ok.passed and ok.got == f"{fused} kernel(s)", ok
    bad = gr.check_launches(spec, reg.impls[f"{op}/{mutant}"], case, device, **counters)
    assert bad.passed is False and bad.got == f"{fused + extra} kernel(s)" and bad.detail.startswith("kernels: "), bad


@pytest.mark.parametrize("op,name,want", [
    ("qk_norm_rope", "dsv4-verify-b1-l3-h8", 2), ("qk_norm_rope", "decode-padding-slots", 3),
    ("mla_fp8_prepare", "k3-verify-b1-l3-h8", 5), ("mla_fp8_prepare", "writes-off", 4),
    ("verify_attention", "qwen35-h16-l4-b3", 3), ("verify_attention", "qwen35-h16-l4-b3-loop", 9),
])
def test_reference_chain_launches_counted_as_designed(reg, device, op, name, want):
    """The chain's launches: per request in the loop form (a batch too large for the batched form:
    here forced by a zero size bound), once over the batch in the batched form."""
    from reference.verify_attention import chain as va_chain

    loop = name.endswith("-loop")
    case, impl = _case(reg, op, name.removesuffix("-loop")), reg.impls[f"{op}/reference"]
    inputs = reg.ops[op].build_inputs(case, device)
    with pytest.MonkeyPatch.context() as mp:
        if loop:
            mp.setattr(va_chain, "BATCHED_SCORE_BYTES", 0)
        with gr.capture_safe(reg.ops[op], inputs), gr.stage_calls() as calls:
            impl.fn(**inputs)
        assert len(calls) == reg.ops[op].gpu.expected_stages(case, inputs) == want, calls


@pytest.mark.parametrize("op", [op for op, spec in ops.builtin_specs().items() if spec.gpu])
def test_every_planned_stage_is_a_marked_launch(registry, op):
    """``OpSpec.gpu.stages`` names functions of the chain marked ``@launch`` (else ``stage_calls`` would
    not see them and the launch count would be short)."""
    from reference import launches

    chain = importlib.import_module(f"reference.{op}.chain")
    for n in registry.ops[op].gpu.stages:
        mod, _, attr = n.rpartition(":")
        assert launches.is_launch(getattr(importlib.import_module(mod) if mod else chain, attr)), n


# ----------------------------------------------------------------------------- graph replay (stand-in capture)

@pytest.mark.parametrize("op,impl", [("qk_norm_rope", "fused"), ("qk_norm_rope", "reference"),
                                     ("mla_fp8_prepare", "fused"), ("verify_attention", "fused")])
def test_graph_check_passes_clean_impls(reg, device, op, impl):
    outs = gr.check_graph(reg.ops[op], reg.impls[f"{op}/{impl}"], _case(reg, op), device, 0,
                          capture=_baked_capture(op))
    replay, gate = outs
    assert replay.passed, replay
    assert gate.passed is (None if impl == "reference" else True), gate


@pytest.mark.parametrize("op", ["qk_norm_rope", "verify_attention"])
def test_graph_check_flags_the_gate_that_flips(reg, device, op):
    outs = gr.check_graph(reg.ops[op], reg.impls[f"{op}/mutant-gate-flips-per-call"], _case(reg, op), device, 0,
                          capture=_baked_capture(op))
    gate = {o.check: o for o in outs}["gpu:graph-gate"]
    assert gate.passed is False and gate.expected != gate.got, gate


def test_reference_chains_that_cannot_be_captured_are_skipped_with_the_reason(reg, device):
    for op in [op for op, spec in reg.ops.items() if spec.gpu and spec.gpu.reference_not_capturable]:
        outs = gr.check_graph(reg.ops[op], reg.impls[f"{op}/reference"], _case(reg, op), device, 0,
                              capture=_baked_capture(op))
        assert all(o.passed is None and "not capturable" in o.detail for o in outs)


def test_graph_outcomes_flag_a_stale_graph_and_differing_bytes():
    a, b = {"out:o": torch.ones(3)}, {"out:o": torch.zeros(3)}
    stale = gr.graph_outcomes("verify_attention", before=a, replayed=a, eager=a, at_capture=[], at_eager=[])
    assert stale[0].passed is False and "stale graph" in stale[0].detail
    assert stale[1].passed is None  # no gate observed: not applicable, said so
    differs = gr.graph_outcomes("verify_attention", before=b, replayed=b, eager=a, at_capture=[1], at_eager=[1])
    assert differs[0].passed is False and differs[0].got == "differs" and differs[1].passed is True


def test_copy_into_refuses_a_replay_input_of_another_shape():
    with pytest.raises(ValueError, match="does not fit"):
        gr._copy_into({"x": torch.zeros(4)}, {"x": torch.zeros(5)})
    with pytest.raises(ValueError, match="baked into the graph"):
        gr._copy_into({"eps": 1e-6}, {"eps": 1e-5})


def test_capture_safe_keeps_the_bytes_and_restores_the_validators(reg, device):
    from reference import checks
    from reference.mla_fp8_prepare import chain as r

    op = "mla_fp8_prepare"
    spec, impl, case = reg.ops[op], reg.impls[f"{op}/fused"], _case(reg, op)
    a, b = spec.build_inputs(case, device), spec.build_inputs(case, device)
    plain = impl.fn(**a)
    with gr.capture_safe(spec, b):
        assert not checks.values_read()
        safe = impl.fn(**b)
    assert checks.values_read() and r.KVPool(a["kv_buffer"]).writes is not None  # the counter is back on
    assert safe["kv_writes"] is None  # the pool model's counter is off ...
    assert torch.equal(plain["q8"].view(torch.uint8), safe["q8"].view(torch.uint8))
    assert torch.equal(a["kv_buffer"].view(torch.uint8), b["kv_buffer"].view(torch.uint8))  # ... the bytes are not


# ----------------------------------------------------------------------------- rows, verdict, exit code

def test_row_schema():
    cols = columns(gc.GpuCheckRow)
    assert cols[:11] == ["check", "op", "impl", "kind", "shape", "expected", "got", "passed", "detail", "seconds",
                         "repro"]
    assert cols[11:] == columns(Provenance)


def _row(check, impl, kind, passed, op="qk_norm_rope"):
    prov = dict.fromkeys(columns(Provenance), "")
    prov["seed"] = 0
    return gc.GpuCheckRow(check, op, impl, kind, "s", "e", "g", passed, "", 0.0, "r", **prov)


def test_verdict_and_exit_code():
    two = next(m for m in gpu_mutants.MUTANTS if m.key == "qk_norm_rope/mutant-two-launches")
    flip = next(m for m in gpu_mutants.MUTANTS if m.key == "qk_norm_rope/mutant-gate-flips-per-call")
    clean = Impl("qk_norm_rope", "fused", "fused", lambda **kw: kw)
    rows = [_row("gpu:launches", "fused", "fused", True), _row("gpu:launches", two.name, "mutant", False),
            _row("gpu:graph-gate", flip.name, "mutant", True), _row("gpu:launches", flip.name, "mutant", False)]
    v = gc.verdict(rows, [clean, two, flip])
    assert [i.key for i, _ in v["killed"]] == [two.key]
    assert v["survived"] == [flip], "a failure outside its catches does not count as flagging it"
    assert gc.exit_code(v) == 1
    v = gc.verdict(rows[:2], [clean, two, flip])
    assert v["unjudged"] == [flip] and gc.exit_code(v) == 0
    v = gc.verdict(rows[:2] + [_row("gpu:determinism", "fused", "fused", False)], [clean, two])
    assert gc.exit_code(v) == 1 and len(v["clean_failures"]) == 1


@pytest.mark.skipif(not NO_GPU, reason="the no-GPU crash path: on a GPU the launch count runs "
                    "(test_launch_check_passes_fused_and_flags_the_mutant)")
def test_run_writes_schema_rows_and_a_crash_is_a_failure(reg, device, monkeypatch):
    """``run`` on the CPU with the plans shrunk: determinism really runs; the launch count
    raises (no GPU) and must come back as a failing row with the reason, never a pass."""
    from cases import profiles
    from harness.parity.suite import provenance

    spec = reg.ops["qk_norm_rope"]
    monkeypatch.setitem(reg.ops, "qk_norm_rope", dataclasses.replace(
        spec, gpu=dataclasses.replace(spec.gpu, cases=(SMALL["qk_norm_rope"],), full=SMALL["qk_norm_rope"])))
    impls = [reg.impls["qk_norm_rope/fused"], reg.impls["qk_norm_rope/mutant-two-launches"]]
    prov = provenance(device, profiles.current(), 0)
    rows = gc.run(reg, device, prov, ops=("qk_norm_rope",), impls=impls, checks=("launches", "determinism"),
                  seed=0, progress=None)
    by = {(r.impl, r.check): r for r in rows}
    assert by[("fused", "gpu:determinism")].passed is True
    crash = by[("fused", "gpu:launches")]
    assert crash.passed is False and "needs a GPU" in crash.detail and crash.got == "raised"
    assert crash.repro == "python -m harness.gpu.checks --op qk_norm_rope --impl fused --check launches"
    assert all(dataclasses.astuple(r)[11:] == dataclasses.astuple(prov) for r in rows)
    assert "FAIL" in gc.summary(rows) and gc.exit_code(gc.verdict(rows, impls)) == 1


# ----------------------------------------------------------------------------- the real thing

@pytest.mark.long
@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU, reason="launch counts and CUDA-graph capture need a CUDA/ROCm device")
def test_gpu_checks_pass_clean_and_flag_every_gpu_mutant(tmp_path, capsys):
    assert gc.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for m in gpu_mutants.MUTANTS:
        assert f"KILLED {m.key}" in out, out[-4000:]
    assert (tmp_path / "gpu_checks.csv").is_file()


def test_progress_labels_a_flagged_mutant_apart_from_a_clean_failure():
    """The nightly counts lines starting with FAIL as failures: a GPU mutant caught by its check
    must not read FAIL (on the H200 the five killed mutants were listed as ten failures)."""
    assert gc.row_state(False, "mutant") == "flag"
    assert gc.row_state(False, "fused") == "FAIL" and gc.row_state(False, "reference") == "FAIL"
    assert gc.row_state(True, "mutant") == "pass" and gc.row_state(None, "fused") == "skip"
