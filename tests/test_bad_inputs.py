"""The bad-input fuzzer (``harness/fuzz/``).

The sweep: every class over every op and argument, one drawn input each, on the test device;
no call may have a bad outcome. Then the fuzzer bites: wrappers planted in place of a fused entry point
that swallow an error and return garbage, write before raising, segfault, abort, hang, raise an
untyped error, name the wrong argument, refuse a legal input, answer wrong or write into an
input are each reported as that bad outcome, and a printed repro line reproduces it.
"""
from __future__ import annotations

import ctypes
import os
import shlex
import subprocess
import time

import pytest
import torch

from harness.fuzz.args import OPS
from harness.fuzz.call import OUTCOMES
from harness.fuzz.cli import main
from harness.fuzz.runner import run
from harness.fuzz.strategies import CLASSES, expand_classes, plan
from harness.fuzz.surgery import changed, interleaved_view, offset_view, rows_view, snapshot
from harness.fuzz.targets import targets_for
from reference import checks
from tests.helpers import ROOT, once_per_session, subprocess_env

QK_FUSED_STEP = "fused.qk_norm_rope.wrapper:qk_norm_rope_step"


@pytest.fixture(scope="module")
def sweep(device, worker_id, tmp_path_factory):
    def compute():
        jobs = plan(device, examples=1, seed=0)
        return jobs, run(jobs, device=device.kind, timeout=120, stop_after=1)

    return once_per_session("bad_inputs_sweep", worker_id, tmp_path_factory, compute)


def test_at_least_40_classes_over_the_three_ops():
    assert len(CLASSES) >= 40
    for op in OPS:
        assert sum(bool(c.args(op)) for c in CLASSES.values()) >= 25, op
    for c in CLASSES.values():
        assert any(c.args(op) for op in OPS), c.name
        assert all(c.expected(op) in ("error", "answer") for op in OPS if c.args(op)), c.name


def test_every_class_runs_on_this_device(sweep, device):
    jobs, _ = sweep
    ran = {j.cls for j in jobs}
    assert {n for n, c in CLASSES.items() if c.on_device(device)} <= ran
    for op in OPS:  # every public entry point is called
        assert {t.name for t in targets_for(op)} <= {j.target for j in jobs if j.op == op}


def test_the_harness_itself_never_fails_a_call(sweep):
    _, results = sweep
    broken = [f"{r.job.cls} {r.job.op} {r.job.arg}: {r.detail}\n  repro: {r.repro}"
              for r in results if r is not None and r.detail.startswith("harness error")]
    assert not broken, "\n".join(broken)


def test_no_call_has_a_bad_outcome(sweep):
    _, results = sweep
    bad = [r for r in results if r is not None and r.bad]
    assert not bad, "\n".join(f"{r.job.cls} {r.job.op} {r.job.arg} {r.job.target}: {r.outcome}: {r.detail}\n"
                              f"  repro: {r.repro}" for r in bad)


# ----------------------------------------------------------------------------- tensor surgery

def test_views_keep_values_and_hide_junk_in_their_storage():
    t = torch.arange(12, dtype=torch.int64).view(3, 4)
    for view, contiguous in ((rows_view(t, "huge"), False), (interleaved_view(t, "negative"), False),
                             (offset_view(t, "huge"), True)):
        assert torch.equal(view, t) and view.is_contiguous() == contiguous
        storage = torch.empty(0, dtype=torch.int64).set_(view.untyped_storage())
        assert storage.numel() > t.numel() and (storage.abs() >= 2 ** 30).sum() == storage.numel() - t.numel()
    assert interleaved_view(t, "huge").stride(-1) == 2 and rows_view(t, "nan").stride(-1) == 1


def test_changed_sees_writes_outside_a_writable_view_only():
    kw = {"ring": rows_view(torch.zeros(4, 3), "nan"), "q": torch.ones(2)}
    snap = snapshot(kw)
    kw["ring"][1, 2] = 5.0  # inside the view: the comparison with the chain judges it
    assert changed(snap, kw, ("ring",)) == [] and changed(snap, kw) == ["ring"]
    kw["ring"].as_strided((1,), (1,), kw["ring"].storage_offset() + 3)[0] = 1.0  # the junk column of row 0
    kw["q"][0] = 2.0
    assert changed(snap, kw, ("ring",)) == ["ring", "q"]


# ----------------------------------------------------------------------------- plants
# Each is called like fused.qk_norm_rope.wrapper:qk_norm_rope_step (``--target tests.test_bad_inputs:NAME@...``).

def _fused_step(**kw):
    from fused.qk_norm_rope import wrapper as f

    return f.qk_norm_rope_step(**kw)


def plant_swallow(**kw):
    """Swallows the typed error and returns garbage."""
    try:
        return _fused_step(**kw)
    except checks.VerifyParityInputError:
        return {"q_out": torch.zeros(1), "kv_out": None}


def plant_partial_write(**kw):
    """Writes a ring row, then lets the validator raise."""
    kw["ring"][0] = 0.0
    return _fused_step(**kw)


def plant_segfault(**kw):
    ctypes.string_at(0)


def plant_abort(**kw):
    os.abort()


def plant_hang(**kw):
    time.sleep(3600)


