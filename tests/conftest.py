"""Shared fixtures. The device is chosen once, before any kernel module is imported:
``VP_DEVICE`` (auto | cpu | cuda | rocm; auto = the GPU if torch sees one, else the CPU
interpreter). ``VP_PROFILE`` picks the hypothesis profile (ci | nightly | dev)."""
from __future__ import annotations

import os

# One intra-op thread in every test process unless the caller sets its own: xdist runs a worker per core, and
# torch's default of a thread per core in each worker oversubscribes the machine. Set before torch loads here
# and inherited by the xdist workers and the tests' subprocesses. On the 2-core CI machine, 2026-12-07,
# tests/test_verify_attention.py + tests/test_qk_norm_rope.py with -n 2 took 203 s with torch's default and
# 69 s with one thread (test_threads.py holds it).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from cases import profiles  # noqa: E402
from harness import devices  # noqa: E402

DEVICE = devices.select(os.environ.get("VP_DEVICE", "auto"))
PROFILE = profiles.load_hypothesis_profile()


def pytest_report_header(config):
    return [f"verify-parity: device={DEVICE.kind} ({DEVICE.name}, {DEVICE.arch}) fp8={DEVICE.fp8_format} "
            f"shim={DEVICE.shim or 'off'} profile={PROFILE.name}"]


def spread_evenly(items: list, is_long) -> list:
    """``items`` with the long ones spaced evenly through the list, each kind in its own order (deterministic:
    every xdist worker collects the same order). ``--dist worksteal`` hands each worker a contiguous slice
    of the collection and then moves tests from the end of the longest queue: spaced out, every slice holds
    its share of the long tests. Collected first instead, they all fell in the first worker's slice and ran
    one after the other (on an H100, 2026-12-07, a compile test started at 403 s of a 462 s suite)."""
    long = [i for i in items if is_long(i)]
    rest = [i for i in items if not is_long(i)]
    at = {len(items) * k // len(long) for k in range(len(long))} if long else set()
    out, li, ri = [], iter(long), iter(rest)
    for pos in range(len(items)):
        out.append(next(li) if pos in at else next(ri))
    return out


def pytest_collection_modifyitems(config, items):
    items[:] = spread_evenly(items, lambda item: "long" in item.keywords)
    if DEVICE.interpreted:
        skip = pytest.mark.skip(reason="needs a GPU: runs on CUDA/ROCm runners (nox -s gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


DEVICE_ENV = ("TRITON_INTERPRET", "VP_DEVICE")  # what devices.select sets for the whole process


@pytest.fixture(autouse=True)
def _device_env_kept():
    """A test leaves the device environment as it found it. ``devices.select("cpu")`` in a test sets
    ``TRITON_INTERPRET=1`` for the whole worker: harmless under the interpreter, but on a GPU runner
    every later CLI subprocess of that worker inherits it and refuses its GPU run (found on an H100:
    six unrelated CLI tests failed after one such test). The test that changes it fails, by name."""
    before = {k: os.environ.get(k) for k in DEVICE_ENV}
    yield
    after = {k: os.environ.get(k) for k in DEVICE_ENV}
    if after != before:
        for k, v in before.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        pytest.fail(f"the test changed the device environment {before} -> {after} (construct a "
                    f"harness.devices.Device instead of calling devices.select)")


@pytest.fixture(scope="session")
def device():
    return DEVICE


@pytest.fixture(scope="session")
def registry():
    from harness.ops import default_registry

    return default_registry(with_plugins=False)


@pytest.fixture(scope="module")
def spec(request, registry):
    """The OpSpec of the op a test module checks: the one its module-level ``OP`` names."""
    return registry.ops[request.module.OP]
