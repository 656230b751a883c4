"""The runner's per-case setup: fresh inputs are exact copies (bytes, strides, offsets, shared
storages), and running the implementations of a case together gives what separate runs give;
a NaN is a ``finite:`` failure, never a ``numeric:`` one."""
from __future__ import annotations

import copy

import pytest
import torch

from cases import mla_fp8_prepare as mla_cases
from cases import verify_attention as va_cases
from harness import runners
from harness.registry import Impl, OpSpec, OutputSpec


def test_fresh_copies_keep_layout_bytes_and_aliasing():
    """The copy every run gets (``CaseSetup.fresh``: ``copy.deepcopy``)."""
    base = torch.randn(6, 10).to(torch.float8_e4m3fn)
    k = base[:, :8]  # a strided view with its own extent
    v = base[1:, 2:6]  # another view of the same storage, offset
    q = torch.randn(4, 3).t()  # transposed
    inputs = {"k": k, "v": v, "q": q, "n": 3, "none": None}
    out = copy.deepcopy(inputs)
    for name in ("k", "v", "q"):
        a, b = inputs[name], out[name]
        assert b.dtype == a.dtype and b.shape == a.shape and b.stride() == a.stride(), name
        assert b.storage_offset() == a.storage_offset(), name
        assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                           b.view(torch.uint8) if b.dtype != torch.float32 else b), name
        assert b.untyped_storage().data_ptr() != a.untyped_storage().data_ptr(), name
    assert out["k"].untyped_storage().data_ptr() == out["v"].untyped_storage().data_ptr()
    out["k"].view(torch.uint8)[1, 2] = 0x7F  # a write through one view shows through the other, as before
    assert out["v"].view(torch.uint8)[0, 0] == 0x7F and inputs["v"].view(torch.uint8)[0, 0] != 0x7F
    assert out["n"] == 3 and out["none"] is None


@pytest.mark.parametrize("op, case", [
    ("verify_attention", va_cases.catalog()[3]),
    ("mla_fp8_prepare", mla_cases.catalog()[0]),
])
def test_impls_of_a_case_together_equal_separate_runs(registry, device, op, case):
    """Sharing the setup changes nothing a row shows: the same checks, verdicts and errors, and a
    broken implementation run between two clean ones still fails alone."""
    spec = registry.ops[op]
    impls = [i for k, i in sorted(registry.impls.items()) if i.op == op and i.kind in ("reference", "fused")]
    mutant = next(i for k, i in sorted(registry.impls.items()) if i.op == op and i.kind == "mutant"
                  and not all(x.passed for x in runners.run_case(spec, i, case, device).records))
    impls = [impls[0], mutant] + impls[1:]
    together = runners.run_impls(spec, impls, case, device)
    apart = [runners.run_case(spec, i, case, device) for i in impls]
    view = lambda r: (r.refused, [(x.check, x.passed, x.err) for x in r.records])  # noqa: E731
    assert [view(r) for r in together] == [view(r) for r in apart]
    assert not all(x.passed for x in together[1].records)
    assert all(all(x.passed for x in r.records) for i, r in zip(impls, together) if i is not mutant and not r.refused)


# ----------------------------------------------------------------------------- finite:

def _one_nan(**kw):
    """The reference chain with one planted NaN at o[1, 2, 3]."""
    from reference import verify_attention as r

    o = r.verify_attention(**kw)["o"].clone()
    o[1, 2, 3] = float("nan")
    return {"o": o}


def test_a_planted_nan_fails_finite_not_numeric(registry, device):
    spec = registry.ops["verify_attention"]
    case = {c.name: c for c in va_cases.catalog()}["width-2"]
    res = runners.run_case(spec, Impl("verify_attention", "plant-one-nan", "external", _one_nan), case, device,
                           determinism=False)
    by = {r.check: r for r in res.records}
    for suffix in ("", "@poisoned"):
        f, n = by[f"finite:o{suffix}"], by[f"numeric:o{suffix}"]
        assert not f.passed and f.nan_inf_mismatch == 1 and f.worst.startswith("(1, 2, 3): nan/"), f
        assert n.passed and n.nan_inf_mismatch == 1, n
    checks = [r.check for r in res.records]
    assert checks.index("finite:o") < checks.index("numeric:o")


class _Toy:
    """A toy op y = 1 / x whose oracle has +Inf, -Inf (x = ±0) and NaN (x = NaN)."""
    X = torch.tensor([1.0, 0.0, -0.0, 2.0, float("nan"), -4.0, 0.5, 8.0] * 4)

    @staticmethod
    def spec() -> OpSpec:
        return OpSpec(name="toy", case_type=object, catalog=lambda **_: [], strategy=lambda: None,
                      build_inputs=lambda case, dev: {"x": _Toy.X.clone()},
                      reference=lambda x: {"y": 1 / x}, oracle=lambda x: {"y": 1 / x.double()},
                      outputs=(OutputSpec("y", "numeric"),), effects=lambda case, inputs, oracle: [])

    @staticmethod
    def right(x):
        y = torch.empty_like(x)
        torch.reciprocal(x, out=y)
        return {"y": y}


def test_the_oracles_own_infinities_pass(device):
    res = runners.run_case(_Toy.spec(), Impl("toy", "right", "external", _Toy.right), None, device)
    assert res.records and all(r.passed for r in res.records), [r for r in res.records if not r.passed]
    assert {"finite:y", "numeric:y", "finite:y@poisoned"} <= {r.check for r in res.records}
