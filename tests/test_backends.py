"""A backend plugs in like an ``Impl`` (``--backend module:attr``, in worker processes too), and
every decision it makes is checked against the logical request: each planted bug of
``tests/plugins/backends_buggy.py`` — wrong the same way at every layer and step, on clean
kernels — fails the timelines through the CLI, caught by the checks named here; the clean backend
loaded the same way passes."""
from __future__ import annotations

import argparse
import dataclasses

import pandas as pd
import pytest

from harness import backend as backend_mod
from tests.helpers import ROOT, harness_cli, subprocess_env

PLUGIN = "tests.plugins.backends_buggy"
SMALL_MIXED = "timeline:family=dsv4-mqa-mixed,steps=P:0.3+1.2;V:0.1+1.3;D:0+1,L=3,window=5,pad=1,seed=1"
# timeline -> {plugin attribute: (path name suffix, checks that must flag it)}; "" = must pass
PLANTS = {
    "dsv4-mqa-ring/width-1": {
        "CLEAN": ("clean-plugin", ()),
        "PositionsOffByOne": ("positions-off-by-one", ("input:positions", "prepare:q_out", "prepare:kv")),
        "RingSlotShifted": ("ring-slot-shifted", ("input:out_cache_loc",)),
        "DecodeOnVerifyBranch": ("decode-on-verify-branch", ("gate:branch", "gate:prepare-stored", "state",
                                                             "visible_kv:chunk", "attn:o")),
        "VerifyOnDecodeBranch": ("verify-on-decode-branch", ("gate:branch", "gate:verify-2-source")),
    },
    "qwen35-gqa/accept-0-to-L": {
        "CLEAN": ("clean-plugin", ()),
        "DecodeAttendsFirst": ("decode-attends-first", ("visible_kv:chunk", "attn:o")),
        "RollbackKeepsFreedSlots": ("rollback-keeps-freed", ("state:table", "visible_kv", "input:out_cache_loc")),
    },
    SMALL_MIXED: {
        "NonUnifiedAsUnified": ("non-unified-as-unified", ("gate:branch", "state:swa-cache")),
        "UnifiedAsNonUnified": ("unified-as-non-unified", ("gate:branch", "prepare:kv")),
    },
    "k3-mla-fp8/width-1": {
        "UntranslatedWrite": ("untranslated-write", ("input:loc-physical", "state", "visible_kv")),
    },
}


def _cli(*args, timeout=900):
    return harness_cli(args, env=subprocess_env(OMP_NUM_THREADS="1"), timeout=timeout)


def _flagged(frame: pd.DataFrame) -> dict[str, set[str]]:
    """path -> the checks (request suffix dropped) that failed on it."""
    bad = frame[frame["status"] != "pass"]
    return {p: {c.split(":r")[0] for c in g["check"]} for p, g in bad.groupby("path")}


@pytest.mark.long
@pytest.mark.parametrize("timeline", list(PLANTS))
def test_planted_backend_bugs_fail_through_the_cli(timeline, tmp_path):
    plants = PLANTS[timeline]
    csv = tmp_path / "tl.csv"
    jobs = 2 if len(plants) > 2 else 1  # the workers load the backends from their specs (--jobs 2) once here
    args = ["timelines", "--device", "cpu", "--timeline", timeline, "--quiet", "--jobs", jobs, "--csv", csv]
    res = _cli(*args, *[x for attr in plants for x in ("--backend", f"{PLUGIN}:{attr}")])
    assert res.returncode == 1, res.stdout + res.stderr
    frame = pd.read_csv(csv)
    flagged = _flagged(frame)
    paths = set(frame["path"])
    for attr, (suffix, checks) in plants.items():
        (path,) = [p for p in paths if p.endswith(f":{suffix}")]
        if not checks:
            assert path not in flagged, f"the clean backend fails: {flagged.get(path)}"
            continue
        assert path in flagged, f"{attr} passed every check"
        missing = set(checks) - flagged[path]
        assert not missing, f"{attr}: {sorted(missing)} did not flag it (flagged: {sorted(flagged[path])})"
        assert f"--backend {PLUGIN}:{attr}" in frame[frame["path"] == path]["repro"].iloc[0]


