"""External implementations are checked by exactly the same suite: via the entry-point group
``verify_parity.impls`` of an installed distribution, or ``--impl module:attr[name,...]`` — from
``python -m harness`` and the ``verify-parity`` console script alike, in spawned workers too —
with no harness internals: ``can_handle`` may take the exact inputs, ``may_write`` declares
in-place writes (every other input is byte-checked: ``untouched:<input>``), every printed repro
line reproduces as printed, and a broken entry point is a warning, not a crash."""
from __future__ import annotations

import html as html_lib
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness import compare
from harness.ops import default_registry
from harness.parity import runners
from harness.registry import ENTRY_POINT_GROUP, Impl, Registry, can_handle_takes_inputs
from harness.parity.suite import Planned, repro_line
from tests.helpers import ROOT, harness_cli, subprocess_env


PLUGIN = textwrap.dedent('''
    from harness.registry import Impl
    from reference.qk_norm_rope import chain as r

    def good(**kw):
        return r.qk_norm_rope_step(**kw)

    def bad(**kw):  # forgets the weight: a plausible vendor bug
        out = r.qk_norm_rope_step(**{**kw, "kv_norm_weight": kw["kv_norm_weight"] * 0 + 1})
        return out

    def writes_q(**kw):  # right outputs, but q is used as scratch afterwards: the caller's q is gone
        out = r.qk_norm_rope_step(**kw)
        kw["q"].add_(1)
        return out

    GOOD = Impl("qk_norm_rope", "vendor-good", "external", good, doc="a vendor's kernel")
    BAD = Impl("qk_norm_rope", "vendor-bad", "external", bad, doc="a vendor's broken kernel")
    WRITES_Q = Impl("qk_norm_rope", "vendor-writes-q", "external", writes_q, doc="writes its input q")
    ALL = [GOOD, BAD, WRITES_Q]
    NOT_AN_IMPL = 42

    def both():
        return [GOOD, BAD]
''')

# a verify_attention plugin for the timelines: the reference chain, and one 1 % off
ATTN_PLUGIN = textwrap.dedent('''
    from harness.registry import Impl
    from reference.verify_attention import chain as r

    def off(**kw):
        out = r.verify_attention(**kw)
        return {"o": (out["o"].float() * 1.01).to(out["o"].dtype)}

    IMPLS = [Impl("verify_attention", "vendor-attn", "external", r.verify_attention),
             Impl("verify_attention", "vendor-attn-off", "external", off)]
''')

RUN = ["run", "--op", "qk_norm_rope", "--generated", "0", "--case", "dsv4-verify-b1-l3-h8", "--quiet",
       "--device", "cpu"]


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """vp_vendor_plugin importable here, and installed as the entry point ``vendor`` of vp-vendor-plugin 1.0."""
    (tmp_path / "vp_vendor_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "vp_vendor_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vp-vendor-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nvendor = vp_vendor_plugin:both\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture
def cwd_plugin(tmp_path_factory):
    """A directory holding only plugin modules (no distribution: found from the current directory)."""
    d = tmp_path_factory.mktemp("cwd_plugin")
    (d / "vp_cwd_plugin.py").write_text(PLUGIN)
    (d / "vp_attn_plugin.py").write_text(ATTN_PLUGIN)
    return d


def _cli(args, cwd, timeout=600, exe=(sys.executable, "-m", "harness"), **env):
    """The CLI as a user runs it from ``cwd``: this checkout importable, the plugin only from ``cwd``."""
    environ = subprocess_env(OMP_NUM_THREADS="1", **env)
    environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), environ.get("PATH", "")])
    if tuple(exe) == (sys.executable, "-m", "harness"):
        return harness_cli(args, cwd=cwd, env=environ, timeout=timeout)
    return subprocess.run([*exe, *map(str, args)], cwd=cwd, capture_output=True, text=True, env=environ,
                          timeout=timeout)


def _as_printed(line: str, cwd):
    """A printed repro line run by a shell, as a user pastes it, in ``cwd`` (``python`` is this interpreter)."""
    return _cli(["-c", line], cwd, exe=("bash",))


def _fail_lines(stdout: str) -> list[tuple[str, str]]:
    """(check, repro) of every FAIL line the CLI printed."""
    lines = stdout.splitlines()
    return [(line.split("[", 1)[1].split("]", 1)[0], lines[i + 1].split("repro: ", 1)[1])
            for i, line in enumerate(lines) if line.startswith("FAIL ")]


