"""Shared fixtures. The device is chosen once, before any kernel module is imported:
``VP_DEVICE`` (auto | cpu | cuda | rocm; auto = the GPU if torch sees one, else the CPU
interpreter). ``VP_PROFILE`` picks the hypothesis profile (ci | nightly | dev)."""
from __future__ import annotations

import os

import pytest

from cases import profiles
from harness import devices

DEVICE = devices.select(os.environ.get("VP_DEVICE", "auto"))
PROFILE = profiles.load_hypothesis_profile()


def pytest_report_header(config):
    return [f"verify-parity: device={DEVICE.kind} ({DEVICE.name}, {DEVICE.arch}) fp8={DEVICE.fp8_format} "
            f"shim={DEVICE.shim or 'off'} profile={PROFILE.name}"]


def pytest_collection_modifyitems(config, items):
    if DEVICE.interpreted:
        skip = pytest.mark.skip(reason="needs a GPU: runs on CUDA/ROCm runners (nox -s gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


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
