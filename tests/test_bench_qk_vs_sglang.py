"""``python -m cases.qk_norm_rope.bench --vs-sglang`` on the CPU: the whole path at a tiny size
(the interpreter's times mean nothing), and the table's pure parts."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.bench import before as before_module
from cases.qk_norm_rope import bench as b
from cases.qk_norm_rope import bench_shape
from cases.qk_norm_rope import bench_vs_sglang as vs


def test_parse_configs():
    assert vs.parse_configs("default") == [None]
    assert vs.parse_configs("default, 2x4,8X8") == [None, (2, 4), (8, 8)]
    assert vs.parse_configs("") == [None]


def test_line_states_ratios_against_sglang_and_bandwidth():
    r = vs.VsRow("verify", 5, 16, bytes_moved=1_000_000, copy_gbps=1000.0,
                graph_us={"ours": 2.0, "ours@2x4": 1.0, "sglang": 4.0}, eager_us={"ours-wrapper": 9.0, "sglang": 6.0},
                differ={"ours@2x4": 0})
    line = vs.vs_line(r)
    assert "graph best ours@2x4/sglang 0.25" in line  # the best of our configs
    assert "(50.0%)" in line  # 1 MB in 2 us = 500 GB/s of 1000
    assert "ours-wrapper/sglang 1.50" in line and "ours@2x4 0" in line
    f = vs.vs_frame([r])
    assert math.isclose(f.loc[0, "graph_ours_frac_of_copy"], 0.5)


def test_the_floor_is_not_the_op():
    """The launch floor is timed beside the kernels, but it moves none of the op's bytes: no % of copy."""
    r = vs.VsRow("decode", 1, 8, bytes_moved=1_000_000, copy_gbps=1000.0, graph_us={"ours": 2.0, "floor": 1.0},
                 eager_us={}, differ={})
    assert "floor    1.00 |" in vs.vs_line(r) and "(50.0%)" in vs.vs_line(r)
    f = vs.vs_frame([r])
    assert f.loc[0, "graph_floor_us"] == 1.0 and "graph_floor_frac_of_copy" not in f


def test_eager_loops_are_interleaved():
    """Each repeat times one loop of every callable, the order rotated per repeat: a slower host
    during part of the run slows every callable alike. Planted: the callables timed one after the
    other (all loops of the first, then the second) fails, and so does a fixed order."""
    from harness import devices
    from harness.gpu import profiling

    order = []
    fns = {n: (lambda n=n: order.append(n)) for n in "abc"}
    cpu = devices.Device("cpu", "cpu", "interpreter", "e4m3fn", "")  # no select("cpu"): it sets TRITON_INTERPRET process-wide
    got = profiling.eager_us_interleaved(fns, dev=cpu, iters=2, repeats=3)
    assert set(got) == set("abc") and all(v > 0 for v in got.values())
    loops = order[3::2]  # after one warm-up call each, every loop is 2 calls of one callable
    assert loops == list("abc" "bca" "cab")


def test_decode_moves_the_ring_rows_too():
    assert vs.vs_bytes("decode", 4, 8) - vs.vs_bytes("verify", 4, 8) == 4 * bench_shape.D * 2 + 4 * 8


def test_cpu_smoke_run_writes_the_table(tmp_path, capsys, monkeypatch, device):
    if not device.interpreted:  # with gpu_present patched off, a GPU runner's compiled Triton got CPU tensors
        pytest.skip("the bench's no-GPU path runs under the interpreter; on a GPU the nightly's bench step runs it")
    monkeypatch.setattr("harness.devices.gpu_present", lambda: False)
    rc = b.main(["--vs-sglang", "--out", str(tmp_path), "--T", "1", "--H", "1", "--configs", "default,1x1",
                 "--before", b.__file__.replace("cases/qk_norm_rope/bench.py", "fused/qk_norm_rope/wrapper.py")])
    assert rc == 0
    out = capsys.readouterr().out
    frame = pd.read_csv(tmp_path / "qk_norm_rope_vs_sglang.csv")
    assert list(frame["mode"]) == ["verify", "decode"]
    assert (frame["bytes_differing_ours@1x1"] == 0).all() and (frame["bytes_differing_before"] == 0).all()
    assert frame["graph_floor_us"].notna().all() and frame["eager_ours-device-checked_us"].notna().all()
    pytest.importorskip("sglang")
    assert "graph_sglang_us" in frame and "eager_sglang_us" in frame, out
    assert (frame["bytes_differing_sglang"] == 0).all()  # the same fp32 math, one bf16 rounding