def _failed_checks(repro_stdout: str) -> set[str]:
    """The checks a ``repro`` table marks fail."""
    return {w[1] for w in (line.split() for line in repro_stdout.splitlines()) if len(w) > 2 and w[2] == "fail"}


# ----------------------------------------------------------------------------- entry points


def test_entry_point_plugin_is_registered_and_checked(plugin_dir, device):
    reg = default_registry(with_mutants=False)
    good, bad = reg.impls["qk_norm_rope/vendor-good"], reg.impls["qk_norm_rope/vendor-bad"]
    assert good.kind == bad.kind == "external"
    assert good.source.startswith("entry point vendor = vp_vendor_plugin:both (vp-vendor-plugin 1.0)")
    assert good.impl_arg == "vendor-good"  # entry points load by default: the name selects it in a fresh process
    spec = reg.ops["qk_norm_rope"]
    case = spec.catalog()[0]
    assert all(r.passed for r in runners.run_case(spec, good, case, device).records)
    assert not all(r.passed for r in runners.run_case(spec, bad, case, device).records)


@pytest.mark.long
def test_entry_point_and_module_attr_of_one_impl_register_once_and_repro_by_name(plugin_dir, tmp_path):
    """Installed as an entry point and named by --impl too: one registration (the entry point's), and
    its repro line, run as printed in a fresh process, loads it by name and fails the same check."""
    path = os.pathsep.join([str(plugin_dir), str(ROOT)])
    r = _cli([*RUN, "--impl", "vp_vendor_plugin:BAD", "--csv", tmp_path / "ep.csv"], tmp_path, PYTHONPATH=path)
    assert r.returncode == 1, r.stdout + r.stderr
    fails = _fail_lines(r.stdout)
    assert fails and all(rep.endswith("--impl vendor-bad --device cpu") for _, rep in fails), r.stdout
    again = _cli(["-c", fails[0][1]], tmp_path, exe=("bash",), PYTHONPATH=path)
    assert again.returncode == 1 and fails[0][0] in _failed_checks(again.stdout), again.stdout + again.stderr


@pytest.fixture
def broken_dist(plugin_dir):
    """A second distribution whose entry points are broken three ways (beside vp-vendor-plugin's good one)."""
    dist = plugin_dir / "vp_broken_plugin-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vp-broken-plugin\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmissing = vp_no_such_module:IMPLS\n"
                                           "typo = vp_vendor_plugin:NO_SUCH_ATTR\n"
                                           "badtype = vp_vendor_plugin:NOT_AN_IMPL\n")
    return plugin_dir


def test_broken_entry_points_are_recorded_not_raised(broken_dist):
    reg = default_registry(with_mutants=False)
    assert {"qk_norm_rope/vendor-good", "qk_norm_rope/vendor-bad"} <= set(reg.impls)  # the good distribution loads
    errs = {e.split(" = ")[0]: e for e in reg.load_errors}
    assert set(errs) == {"entry point missing", "entry point typo", "entry point badtype"}, reg.load_errors
    assert "vp_no_such_module:IMPLS (vp-broken-plugin 0.3)" in errs["entry point missing"]
    assert "ModuleNotFoundError" in errs["entry point missing"]
    assert "AttributeError" in errs["entry point typo"] and "NO_SUCH_ATTR" in errs["entry point typo"]
    assert "TypeError" in errs["entry point badtype"] and "got int" in errs["entry point badtype"]


def test_cli_warns_once_per_broken_entry_point_and_keeps_working(broken_dist):
    r = _cli(["list", "--device", "cpu"], broken_dist, PYTHONPATH=os.pathsep.join([str(broken_dist), str(ROOT)]))
    assert r.returncode == 0, r.stdout + r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: entry point")]
    assert len(warnings) == 3 and all("vp-broken-plugin 0.3" in w for w in warnings), r.stderr
    assert r.stdout.count("broken entry point (not loaded): entry point") == 3
    assert "vendor-good" in r.stdout and "fused-shared-kv" in r.stdout


