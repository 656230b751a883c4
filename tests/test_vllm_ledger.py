"""The vLLM ledger's entry for the one-head MLA decode path (cases/ledgers/vllm.py; issue 35 finding 5,
docs/vllm.md): it lists exactly the one-head cases that fail, reports a fixed kernel as "known failure did
not happen", hides no other failure, and its standalone repro fails on the kernel and passes on a fixed one.
Needs ``pip install --no-deps vllm==0.34.0`` (``VP_REQUIRE_VLLM=1`` turns the skip into a failure). CPU:
the interpreter with the harness's shim (tests/conftest.py)."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from cases import profiles
from cases.ledgers import vllm as ledger_vllm
from harness import ledger
from harness.adapters import vllm
from harness.parity import suite
from tests.helpers import ROOT, VLLM_MISSING, vllm_kernels_load

HAVE_VLLM = vllm_kernels_load()
pytestmark = pytest.mark.skipif(not HAVE_VLLM, reason=VLLM_MISSING)

ENTRY = ledger_vllm.LEDGER[0]
GONE = f"ledger:{ENTRY.id}"
# the one-head slice of docs/vllm.md: 600 generated cases hold 42 one-head MLA ones, 7 of them run (the
# rest refused: trees, fnuz, ragged widths, v_scale != k_scale)
SLICE = {"generated": 600, "case_filter": "H=1,Hkv=1,D=576"}
STAGE1 = "qk = tl.sum(q[None, :] * k, 1)"  # _fwd_kernel_stage1, the MHA path's q·k
PLANTS = {
    # the fix: exact products summed in fp32, as the grouped path's tl.dot does
    "fp32-products": (STAGE1, "qk = tl.sum(q[None, :].to(tl.float32) * k.to(tl.float32), 1)"),
    # vLLM's defect kept, plus another bug: V read 1 % too large on the MHA path
    "v-scaled": ("acc += tl.sum(p[:, None] * v, 0)", "acc += tl.sum(p[:, None] * (v.to(tl.float32) * 1.01), 0)"),
}


def _kernel_source(plant: str | None) -> str:
    path = Path(vllm.load()["triton_decode_attention"].__file__)
    text = path.read_text()
    if plant is None:
        return text
    old, new = PLANTS[plant]
    head, rest = text.split("def _fwd_kernel_stage1(", 1)
    body, tail = rest.split("def _decode_att_m_fwd(", 1)
    assert body.count(old) == 1, f"{old!r} not once in _fwd_kernel_stage1"
    return head + "def _fwd_kernel_stage1(" + body.replace(old, new) + "def _decode_att_m_fwd(" + tail


@functools.cache
def _planted_file(plant: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="vp-vllm-plant-")) / "triton_decode_attention.py"
    path.write_text(_kernel_source(plant))
    return path


@functools.cache
def _planted_module(plant: str):
    """vLLM's kernel file with one line of ``_fwd_kernel_stage1`` changed, imported next to the real one
    (its ``vllm.*`` imports resolve to what ``vllm.load()`` registered)."""
    spec = importlib.util.spec_from_file_location(f"vp_planted_{plant.replace('-', '_')}", _planted_file(plant))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(registry, device, monkeypatch, entries, plant: str | None = None) -> pd.DataFrame:
    """The CLI's ``run --op verify_attention --impl ...[vllm-mla-decode] --case H=1,Hkv=1,D=576 --generated 600``
    in process, with ``entries`` as the ledger; ``plant``: the adapter launches a planted kernel file."""
    if plant is not None:
        mods = {**vllm.load(), "triton_decode_attention": _planted_module(plant)}
        monkeypatch.setattr(vllm, "load", lambda: mods)
    impl = next(i for i in vllm.IMPLS() if i.name == ENTRY.impls[0])
    rows = suite.run(registry, dev=device, profile=profiles.current("ci"), ops=[ENTRY.op], impls=[impl],
                     progress=False, ledger=tuple(entries), **SLICE)
    monkeypatch.undo()
    return pd.DataFrame([vars(r) for r in rows])


def _cases(f: pd.DataFrame, status: str, check: str = "numeric:o*") -> set[str]:
    return set(f[(f["status"] == status) & f["check"].str.match(check.replace("*", ".*"))]["case"])


@pytest.fixture(scope="module")
def plain(registry, device):
    """The slice without a ledger: which one-head cases fail and which pass (both must exist)."""
    with pytest.MonkeyPatch.context() as mp:
        f = _run(registry, device, mp, ())
    ran = set(f[f["status"] != "refused"]["case"])
    failing = _cases(f, "fail", "numeric:o")
    assert failing and ran - failing, "the slice must hold failing and passing one-head cases"
    assert set(f[f["status"] == "fail"]["check"].str.replace(r"@.*", "", regex=True)) == {"numeric:o"}
    return f, failing, ran - failing


def test_the_entry_lists_exactly_the_failing_one_head_cases(registry, device, plain, monkeypatch):
    _, failing, passing = plain
    f = _run(registry, device, monkeypatch, ledger.load("vllm"))
    assert "fail" not in set(f["status"]), f[f["status"] == "fail"][["case", "check", "detail"]]
    assert _cases(f, "known") == failing and set(f[f["status"] == "known"]["known"]) == {ENTRY.id}
    assert not (f["check"] == GONE).any()  # no case predicted that did not fail
    assert passing <= _cases(f, "pass", "numeric:o")


def test_a_fixed_kernel_reports_the_known_failure_gone(registry, device, plain, monkeypatch):
    """The fix (fp32 products, fp32 sum) passes every case, and each case the entry predicted reads
    ``ledger:<id>`` failing: the waiver does not outlive the bug."""
    _, failing, _ = plain
    f = _run(registry, device, monkeypatch, ledger.load("vllm"), plant="fp32-products")
    assert "known" not in set(f["status"])
    gone = f[f["check"] == GONE]
    assert set(gone["case"]) == failing and (gone["status"] == "fail").all()
    assert "did not happen" in gone["detail"].iloc[0] and ledger_vllm.REPRO in gone["detail"].iloc[0]
    assert set(f[f["check"] != GONE]["status"]) <= {"pass", "refused"}


def test_other_failures_are_not_hidden(registry, device, plain, monkeypatch):
    """A second bug (V read 1 % large) on top of vLLM's: the cases the data does not put under the entry
    still fail as ``fail``, and the run fails."""
    _, failing, passing = plain
    f = _run(registry, device, monkeypatch, ledger.load("vllm"), plant="v-scaled")
    assert _cases(f, "fail", "numeric:o") == passing
    assert _cases(f, "known") == failing  # the entry's own cases: the one limit of any ledger


def test_a_condition_that_ignores_the_data_cannot_list_it(registry, device, plain, monkeypatch):
    """An entry over the case alone (every one-head case) reports the known failure as gone on the
    passing cases: the condition has to read the inputs."""
    _, _, passing = plain
    coarse = dataclasses.replace(ENTRY, when_inputs=lambda case, inputs: True)
    f = _run(registry, device, monkeypatch, (coarse,))
    assert set(f[f["check"] == GONE]["case"]) == passing and (f["status"] == "fail").any()


def test_the_emulation_is_the_interpreted_kernel_bit_for_bit(registry, device, plain):
    """``one_head_decode`` equals the kernel's CPU output bitwise on every one-head case of the slice: each
    step of the emulation is the kernel's, ``qk *= sm_scale`` in fp32 as compiled Triton makes it (the shim
    types a float argument as fp32; without that, the interpreter rounded the product to bf16 once more and
    this failed)."""
    from cases.base import parse_case

    _, failing, passing = plain
    spec = registry.ops[ENTRY.op]
    impl = next(i for i in vllm.IMPLS() if i.name == ENTRY.impls[0])
    for display in sorted(failing | passing):
        case = parse_case(spec.case_type, display.split(":", 1)[1])
        inputs = spec.build_inputs(case, device)
        qo, kvp = inputs["qo_indptr"].tolist(), inputs["kv_indptr"].tolist()
        splits = vllm.mla_decode_splits(max(kvp[b + 1] - kvp[b] + qo[b + 1] - qo[b] for b in range(len(qo) - 1)))
        got = impl.fn(**spec.build_inputs(case, device))["o"]
        assert torch.equal(got, ledger_vllm.one_head_decode(inputs, splits)), display


def test_bf16_tree_sum_rounds_every_addition():
    x = torch.tensor([1.0, 2.0 ** -9, 2.0 ** -9, 0.0]).bfloat16()  # 1 + 2^-9 rounds back to 1 (ties to even)
    assert ledger_vllm.bf16_tree_sum(x).item() == 1.0 and x.double().sum().item() > 1.0
    with pytest.raises(ValueError, match="power of 2"):
        ledger_vllm.bf16_tree_sum(torch.ones(3).bfloat16())


# ----------------------------------------------------------------------------- the standalone repro

REPRO = ROOT / ledger_vllm.REPRO.split()[-1]


def _repro(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, str(REPRO), *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_the_repro_imports_no_harness_but_for_the_cpu_option():
    """Standalone: of the project's packages, only ``harness.shim``, inside the --cpu-interpreter branch."""
    import ast

    tree = ast.parse(REPRO.read_text())
    ours = ("harness", "cases", "reference", "fused", "reports", "tests")
    found = [(n.lineno, n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    found += [(n.lineno, a.name) for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    project = [(line, m) for line, m in found if m.split(".")[0] in ours]
    assert [m for _, m in project] == ["harness"], project
    branch = next(n for n in ast.walk(tree) if isinstance(n, ast.If) and "cpu_interpreter" in ast.unparse(n.test)
                  and any(isinstance(x, ast.ImportFrom) and x.module == "harness" for x in ast.walk(n)))
    assert branch.lineno <= project[0][0] <= branch.end_lineno


def test_the_repro_fails_on_vllms_kernel_and_passes_on_the_fixed_one():
    """Under --cpu-interpreter (the shim; the kernel's error overstated by the interpreter's extra
    rounding, see the script): exit 1 on vLLM's file, exit 0 on the fp32-products plant."""
    bad = _repro("--cpu-interpreter")
    assert bad.returncode == 1 and "FAIL" in bad.stdout, bad.stdout + bad.stderr
    fixed = _repro("--cpu-interpreter", "--kernel-file", str(_planted_file("fp32-products")))
    assert fixed.returncode == 0 and "ok: within the bound" in fixed.stdout, fixed.stdout + fixed.stderr
