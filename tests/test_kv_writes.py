"""``exact:kv_writes`` compares the rows of the pool that changed, not the wrapper's own count of
the rows it wrote: a kernel that writes a row it should not (and does not count it) fails it, a
count of a write that did not happen fails it, and a rerun's record is reused only when the pool
holds the same bytes."""
from __future__ import annotations

import itertools

import pytest
import torch

from cases.mla_fp8_prepare import catalog as mc
from harness.parity import runners
from harness.registry import Impl
from tests.helpers import failed_checks

OP = "mla_fp8_prepare"
CATALOG = {c.name: c for c in mc.catalog()}


def _fused(**kw):
    from fused.mla_fp8_prepare import wrapper as f

    return f.mla_fp8_prepare_step(**kw)


def _extra_row(**kw):
    """The real fused step, and token 0's KV row stored into the reserved slot 0 as well (a loc mask
    that lets a padding entry through as row 0): the step's count does not know of the write."""
    out = _fused(**kw)
    buf = kw["kv_buffer"]
    phys = kw["decode_kernel_loc"]
    src = int(phys[phys >= 0][0])
    buf[0] = buf[src]
    return out


def _counted_not_written(**kw):
    """The real fused step, then one written row restored to its old bytes: the count says written."""
    old = kw["kv_buffer"].clone()
    out = _fused(**kw)
    phys = kw["decode_kernel_loc"]
    row = int(phys[phys >= 0][0])
    kw["kv_buffer"][row] = old[row]
    return out


def _impl(name, fn):
    return Impl(OP, name, "external", fn, doc="planted in tests/test_kv_writes.py")


CASE = CATALOG["k3-verify-b1-l3-h8"]  # the kernel path, an identity pool with stale rows


def test_planted_extra_row_fails_exact_kv_writes(registry, device):
    """The wrapper's count is the clean kernel's: only the pool shows the extra row."""
    spec = registry.ops[OP]
    res = runners.run_case(spec, _impl("planted-extra-row", _extra_row), CASE, device, determinism=False,
                           poisoned=False, poisoned_alloc=False)
    rec = next(r for r in res.records if r.check == "exact:kv_writes")
    assert not rec.passed and rec.worst.startswith("(0,)"), rec
    assert "changed row" in rec.detail
    assert {"exact:kv_writes", "untouched:kv_buffer"} <= {r.check for r in res.records if not r.passed}


def test_counted_write_that_did_not_happen_fails_exact_kv_writes(registry, device):
    bad = set(failed_checks(registry.ops[OP], _impl("planted-counted-not-written", _counted_not_written), CASE,
                            device))
    assert {"exact:kv_writes", "effect:kv_buffer"} <= bad


@pytest.mark.parametrize("name", ["k3-verify-b1-l3-h8", "translated-pool-full", "writes-off", "all-padding",
                                  "padding-int32-loc-fnuz"])
@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_clean_implementations_pass_every_run(registry, device, impl, name):
    """Every run (first, poisoned-alloc rerun, poisoned buffers of 0xFF bytes) of a clean implementation
    passes, writes off and all-padding cases (nothing changes) included. Where the fused kernel has no
    conversion for the case's fp8 format (fnuz on NVIDIA: Triton has no fp8e4b8 there) it refuses the
    case, naming the format, and runs nothing."""
    from fused.mla_fp8_prepare import wrapper as f

    case = CATALOG[name]
    res = runners.run_case(registry.ops[OP], registry.impls[f"{OP}/{impl}"], case, device)
    if impl == "fused" and case.fp8_format not in f.kernel_fp8_formats(device):
        assert case.fp8_format in res.refused and not res.records, res
        return
    kv = [r for r in res.records if r.check.startswith("exact:kv_writes")]
    assert len(kv) == 3 and all(r.passed for r in kv), kv


def test_rerun_record_reused_only_when_the_pool_is_the_same(registry, device):
    """A step whose second call writes the extra row: its count (the output) is the same bytes both
    times, so a reuse keyed on the outputs alone would pass the rerun; keyed on the pool, it fails."""
    calls = itertools.count()

    def second_call_extra_row(**kw):
        return _extra_row(**kw) if next(calls) == 1 else _fused(**kw)

    res = runners.run_case(registry.ops[OP], _impl("planted-extra-row-on-rerun", second_call_extra_row), CASE, device,
                           determinism=False, poisoned=False)
    verdict = {r.check: r.passed for r in res.records}
    assert verdict["exact:kv_writes"] and not verdict["exact:kv_writes@poisoned-alloc"], verdict


def test_observed_writes_keeps_a_malformed_count_for_the_check_to_name():
    from cases.mla_fp8_prepare.spec import _observed_writes

    buf = torch.zeros(4, 3, dtype=torch.uint8)
    after = buf.clone()
    after[2, 1] = 7
    assert _observed_writes(None, {"kv_buffer": after}, {"kv_buffer": buf}) is None
    short = torch.zeros(3, dtype=torch.int32)
    assert _observed_writes(short, {"kv_buffer": after}, {"kv_buffer": buf}) is short
    counted = torch.tensor([0, 2, 0, 1], dtype=torch.int32)  # row 1 counted twice, row 2 unreported, row 3 unchanged
    assert _observed_writes(counted, {"kv_buffer": after}, {"kv_buffer": buf}).tolist() == [0, 0, 1, 0]