@pytest.mark.long
def test_impl_spec_that_fails_to_import_is_a_clear_error(cwd_plugin):
    for spec, words in (("vp_no_such_module:X", "ModuleNotFoundError"), ("vp_cwd_plugin:NOPE", "NOPE"),
                        ("vp_cwd_plugin:NOT_AN_IMPL", "got int")):
        r = _cli([*RUN, "--impl", spec], cwd_plugin)
        assert r.returncode == 2 and "verify-parity run:" not in r.stdout, r.stdout  # nothing ran
        assert "Traceback" not in r.stderr and f"--impl {spec}" in r.stderr and words in r.stderr, r.stderr


# ----------------------------------------------------------------------------- --impl module:attr[names]


def test_module_attr_selection_registers_only_the_named(cwd_plugin, monkeypatch, device):
    monkeypatch.syspath_prepend(str(cwd_plugin))
    reg = default_registry(with_mutants=False, with_plugins=False)
    got = reg.load_spec("vp_cwd_plugin:ALL[vendor-bad, qk_norm_rope/vendor-writes-q]")
    assert [i.name for i in got] == ["vendor-bad", "vendor-writes-q"]
    assert "qk_norm_rope/vendor-good" not in reg.impls
    assert all(reg.impls[i.key] is i and i.source == "vp_cwd_plugin:ALL" for i in got)
    assert got[0].impl_arg == "vp_cwd_plugin:ALL[vendor-bad]"
    assert reg.load_spec("vp_cwd_plugin:both[vendor-bad]") == [got[0]]  # the same Impl again: registered once
    spec = reg.ops["qk_norm_rope"]
    line = repro_line(Planned(spec, spec.catalog()[0]), got[0], device)
    assert "--impl 'vp_cwd_plugin:ALL[vendor-bad]' " in line
    with pytest.raises(ValueError, match=r"no implementation named 'nope'; it provides: qk_norm_rope/vendor-good, "
                                         r"qk_norm_rope/vendor-bad, qk_norm_rope/vendor-writes-q"):
        reg.load_spec("vp_cwd_plugin:ALL[vendor-good,nope]")
    assert "qk_norm_rope/vendor-good" not in reg.impls  # nothing of a failed selection is registered
    with pytest.raises(ValueError, match="empty selection"):
        reg.load_spec("vp_cwd_plugin:ALL[]")


@pytest.mark.long
def test_cli_list_shows_only_the_selection(cwd_plugin):
    r = _cli(["list", "--device", "cpu", "--impl", "vp_cwd_plugin:ALL[vendor-writes-q]"], cwd_plugin)
    assert r.returncode == 0, r.stderr
    assert "vendor-writes-q" in r.stdout and "[vp_cwd_plugin:ALL]" in r.stdout
    assert "vendor-good" not in r.stdout and "vendor-bad" not in r.stdout
    r = _cli(["list", "--device", "cpu", "--impl", "vp_cwd_plugin:ALL[vendor-nope]"], cwd_plugin)
    assert r.returncode == 2, r.stdout  # a usage error
    assert "no implementation named 'vendor-nope'; it provides: qk_norm_rope/vendor-good" in r.stderr
    assert "Traceback" not in r.stderr


def test_printed_repro_line_reproduces_the_failing_check(cwd_plugin, tmp_path):
    """A plugin loaded from the current directory by --impl module:attr[name]: the CLI's FAIL line,
    the CSV's repro column, the JUnit failure and the HTML report carry one repro line, and that line,
    run as printed in a fresh shell, fails the same check (untouched:q: the plugin writes its input q)."""
    csv = tmp_path / "run.csv"
    r = _cli([*RUN, "--impl", "vp_cwd_plugin:ALL[vendor-writes-q,vendor-good]", "--csv", csv], cwd_plugin)
    assert r.returncode == 1, r.stdout + r.stderr
    fails = _fail_lines(r.stdout)
    assert [c for c, _ in fails] == ["untouched:q"], r.stdout  # vendor-good passes; outputs right, q written
    check, repro = fails[0]
    assert "--impl 'vp_cwd_plugin:ALL[vendor-writes-q]'" in repro
    frame = pd.read_csv(csv)
    bad = frame[frame["status"] == "fail"]
    assert set(bad["check"]) == {"untouched:q", "untouched:q@poisoned", "untouched:q@poisoned-alloc"}
    assert set(bad["repro"]) == {repro}
    from reports.build import build

    build([csv], tmp_path / "report")
    tree = ET.parse(tmp_path / "report" / "junit.xml")
    messages = [f.get("message") for f in tree.iter("failure")]
    assert messages and all(m.endswith(f"| repro: {repro}") for m in messages), messages
    page = (tmp_path / "report" / "report.html").read_text()
    shown = {html_lib.unescape(c.split("</code>", 1)[0]) for c in page.split('<code class="repro">')[1:]}
    assert shown == {repro}, shown
    again = _as_printed(repro, cwd_plugin)
    assert again.returncode == 1, again.stdout + again.stderr
    assert check in _failed_checks(again.stdout) and "vendor-writes-q" in again.stdout, again.stdout


