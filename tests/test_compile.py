"""Every Triton kernel compiles for NVIDIA (sm90) and AMD (gfx942, gfx950) from this machine:
the interpreter accepts code that compilers reject (e.g. a variable changing dtype between
the branches of an ``if``, which it took a compile to catch in qk_norm_rope)."""
from __future__ import annotations

import textwrap

import pytest

from harness.gpu.compile import TARGETS
from harness.ops import BUILTIN
from tests.helpers import harness_cli, subprocess_env


# one test per target: with an empty Triton cache qk_norm_rope's 42 variants took 264 s for all three
# targets in one test on a 16-worker H200 host, the suite's floor; apart, xdist runs them side by side
@pytest.mark.long
@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("op", BUILTIN)
def test_kernels_compile_for_nvidia_and_amd(op, target):
    env = {k: v for k, v in subprocess_env().items() if k != "TRITON_INTERPRET"}
    r = harness_cli(["compile", "--op", op, "--target", target], env=env, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert f"kernel variants for {target}" in r.stdout, r.stdout[-4000:]


# a plugin with its own Triton kernels: one that compiles, one only a compiler rejects, one pure torch
KERNEL_PLUGIN = textwrap.dedent('''
    import triton
    import triton.language as tl

    from harness.registry import Impl
    from reference.qk_norm_rope import chain as r


    @triton.jit
    def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m).to(tl.float32) * 2.0, mask=m)


    @triton.jit
    def _broken(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs)
        if n > 0:  # v changes dtype in one branch only: the interpreter runs it, the compiler refuses
            v = v.to(tl.float32)
        tl.store(x_ptr + offs, v)


    def specs():
        return [("_scale[BLOCK=128]", _scale, {"x_ptr": "*bf16", "y_ptr": "*fp32", "n": "i32"}, {"BLOCK": 128}, 4)]


    def broken_specs():
        return [("_broken[BLOCK=64]", _broken, {"x_ptr": "*bf16", "n": "i32"}, {"BLOCK": 64}, 4)]


    def step(**kw):
        return r.qk_norm_rope_step(**kw)


    GOOD = Impl("qk_norm_rope", "vendor-kernel", "external", step, compile_specs=specs)
    BROKEN = Impl("qk_norm_rope", "vendor-broken-kernel", "external", step, compile_specs=broken_specs)
    TORCH = Impl("qk_norm_rope", "vendor-torch", "external", step)
    ALL = [GOOD, TORCH]
''')


def _compile(tmp_path, *args):
    (tmp_path / "vendor_kernels.py").write_text(KERNEL_PLUGIN)
    env = {k: v for k, v in subprocess_env().items() if k != "TRITON_INTERPRET"}
    return harness_cli(["compile", *args], cwd=tmp_path, env=env, timeout=1200)


def test_plugin_kernels_compile_with_impl(tmp_path):
    """``--impl module:attr`` compiles the kernels the plugin declares (Impl.compile_specs), from the
    current directory, and only those; an implementation declaring none is named and skipped."""
    r = _compile(tmp_path, "--impl", "vendor_kernels:ALL", "--target", "sm90", "--target", "gfx942")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "qk_norm_rope/vendor-torch: declares no Triton kernels" in r.stdout
    assert "compiled 2/2 kernel variants for sm90, gfx942" in r.stdout
    assert "vendor-kernel" in r.stdout and "_scale[BLOCK=128]" in r.stdout and "_qk_norm_rope" not in r.stdout


def test_plugin_kernel_only_a_compiler_rejects_fails(tmp_path):
    r = _compile(tmp_path, "--impl", "vendor_kernels:BROKEN", "--target", "sm90")
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-4000:]
    assert "_broken[BLOCK=64]" in r.stdout and "compiled 0/1 kernel variants" in r.stdout


def test_plugin_without_kernels_is_a_usage_error(tmp_path):
    r = _compile(tmp_path, "--impl", "vendor_kernels:TORCH")
    assert r.returncode == 2 and "declaring no Triton kernels" in r.stderr, r.stdout + r.stderr
    r = _compile(tmp_path, "--impl", "fused")
    assert r.returncode == 2 and "module:attr" in r.stderr, r.stdout + r.stderr