def test_an_acceptance_bug_shows_in_the_kv_truth(tmp_path):
    """The accept(n) step takes n from the path's acceptance implementation: one that keeps a draft
    too few fails accept:n, and the backend's rollback to its n then fails the KV truth."""
    csv = tmp_path / "acc.csv"
    res = _cli("timelines", "--device", "cpu", "--timeline", "qwen35-gqa/width-4-reject", "--quiet", "--csv", csv,
               "--impl", f"{PLUGIN}:ACCEPT", "--path", "reference+reference+accept-one-short",
               "--path", "reference+reference+reference")
    assert res.returncode == 1, res.stdout + res.stderr
    flagged = _flagged(pd.read_csv(csv))
    assert set(flagged) == {"qwen35-gqa:reference+reference+accept-one-short"}, flagged
    assert {"accept:n", "state", "state:table", "visible_kv"} <= next(iter(flagged.values()))
    line = next(x for x in res.stdout.splitlines() if x.strip().startswith("repro:"))
    assert f"--impl '{PLUGIN}:ACCEPT[accept-one-short]'" in line and "--path reference+reference+accept-one-short" \
        in line, line


@pytest.mark.parametrize("spec,message", [
    ("no_such_module_xyz:B", "cannot load it: ModuleNotFoundError"),
    (f"{PLUGIN}:ACCEPT", "expected a harness.backend.Backend"),
])
def test_a_backend_that_does_not_load_is_one_usage_line(spec, message):
    res = _cli("timelines", "--device", "cpu", "--timeline", "qwen35-gqa/width-1", "--backend", spec, timeout=300)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_backend_specs_are_checked_before_any_work():
    from harness.timelines import suite as timeline_suite
    from harness.usage import UsageError

    with pytest.raises(backend_mod.BackendLoadError, match="expected module:attr"):
        backend_mod.load("no-colon")
    args = argparse.Namespace(path_mutant="path-store-before-attention", backend=[f"{PLUGIN}:CLEAN"], path=None)
    with pytest.raises(UsageError, match="path mutant"):
        timeline_suite.path_specs(args)
    args = argparse.Namespace(path_mutant=None, backend=[f"{PLUGIN}:CLEAN", f"{PLUGIN}:RingSlotShifted"],
                              path=[("fused", "fused"), ("reference", "reference", "fused")])
    assert timeline_suite.path_specs(args) == [("clean", p, a, f"{PLUGIN}:{b}", acc) for p, a, acc in
                                               (("fused", "fused", ""), ("reference", "reference", "fused"))
                                               for b in ("CLEAN", "RingSlotShifted")]


def test_load_forms_and_gate_paths_through_a_backend(registry):
    """An instance, a subclass and a callable load alike (``source`` = the spec); the gate's paths
    under test run through ``--backend``'s backend, the reference path through the clean one."""
    from cases import e2e_gate
    from harness.e2e import gate

    for attr, name in (("CLEAN", "clean-plugin"), ("RingSlotShifted", "ring-slot-shifted")):
        be = backend_mod.load(f"{PLUGIN}:{attr}")
        assert be.name == name and be.source == f"{PLUGIN}:{attr}"
    prof = dataclasses.replace(e2e_gate.PROFILES["cpu-lite"], backend=f"{PLUGIN}:DecodeAttendsFirst",
                               path_mutants=(), impl_mutants=())
    paths = gate.paths_for(registry, "qwen35-gqa", prof)
    assert paths[0][1].backend == backend_mod.CLEAN
    assert paths[1:] and all(p.backend.name == "decode-attends-first" and label.endswith(":decode-attends-first")
                             for label, p, _ in paths[1:])