def test_workers_load_the_selection(cwd_plugin, tmp_path):
    """--jobs 2: spawned workers rebuild the registry from the same spec (selection included)."""
    r = _cli([*RUN, "--case", "dsv4-", "--impl", "vp_cwd_plugin:ALL[vendor-bad]", "--jobs", "2",
              "--csv", tmp_path / "jobs.csv"], cwd_plugin)
    assert r.returncode == 1, r.stdout + r.stderr
    frame = pd.read_csv(tmp_path / "jobs.csv")
    assert set(frame["impl"]) == {"vendor-bad"} and frame["case"].nunique() >= 2
    assert (frame["status"] == "fail").any()


def test_timelines_with_a_plugin_in_workers_and_its_repro(cwd_plugin, tmp_path):
    """timelines --impl module:attr --jobs 2 (the workers load the plugin; they raised KeyError), and a
    failing timeline's repro loads the plugin again."""
    args = ["timelines", "--device", "cpu", "--timeline", "qwen35-gqa/width-1", "--quiet",
            "--impl", "vp_attn_plugin:IMPLS", "--jobs", "2"]
    r = _cli([*args, "--path", "reference+vendor-attn", "--path", "reference+vendor-attn-off",
              "--csv", tmp_path / "tl.csv"], cwd_plugin)
    assert r.returncode == 1, r.stdout + r.stderr
    fails = [line for line in r.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 1 and "vendor-attn-off" in fails[0], r.stdout
    frame = pd.read_csv(tmp_path / "tl.csv")
    assert (frame[frame["path"].str.endswith("+vendor-attn")]["status"] == "pass").all()
    repro = frame[frame["status"] == "fail"]["repro"].iloc[0]
    assert "--impl 'vp_attn_plugin:IMPLS[vendor-attn-off]'" in repro and f"repro: {repro}" in r.stdout
    again = _as_printed(repro, cwd_plugin)
    assert again.returncode == 1 and "FAIL " in again.stdout, again.stdout + again.stderr


# ----------------------------------------------------------------------------- console script


def _console_script() -> str | None:
    for d in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        p = Path(d) / "verify-parity"
        if p.exists():
            return str(p)
    return shutil.which("verify-parity")


def test_console_script_runs_like_python_m_harness(cwd_plugin, tmp_path):
    script = _console_script()
    if script is None:
        pytest.skip("the verify-parity console script is not installed (pip install -e .)")
    r = _cli([*RUN, "--impl", "vp_cwd_plugin:ALL[vendor-bad]", "--csv", tmp_path / "cs.csv"], cwd_plugin,
             exe=(script,))
    assert r.returncode == 1, r.stdout + r.stderr
    fails = _fail_lines(r.stdout)
    assert fails and all("--impl 'vp_cwd_plugin:ALL[vendor-bad]'" in rep for _, rep in fails), r.stdout
    h = _cli(["--help"], cwd_plugin, exe=(script,))
    assert h.returncode == 0 and h.stdout.startswith("usage: verify-parity")


# ----------------------------------------------------------------------------- can_handle with the inputs


def test_can_handle_signature_forms():
    assert not can_handle_takes_inputs(lambda case, device: True)
    assert can_handle_takes_inputs(lambda case, device, inputs: True)
    assert can_handle_takes_inputs(lambda case, device, inputs=None: True)
    assert not can_handle_takes_inputs(lambda case, device, *, inputs=None: True)  # keyword-only: the old form


def test_can_handle_gets_a_copy_of_the_exact_inputs(registry, device):
    """The vendor's own check sees the tensors the call gets, and cannot corrupt them."""
    spec = registry.ops["qk_norm_rope"]
    case = spec.catalog()[0]
    seen = []

    def check(case, device, inputs):
        seen.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()})
        inputs["q"].fill_(float("nan"))  # a careless check writes what it was given
        inputs["ring"].zero_()
        return True if inputs["q"].shape[1] <= 64 else f"H {inputs['q'].shape[1]} > 64"

    ref = registry.impls["qk_norm_rope/reference"]
    impl = replace(ref, name="vendor-checked", kind="external", can_handle=check)
    res = runners.run_case(spec, impl, case, device)
    assert not res.refused and res.records and all(r.passed for r in res.records), \
        [(r.check, r.detail) for r in res.records if not r.passed]
    built = spec.build_inputs(case, device)
    assert len(seen) == 1 and set(seen[0]) == set(built)
    assert all(compare.unchanged(k, seen[0][k], v).passed for k, v in built.items() if isinstance(v, torch.Tensor))
    wide = replace(impl, can_handle=lambda case, device, inputs: f"H {inputs['q'].shape[1]} > 4")
    assert runners.run_case(spec, wide, case, device).refused == f"H {case.H} > 4"