def plant_untyped(**kw):
    raise RuntimeError("kernel launch failed")


def plant_misnamed_arg(**kw):
    raise checks.RangeError("ring", "entry 9999 outside [0, 5)")


def plant_refuses(**kw):
    raise checks.LayoutError("q", "strides not supported")


def plant_wrong_answer(**kw):
    out = _fused_step(**kw)
    out["q_out"].add_(1.0)
    return out


def plant_writes_input(**kw):
    out = _fused_step(**kw)
    kw["q"][0].zero_()
    return out


def plant_writes_outside_the_ring(**kw):
    """A correct answer, plus one element written just before the ring's view (its storage's junk)."""
    out = _fused_step(**kw)
    ring = kw["ring"]
    ring.as_strided((1,), (1,), ring.storage_offset() - 1).zero_()
    return out


def plant_hides_the_value(**kw):
    """Names the argument but not the bad value."""
    raise checks.VerifyParityInputError("rope_style", "not a rope style")


PLANTS = {  # plant: (class, argument, the outcome it must get)
    "plant_swallow": ("index-past-end", "positions", "wrong"),
    "plant_partial_write": ("index-past-end", "loc", "partial-write"),
    "plant_segfault": ("index-past-end", "positions", "segfault"),
    "plant_abort": ("index-past-end", "positions", "segfault"),
    "plant_hang": ("index-past-end", "positions", "hang"),
    "plant_untyped": ("index-past-end", "positions", "crash"),
    "plant_misnamed_arg": ("index-past-end", "positions", "misnamed"),
    "plant_refuses": ("stride-offset", "q", "refused"),
    "plant_wrong_answer": ("stride-offset", "q", "wrong"),
    "plant_writes_input": ("stride-offset", "kv", "wrong"),
    "plant_writes_outside_the_ring": ("stride-offset", "ring", "wrong"),
    "plant_hides_the_value": ("enum-bogus", "rope_style", "misnamed"),
}


CONTROLS = {  # the same inputs to the real wrapper: (class, argument, its good outcome)
    f"control-{cls}-{a}": (cls, a, "typed-error" if CLASSES[cls].expected("qk_norm_rope") == "error" else "correct")
    for cls, a in sorted({(c, a) for c, a, _ in PLANTS.values()})  # sorted: xdist workers must collect one order
}


@pytest.fixture(scope="module")
def planted(device, worker_id, tmp_path_factory):
    """Every plant and control in one run (one worker, restarted after the segfault, abort and hang)."""
    return once_per_session("bad_inputs_planted", worker_id, tmp_path_factory, lambda: _planted(device))


def _planted(device):
    jobs = []
    for name, (cls, a, _) in {**PLANTS, **CONTROLS}.items():
        target = QK_FUSED_STEP if name.startswith("control-") else f"tests.test_bad_inputs:{name}@{QK_FUSED_STEP}"
        jobs += [j for j in plan(device, classes=[cls], ops=("qk_norm_rope",), targets=[target], examples=1)
                 if j.arg == a][:1]
    assert len(jobs) == len(PLANTS) + len(CONTROLS)
    # the hang plant costs the whole timeout. On a GPU a fresh process's first call also compiles (or loads)
    # the kernel and makes the CUDA context: the printed repro of plant_swallow, run alone on an H100 host
    # busy with 16 xdist workers, was a "hang" at 5 s (2026-12-07)
    timeout = 5 if device.interpreted else 30
    return dict(zip({**PLANTS, **CONTROLS}, run(jobs, device=device.kind, timeout=timeout)))


@pytest.mark.parametrize("plant", list(PLANTS))
def test_plant_is_reported_as_its_bad_outcome(planted, plant):
    res = planted[plant]
    assert res.outcome == PLANTS[plant][2], f"{plant}: {res.outcome}: {res.detail}"
    assert res.bad and res.repro.startswith("python -m harness.fuzz ")
    if "writes" in plant:
        assert res.detail.startswith("wrote into ['"), res.detail


@pytest.mark.parametrize("control", list(CONTROLS))
def test_the_real_wrapper_passes_the_plants_inputs(planted, control):
    res = planted[control]
    assert res.outcome == CONTROLS[control][2], f"{control}: {res.outcome}: {res.detail}"


def test_a_repro_line_reproduces_as_printed(planted):
    res = planted["plant_swallow"]
    proc = subprocess.run(shlex.split(res.repro), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f": {res.outcome} (expected typed-error)" in proc.stdout


def test_cli_prints_the_table_and_exits_zero_when_every_call_is_good(device, capsys):
    assert main(["--device", device.kind, "--classes", "rank-missing-dim", "--ops", "qk_norm_rope",
                    "--examples", "1"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert header.split()[:3] == ["class", "op", "expect"] and all(o in header for o in OUTCOMES)
    assert row.split()[:3] == ["rank-missing-dim", "qk_norm_rope", "error"]


def test_cli_groups_and_unknown_classes():
    assert expand_classes(["tree", "size-b0"]) == [n for n in CLASSES if n.startswith("tree-")] + ["size-b0"]
    with pytest.raises(ValueError, match="neither a class nor a group"):
        expand_classes(["strides"])