def test_gate_cli_runs_its_paths_through_the_backend_flag(tmp_path):
    """``gate --backend module:attr``: the profile's path under test runs through the loaded backend
    (its name in the row's path) and a planted rollback bug fails it, the reference row passing;
    the clean backend loaded the same way passes. Random weights (an empty --models): agreement
    with the reference decides, ~10 s a run."""
    (tmp_path / "no-models").mkdir()
    for attr, suffix, rc, verdict in (("RollbackKeepsFreedSlots", "rollback-keeps-freed", 1, "fail"),
                                      ("CLEAN", "clean-plugin", 0, "pass")):
        csv = tmp_path / f"{attr}.csv"
        res = _cli("gate", "--device", "cpu", "--profile", "smoke-path", "--layout", "qwen35-gqa", "--models",
                   tmp_path / "no-models", "--quiet", "--csv", csv, "--backend", f"{PLUGIN}:{attr}", timeout=300)
        assert res.returncode == rc and "Traceback" not in res.stderr, res.stdout + res.stderr
        by = {r["path"]: r for r in pd.read_csv(csv).to_dict("records")}
        assert set(by) == {"reference+reference", f"fused+reference:{suffix}"}, sorted(by)
        assert by["reference+reference"]["verdict"] == "pass", by
        assert by[f"fused+reference:{suffix}"]["verdict"] == verdict, by


def test_the_docs_backend_runs_as_written_and_its_table_lists_every_decision(registry, device, tmp_path,
                                                                             monkeypatch):
    """docs/plugins.md's backend example, as printed there, loads by --backend's rules and runs a
    timeline clean (qwen35-gqa stores post anyway); its table names every method of Backend."""
    import inspect

    from cases import timelines as tl
    from harness.timelines import runner as timeline
    from harness.timelines import path as path_mod

    doc = (ROOT / "docs" / "plugins.md").read_text().split("## Checking your own backend", 1)[1]
    doc = doc.split("\n## ", 1)[0]
    (tmp_path / "my_backend.py").write_text(doc.split("```python\n", 1)[1].split("```", 1)[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    be = backend_mod.load("my_backend:MyBackend")
    t = {x.name: x for x in tl.catalog()}["qwen35-gqa/width-1"]
    recs = timeline.run_timeline(path_mod.clean_path(registry, t.family, prepare="reference", attn="reference",
                                                     backend=be), t, device.torch_device, device.fp8_dtype)
    assert recs and not path_mod.failures(recs), path_mod.failures(recs)[:3]
    methods = {n for n, f in inspect.getmembers(backend_mod.Backend, inspect.isfunction) if not n.startswith("_")}
    missing = sorted(m for m in methods - {"policy"} if f"`{m}(" not in doc)
    assert not missing, f"docs/plugins.md's backend table lacks {missing}"


def test_a_q_weight_bug_shows_only_in_the_q_weighted_family(registry, device):
    """A qk prepare that drops the q norm weight: right on dsv4-mqa-ring (no q weight), caught by
    prepare:q_out on its q-weighted twin."""
    from cases import timelines as tl
    from harness.timelines import runner as timeline
    from harness.timelines import path as path_mod
    from tests.plugins import backends_buggy

    cat = {x.name: x for x in tl.catalog()}
    got = {}
    for fam in ("dsv4-mqa-ring", "dsv4-mqa-ring-qw"):
        path = dataclasses.replace(path_mod.clean_path(registry, fam, prepare="reference", attn="reference"),
                                   prepare=backends_buggy.Q_WEIGHT)
        recs = timeline.run_timeline(path, cat[f"{fam}/accept-0-to-L"], device.torch_device, device.fp8_dtype,
                                     stop_on_failure=True)
        got[fam] = {s.record.check for s in path_mod.failures(recs)}
    assert not got["dsv4-mqa-ring"], got
    assert "prepare:q_out" in got["dsv4-mqa-ring-qw"], got