def test_can_handle_that_raises_is_a_failure_of_that_impl(registry, device):
    spec = registry.ops["qk_norm_rope"]
    case = spec.catalog()[0]
    ref = registry.impls["qk_norm_rope/reference"]

    def raises(case, device, inputs):
        raise RuntimeError("vendor check: unsupported stride")

    two_args = lambda case, device: 1 / 0  # noqa: E731
    for can_handle, words in ((raises, "RuntimeError: vendor check"), (two_args, "ZeroDivisionError")):
        impl = replace(ref, name="vendor-raises", kind="external", can_handle=can_handle)
        res = runners.run_impls(spec, [impl, ref], case, device)  # the next implementation still runs
        assert [(r.check, r.passed) for r in res[0].records] == [("can_handle", False)]
        assert words in res[0].records[0].detail
        assert res[1].records and all(r.passed for r in res[1].records)
    from harness.gpu.checks import _refused
    from harness.gpu.runners import Inputs

    outs = _refused(replace(ref, can_handle=raises), case, device, Inputs(spec, device), ("launches",))
    assert [(o.check, o.passed) for o in outs] == [("launches", False)] and "unsupported stride" in outs[0].detail
    assert _refused(replace(ref, can_handle=lambda c, d, i: True), case, device, Inputs(spec, device), ("x",)) == []


# ----------------------------------------------------------------------------- untouched:<input>


def _writes(ref_fn, name: str):
    """The reference chain, then one byte of input ``name`` changed (the outputs stay right)."""
    def fn(**kw):
        out = dict(ref_fn(**kw))
        kw[name].view(torch.uint8).view(-1)[:1].add_(1)
        return out
    return fn


@pytest.mark.parametrize("op, case_name, target, views", [
    ("qk_norm_rope", "dsv4-verify-b1-l3-h8", "q", ()),
    ("verify_attention", None, "k", ("v",)),  # MLA: v is a view of k
])
def test_impl_writing_an_input_fails_untouched_unless_declared(registry, device, op, case_name, target, views):
    """PLANT: a write into a non-writable input fails untouched:<input> (and in the reruns); declaring it in
    may_write passes (a view of the declared input, MLA's v of k, is skipped with it)."""
    spec = registry.ops[op]
    cat = spec.catalog()
    case = next(c for c in cat if c.name == case_name) if case_name else \
        next(c for c in cat if c.layout == "mla")
    ref = registry.impls[f"{op}/reference"]
    impl = Impl(op, "vendor-writes", "external", _writes(ref.fn, target))
    bad = {r.check: r for r in runners.run_case(spec, impl, case, device).records if not r.passed}
    want = {f"untouched:{n}{s}" for n in (target, *views) for s in ("", "@poisoned", "@poisoned-alloc")}
    assert set(bad) == want, {k: v.detail for k, v in bad.items()}
    assert "written in place" in bad[f"untouched:{target}"].detail
    assert f"may_write=({target!r},)" in bad[f"untouched:{target}"].detail
    declared = replace(impl, may_write=(target,))
    recs = runners.run_case(spec, declared, case, device).records
    checked = {r.check.split("@")[0] for r in recs if r.check.startswith("untouched:")}
    assert all(r.passed for r in recs) and checked, [(r.check, r.detail) for r in recs if not r.passed]
    assert not checked & {f"untouched:{n}" for n in (target, *views)}


