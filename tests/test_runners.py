"""The runner's per-case setup: fresh inputs are exact copies (bytes, strides, offsets, shared
storages), and running the implementations of a case together gives what separate runs give."""
from __future__ import annotations

import copy

import pytest
import torch

from cases import mla_fp8_prepare as mla_cases
from cases import verify_attention as va_cases
from harness import runners


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