@pytest.mark.parametrize("machine", ["this", "rocm"])
def test_jit_refused_in_one_line_its_columns_nan_with_the_reason(machine, tmp_path, capsys, monkeypatch, device):
    """Where SGLang's JIT kernels cannot run (no CUDA device here; ROCm), one line says what is missing
    (``sglang_jit.missing``), never an error; the rest is timed and the table keeps their columns, NaN, with
    the reason. Planted: the refusal removed (the kernels called as if they ran) fails."""
    from harness.adapters import sglang_jit

    if not device.interpreted:
        pytest.skip("the bench's no-GPU path runs under the interpreter")
    if machine == "rocm":
        monkeypatch.setattr(sglang_jit, "_is_hip", lambda: True)
    lacks = sglang_jit.missing("qk")
    if not lacks:
        pytest.skip("this machine runs SGLang's JIT kernels: the refusal is the CPU's and ROCm's")
    monkeypatch.setattr("harness.devices.gpu_present", lambda: False)
    assert b.main(["--vs-sglang", "--out", str(tmp_path), "--T", "1", "--H", "1", "--no-sglang"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"  {vs.JIT}:")]
    assert said == [f"  {vs.JIT}: refused on this machine: {lacks}"]
    frame = pd.read_csv(tmp_path / "qk_norm_rope_vs_sglang.csv")
    assert list(frame["mode"]) == ["verify", "decode"] and frame["graph_ours_us"].notna().all()
    jit_cols = [f"graph_{vs.JIT}_us", f"eager_{vs.JIT}_us", f"graph_ours_over_{vs.JIT}", f"eager_ours-wrapper_over_{vs.JIT}"]
    assert frame[jit_cols].isna().all(axis=None)
    assert frame[f"{vs.JIT}_refused"].tolist() == [lacks, lacks]


def test_jit_timed_beside_ours_where_the_adapter_covers_the_row(device):
    """SGLang's JIT kernels (here the adapter over their torch emulation) timed beside ours, graph and eager,
    with ours / them, on the verify rows; the decode rows keep the adapter's reason, said once. Planted: the
    JIT callable left out of a timer, the reason said per row, or a decode row without it fails."""
    from harness.adapters import sglang_jit_emulation as emu

    said = []
    rows = vs.vs_measure(["verify", "decode"], [1, 2], [1], [None], with_sglang=False, with_compiled=False,
                         graph_timer=lambda fn: (fn(), 3.0)[1], eager_timer=lambda fns: {n: (f(), 6.0)[1] for n, f in fns.items()},
                         copy_gbps=0.0, device=device.torch_device, progress=said.append, jit_kernels=emu.KERNELS)
    verify, decode = rows[:2], rows[2:]
    assert all(r.graph_us[vs.JIT] == 3.0 and r.eager_us[vs.JIT] == 6.0 and not r.refused for r in verify)
    assert all(vs.JIT not in r.graph_us and vs.JIT not in r.eager_us and "verify mode only" in r.refused[vs.JIT]
               for r in decode)
    assert [line for line in said if line.startswith(f"  {vs.JIT}:")] == [
        f"  {vs.JIT}: not timed from decode T=1 H=1 on: {decode[0].refused[vs.JIT]}"]
    assert f"graph best ours/{vs.JIT} 1.00" in vs.vs_line(verify[0]) and f"ours-wrapper/{vs.JIT} 1.00" in vs.vs_line(verify[0])
    frame = vs.vs_frame(rows)
    assert frame[f"graph_ours_over_{vs.JIT}"].tolist()[:2] == [1.0, 1.0] and frame[f"graph_ours_over_{vs.JIT}"][2:].isna().all()
    assert frame[f"{vs.JIT}_refused"].tolist()[:2] == ["", ""] and frame[f"{vs.JIT}_refused"][2:].str.contains("verify mode").all()