def test_unchanged_compares_bytes_not_values():
    x = torch.tensor([0.0, float("nan"), 1.0])
    y = x.clone()
    assert compare.unchanged("u", y, x).passed  # the same NaN bits: unchanged
    y[0] = -0.0  # == 0.0 as a value, another byte pattern
    r = compare.unchanged("u", y, x)
    assert not r.passed and "1 bytes differ" in r.detail
    wide = torch.zeros(4, 6, dtype=torch.bfloat16)
    view = wide[:, ::2]  # a strided view: only its own elements count
    before = view.clone()
    wide[:, 1] = 7
    assert compare.unchanged("u", view, before).passed
    wide[0, 2] = 7
    assert not compare.unchanged("u", view, before).passed
    assert compare.unchanged("u", torch.tensor(3), torch.tensor(3)).passed  # 0-dim


def test_registry_validates_impls():
    reg = Registry()
    with pytest.raises(ValueError, match="unknown op"):
        reg.add(Impl("nope", "x", "external", lambda **kw: {}))
    with pytest.raises(TypeError, match="expected harness.registry.Impl"):
        reg.add_any([object()], source="test")
    with pytest.raises(ValueError, match="module:attr"):
        reg.load_spec("no_colon")
    reg = default_registry(with_mutants=False, with_plugins=False)
    fn = lambda **kw: {}  # noqa: E731
    with pytest.raises(ValueError, match=r"may_write must be a tuple of input names, e.g. \('kv',\); got 'kv'"):
        reg.add(Impl("qk_norm_rope", "x", "external", fn, may_write="kv"))
    with pytest.raises(ValueError, match="may_write must be a tuple"):
        reg.add(Impl("qk_norm_rope", "x", "external", fn, may_write=("",)))
    with pytest.raises(ValueError, match=r"may_write names \['kv_cache'\], not inputs of qk_norm_rope; "
                                         r"inputs: \['q', 'kv'"):
        reg.add(Impl("qk_norm_rope", "x", "external", fn, may_write=("kv_cache",)))
    with pytest.raises(ValueError, match="without ','"):
        reg.add(Impl("qk_norm_rope", "a,b", "external", fn))
    first = reg.add(Impl("qk_norm_rope", "x", "external", fn, may_write=("kv",)))  # SGLang normalises kv in place
    assert reg.add(Impl("qk_norm_rope", "x", "external", fn, may_write=("kv",))) is first  # a factory called again
    with pytest.raises(ValueError, match="registered twice"):
        reg.add(Impl("qk_norm_rope", "x", "external", lambda **kw: {}))


def test_op_input_names_are_what_build_inputs_gives(registry, device):
    """OpSpec.inputs (what may_write is checked against, docs/plugins.md lists) is every op's real kwargs:
    each case's, in order (a qk_norm_rope case of a non-unified layer adds swa_cache, swa_page_size)."""
    for op, spec in registry.ops.items():
        cases = spec.catalog()[:3] + [c for c in spec.catalog() if not getattr(c, "unified", True)][:1]
        seen = set()
        for case in cases:
            keys = tuple(spec.build_inputs(case, device))
            assert keys == tuple(n for n in spec.inputs if n in keys), op
            seen |= set(keys)
        assert seen == set(spec.inputs), op


# ----------------------------------------------------------------------------- docs/plugins.md


