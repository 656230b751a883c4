"""The qk_norm_rope wrapper's eager dispatch (``fused.qk_norm_rope._compiled_launch``): a variant's
second launch goes through the CompiledKernel its first one returned, keyed on everything Triton
specialises the kernel on. A key that missed one of those would launch a binary compiled for other
arguments (alignment, dtype, a constexpr): the GPU test compares every variant's bytes with the
JIT's own launch, aligned and not."""
from __future__ import annotations

import copy

import pytest
import torch

from fused import qk_norm_rope as f


def test_specialised_ints_are_the_kernels():
    """Every int parameter is either value-specialised (in the key exactly) or in the kernel's
    do_not_specialize, as the JIT builds its parameters from the decorator's arguments."""
    import inspect

    from triton.runtime.jit import JITFunction

    from fused.kernels import qk_norm_rope as k

    kernel = k._qk_norm_rope_kernel
    dns = getattr(kernel, "do_not_specialize", None) or kernel.kwargs["do_not_specialize"]  # JIT / interpreter
    jit = JITFunction(kernel.fn, do_not_specialize=dns)
    specialised = {p.name for p in jit.params if not p.is_constexpr and not p.do_not_specialize}
    assert specialised - set(f._POINTERS) - {"eps"} == set(f._SPECIALISED_INTS)
    assert set(f._CONSTEXPRS) == {p.name for p in jit.params if p.is_constexpr}
    assert list(f._ALL_ARGS) == list(inspect.signature(kernel.fn).parameters)


def _variants(device):
    from cases import qk_norm_rope as c

    for T, H in ((1, 4), (5, 16), (300, 8)):
        for unified, mode in ((True, "target_verify"), (True, "decode"), (False, "decode")):
            case = (c.QkNormRopeCase(T=T, H=H, D=512, R=64, mode=mode, seed=T) if unified else
                    c.QkNormRopeCase(T=T, H=H, D=512, R=64, unified=False, page_size=4, mode=mode, seed=T))
            kw = c.build_inputs(case, device)
            kw.pop("forward_mode")
            if mode != "decode" and unified:
                kw.pop("ring"), kw.pop("loc")
            yield f"T{T}-H{H}-{'unified' if unified else 'paged'}-{mode}", kw


def _unaligned(kw):
    """q one element into a larger buffer: its pointer is 2-byte, not 16-byte, aligned."""
    q = kw["q"]
    buf = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)
    u = buf[1:].view(q.shape)
    u.copy_(q)
    return {**kw, "q": u}


def _bytes(kw, checked):
    kw = copy.deepcopy(kw)
    q, k = f.qk_norm_rope(**kw, checked=checked)
    store = kw.get("ring", kw.get("swa_cache"))
    return [q.view(torch.uint8), k.view(torch.uint8)] + ([store.view(torch.uint8)] if store is not None else [])


@pytest.mark.gpu
def test_fast_launch_writes_the_jits_bytes(device, monkeypatch):
    from fused import device_checks as dc

    for name, kw in _variants(device):
        for layout, args in (("aligned", kw), ("unaligned-q", _unaligned(kw))):
            for checked in (True, "device"):
                monkeypatch.setenv(f.FAST_LAUNCH_ENV, "0")
                want = _bytes(args, checked)
                monkeypatch.setenv(f.FAST_LAUNCH_ENV, "1")
                first = _bytes(args, checked)  # seen once: through the JIT, then cached
                n = len(f._compiled)
                got = _bytes(args, checked)  # through the cached CompiledKernel
                assert len(f._compiled) == n, (name, layout)  # no new variant on the second call
                assert all(torch.equal(a, b) for a, b in zip(want, first)), (name, layout, checked)
                assert all(torch.equal(a, b) for a, b in zip(want, got)), (name, layout, checked)
    assert dc.pending() == []


@pytest.mark.gpu
def test_alignment_and_dtype_are_in_the_key(device, monkeypatch):
    monkeypatch.setattr(f, "_compiled", {})  # the other tests' variants out of the count
    name, kw = next(_variants(device))
    f.qk_norm_rope(**copy.deepcopy(kw))
    n = len(f._compiled)
    f.qk_norm_rope(**copy.deepcopy(_unaligned(kw)))
    assert len(f._compiled) == n + 1  # another variant, not the aligned one's binary
    f.qk_norm_rope(**{**copy.deepcopy(kw), "positions": kw["positions"].to(torch.int32)})
    assert len(f._compiled) == n + 2


class _FakeCompiled:
    """Stands in for Triton's CompiledKernel: ``[grid](*args)`` as its runner reads them (grid[0..2])."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args: self.calls.append((grid[0], grid[1], grid[2], args))


class _FakeJit:
    def __init__(self):
        self.compiled = _FakeCompiled()
        self.jit_calls = []

    def __getitem__(self, grid):
        def run(**kw):
            self.jit_calls.append((grid, kw))
            return self.compiled
        return run


def test_second_launch_takes_the_compiled_kernel_with_the_jits_arguments(device, monkeypatch):
    """The dispatch's glue, on any machine: the first launch of a variant goes through the JIT, the
    second through what it returned, with every kernel parameter in signature order (the JIT's own
    arguments plus the defaults) and a three-axis grid; VP_FAST_LAUNCH=0 always takes the JIT."""
    from fused.kernels import qk_norm_rope as k

    name, kw = next(_variants(device))
    fake = _FakeJit()
    monkeypatch.setattr(k, "_qk_norm_rope_kernel", fake)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(f, "_compiled", {})
    f.qk_norm_rope(**copy.deepcopy(kw), checked=False)
    f.qk_norm_rope(**copy.deepcopy(kw), checked=False)
    assert len(fake.jit_calls) == 1 and len(fake.compiled.calls) == 1
    grid, jit_kw = fake.jit_calls[0]
    g0, g1, g2, args = fake.compiled.calls[0]
    assert (g0, g1, g2) == tuple(grid) and len(grid) == 3
    jit_kw = {n: v for n, v in jit_kw.items() if n != "num_warps"}
    want = [jit_kw.get(n, default) for n, default in f._ALL_ARGS.items()]
    assert len(args) == len(want)
    def same_arg(name, a, b):  # each call deep-copies its inputs: equal tensors, not the same ones
        if not isinstance(a, torch.Tensor):
            return a == b
        meta = (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        return meta and (name in ("q_out_ptr", "kv_out_ptr", "ring_ptr") or torch.equal(a, b))  # fresh outputs

    same = [same_arg(n, a, b) for n, a, b in zip(f._ALL_ARGS, args, want)]
    assert all(same), [n for n, ok in zip(f._ALL_ARGS, same) if not ok]
    monkeypatch.setenv(f.FAST_LAUNCH_ENV, "0")
    f.qk_norm_rope(**copy.deepcopy(kw), checked=False)
    assert len(fake.jit_calls) == 2