QK_WRAPPER = Path(b.__file__).parents[2] / "fused" / "qk_norm_rope" / "wrapper.py"
# this tree's imports -> those of the layout of trees before 2026-12-07: fused/qk_norm_rope.py beside
# fused/kernels/qk_norm_rope.py and fused/qk_norm_rope_dispatch.py, the reference one module
OLDER_IMPORTS = {"from fused.qk_norm_rope import dispatch\n": "from fused import qk_norm_rope_dispatch as dispatch\n",
                 "from fused.qk_norm_rope import kernels as kern\n": "from fused.kernels import qk_norm_rope as kern\n",
                 "from reference.qk_norm_rope import chain as ref\n": "from reference import qk_norm_rope as ref\n",
                 "from reference.qk_norm_rope import swa\n": "from reference import qk_norm_rope as swa\n"}


def _older_tree(tmp_path) -> Path:
    """Our qk_norm_rope files laid out as a tree from before 2026-12-07: the op module
    fused/qk_norm_rope.py (its one launch still ``_launch``), its kernels and dispatch under the
    older names, every import of theirs naming the older modules."""
    (tmp_path / "fused" / "kernels").mkdir(parents=True)
    for ours, older in (("wrapper.py", "qk_norm_rope.py"), ("dispatch.py", "qk_norm_rope_dispatch.py"),
                        ("kernels.py", "kernels/qk_norm_rope.py")):
        text = (QK_WRAPPER.parent / ours).read_text()
        for new, old in OLDER_IMPORTS.items():
            text = text.replace(new, old)
        if ours == "wrapper.py":
            text = re.sub(r"\blaunch\b", "_launch", text)
        imports = [line for line in text.splitlines() if line.startswith(("from ", "import "))]
        assert not [line for line in imports if ".qk_norm_rope" in line], imports  # nothing of ours left
        (tmp_path / "fused" / older).write_text(text)
    return tmp_path / "fused" / "qk_norm_rope.py"


@pytest.mark.parametrize("layout", ["packages", "older"])
def test_before_brings_its_own_kernels(tmp_path, layout, device):
    """``--before`` times the other file with the kernels and the dispatch beside it (``fused/`` of
    that tree), never ours: on a GPU its launches go through its dispatch, which launches the kernel
    that dispatch imported. Both layouts: this tree's (fused/qk_norm_rope/wrapper.py) and the one
    before 2026-12-07 (fused/qk_norm_rope.py, whose imports name modules our tree no longer has).
    Ours are back in place afterwards, the older names gone again, and the module's launch writes
    our bytes. Planted: loading the file alone (our kernels under its wrapper; the older layout's
    imports unresolved) fails; swapping the kernels but not the dispatch (ours launched under its
    name on a GPU) fails; the older names left behind fail."""
    import sys

    import fused
    import reference
    from fused.qk_norm_rope import dispatch as our_dispatch
    from fused.qk_norm_rope import kernels as ours
    from reference.qk_norm_rope import chain

    path = QK_WRAPPER if layout == "packages" else _older_tree(tmp_path)
    before = before_module.load_module(path)
    assert before.kern is not ours and before.kern.__name__ == "qk_norm_rope_before_kernels"
    assert before.dispatch is not our_dispatch and before.dispatch.__name__ == "qk_norm_rope_before_dispatch"
    assert before.dispatch.kern is before.kern  # the kernel its compiled launches run
    assert before.dispatch._compiled is not our_dispatch._compiled  # no CompiledKernel of ours under its key
    assert Path(before.kern.__file__).parent == path.parent / ("kernels" if layout == "older" else "")
    assert fused.qk_norm_rope.kernels is ours and sys.modules["fused.qk_norm_rope.kernels"] is ours
    assert fused.qk_norm_rope.dispatch is our_dispatch and sys.modules["fused.qk_norm_rope.dispatch"] is our_dispatch
    assert "fused.kernels" not in sys.modules and not hasattr(fused, "kernels")
    assert "fused.qk_norm_rope_dispatch" not in sys.modules and not hasattr(fused, "qk_norm_rope_dispatch")
    assert reference.qk_norm_rope is sys.modules["reference.qk_norm_rope"] and reference.qk_norm_rope.chain is chain
    if layout == "older":
        assert before.ref.validate is chain.validate and before.ref.SwaLayout is before.swa.SwaLayout
        assert before.launch is before._launch
    kw = vs.vs_inputs("decode", 2, 2, device.torch_device)  # the CPU's tensors failed in a GPU runner's launch
    assert vs.byte_differences(kw, [None], before) == {"before": 0}