def test_the_tutorial_runs_as_written(tmp_path):
    """docs/plugins.md's tutorial adapter, as printed there: step 3 fails untouched:kv (the FAIL line
    of step 5), step 7's may_write=("kv",) makes it pass; the neox case is refused with its reason."""
    doc = (ROOT / "docs" / "plugins.md").read_text()
    tutorial = doc.split("## Ten-minute tutorial", 1)[1]
    module = tutorial.split("```python\n", 1)[1].split("```", 1)[0]
    fixed = tutorial.split("**7. Fix it**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_kernel.py").write_text(module)
    base = ["run", "--op", "qk_norm_rope", "--impl", "my_kernel:MINE", "--device", "cpu", "--generated", "0", "--quiet"]
    one = [*base, "--case", "dsv4-verify-b1-l3-h8"]
    r = _cli(one, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    fails = _fail_lines(r.stdout)
    assert [c for c, _ in fails] == ["untouched:kv"] and "may_write=('kv',)" in r.stdout, r.stdout
    shown = tutorial.split("**5. Read a FAIL line**", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    assert f"  repro: {fails[0][1]}" in shown.splitlines()  # the doc shows the line the run prints
    (tmp_path / "my_kernel.py").write_text(module.split("MINE = Impl(")[0] + fixed)
    r = _cli(one, tmp_path)
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    r = _cli([*base, "--case", "neox", "--csv", tmp_path / "neox.csv"], tmp_path)
    frame = pd.read_csv(tmp_path / "neox.csv")
    assert r.returncode == 0 and len(frame) and (frame["status"] == "refused").all(), r.stdout
    assert (frame["detail"] == "neox RoPE: this kernel rotates interleaved pairs only").all()


def test_the_tutorials_counts_agree_with_a_run(tmp_path):
    """Step 4's summary line and step 7's counts, as docs/plugins.md prints them, are those of the
    catalog runs of steps 3 and 7 (they once said 9 refused in step 4 and 2 in step 7)."""
    import re

    doc = (ROOT / "docs" / "plugins.md").read_text()
    tutorial = doc.split("## Ten-minute tutorial", 1)[1]
    module = tutorial.split("```python\n", 1)[1].split("```", 1)[0]
    fixed = tutorial.split("**7. Fix it**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    table = tutorial.split("**4. Read the summary**", 1)[1].split("```\n", 1)[1].split("```", 1)[0].splitlines()
    step4 = dict(zip(reversed(table[0].split()), reversed(table[1].split())))  # right-aligned: fp8_policy is blank
    step7 = re.search(r"Rerun step 3: `passed (\d+), failed (\d+), refused (\d+)`", tutorial)
    assert step7, "step 7 states its counts"
    base = ["run", "--op", "qk_norm_rope", "--impl", "my_kernel:MINE", "--device", "cpu", "--generated", "0", "--quiet"]
    got = {}
    for step, source in (("3", module), ("7", module.split("MINE = Impl(")[0] + fixed)):
        (tmp_path / "my_kernel.py").write_text(source)
        _cli([*base, "--csv", tmp_path / f"step{step}.csv"], tmp_path)
        from reports.summary import summary

        row = summary(pd.read_csv(tmp_path / f"step{step}.csv")).iloc[0]
        got[step] = {k: int(row[k]) for k in ("cases", "passed", "failed", "refused")}
    assert {k: int(step4[k]) for k in got["3"]} == got["3"], (step4, got["3"])
    passed, failed, refused = map(int, step7.groups())
    assert (passed, failed, refused) == (got["7"]["passed"], got["7"]["failed"], got["7"]["refused"]), got["7"]


def _three(case, device, inputs):
    return True


def test_a_deferred_function_is_the_function_it_names_once_called():
    """``Deferred('module:attr')`` (an Impl's ``fn`` or ``can_handle``, an OpSpec's chain) calls the function
    it names, shows its signature (a three-argument ``can_handle`` is still told apart), equals another
    naming the same target, and refuses what is not ``module:attr``."""
    from harness.registry import Deferred, always

    d = Deferred(f"{__name__}:_three")
    assert d(None, None, {}) is True and d.resolve() is _three
    assert can_handle_takes_inputs(d) and not can_handle_takes_inputs(Deferred("harness.registry:always"))
    assert Deferred("harness.registry:always") == Deferred("harness.registry:always") != d
    assert Deferred("harness.registry:always").resolve() is always
    for bad in ("harness.registry", "harness.registry:", "a b:c", 3):
        with pytest.raises(ValueError, match="module:attr"):
            Deferred(bad)


def test_every_deferred_function_of_the_built_in_registry_exists(registry):
    """The built-in declarations name their torch-side functions by ``module:attr`` (so that ``list`` imports
    no torch): each one resolves, so a misspelt target fails here, not in the first run that calls it."""
    from dataclasses import fields

    from harness.registry import Deferred

    found = []
    for obj in [*registry.ops.values(), *registry.impls.values(),
                *(s.distribution for s in registry.ops.values() if s.distribution is not None)]:
        found += [(obj, getattr(obj, f.name)) for f in fields(obj) if isinstance(getattr(obj, f.name), Deferred)]
    assert len(found) >= 2 * len(registry.ops)  # each op's reference chain and oracle at least
    for obj, d in found:
        assert callable(d.resolve()), (obj, d)
