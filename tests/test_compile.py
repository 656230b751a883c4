"""Every Triton kernel compiles for NVIDIA (sm90) and AMD (gfx942, gfx950) from this machine:
the interpreter accepts code that compilers reject (e.g. a variable changing dtype between
the branches of an ``if``, which it took a compile to catch in qk_norm_rope)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from harness.ops import BUILTIN
from tests.helpers import ROOT, subprocess_env


@pytest.mark.parametrize("op", BUILTIN)
def test_kernels_compile_for_nvidia_and_amd(op):
    env = {k: v for k, v in subprocess_env().items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "harness", "compile", "--op", op], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    for target in ("sm90", "gfx942", "gfx950"):
        assert target in r.stdout
