"""External implementations are checked by exactly the same suite: via the entry-point group
``verify_parity.impls`` of an installed distribution, or ``--impl module:attr``."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from harness.registry import ENTRY_POINT_GROUP, Impl, Registry, default_registry
from tests.helpers import ROOT, subprocess_env


PLUGIN = textwrap.dedent('''
    from harness.registry import Impl
    from reference import qk_norm_rope as r

    def good(**kw):
        return r.qk_norm_rope_step(**kw)

    def bad(**kw):  # forgets the weight: a plausible vendor bug
        out = r.qk_norm_rope_step(**{**kw, "kv_norm_weight": kw["kv_norm_weight"] * 0 + 1})
        return out

    GOOD = Impl("qk_norm_rope", "vendor-good", "external", good, doc="a vendor's kernel")
    BAD = Impl("qk_norm_rope", "vendor-bad", "external", bad, doc="a vendor's broken kernel")

    def both():
        return [GOOD, BAD]
''')


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "vp_vendor_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "vp_vendor_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vp-vendor-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nvendor = vp_vendor_plugin:both\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_entry_point_plugin_is_registered_and_checked(plugin_dir, device):
    from harness import runners

    reg = default_registry(with_mutants=False)
    good, bad = reg.impls["qk_norm_rope/vendor-good"], reg.impls["qk_norm_rope/vendor-bad"]
    assert good.kind == bad.kind == "external"
    spec = reg.ops["qk_norm_rope"]
    case = spec.catalog()[0]
    assert all(r.passed for r in runners.run_case(spec, good, case, device).records)
    assert not all(r.passed for r in runners.run_case(spec, bad, case, device).records)


def test_cli_impl_module_attr_runs_the_same_suite(plugin_dir):
    env = subprocess_env(plugin_dir)
    run = subprocess.run([sys.executable, "-m", "harness", "run", "--op", "qk_norm_rope", "--impl",
                          "vp_vendor_plugin:BAD", "--generated", "2", "--case", "h8", "--csv", str(plugin_dir / "out.csv"), "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "vendor-bad" in run.stdout and "repro: python -m harness repro" in run.stdout


def test_registry_rejects_unknown_op_and_non_impls():
    reg = Registry()
    with pytest.raises(ValueError, match="unknown op"):
        reg.add(Impl("nope", "x", "external", lambda **kw: {}))
    with pytest.raises(TypeError, match="expected harness.registry.Impl"):
        reg.add_any([object()], source="test")
    with pytest.raises(ValueError, match="module:attr"):
        reg.load_spec("no_colon")
