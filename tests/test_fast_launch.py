"""The qk_norm_rope wrapper's eager dispatch (``fused.qk_norm_rope.dispatch.compiled_launch``): a variant's
second launch goes through the CompiledKernel its first one returned, keyed on everything Triton
specialises the kernel on. A key that missed one of those would launch a binary compiled for other
arguments (alignment, dtype, a constexpr): the GPU test compares every variant's bytes with the
JIT's own launch, aligned and not. A call whose arguments' metadata equals an earlier one's takes
that call's plan (``fused.qk_norm_rope.dispatch.Plan``: its checks and launch): every call differing in one
property must do what it would do without plans."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fused.qk_norm_rope import wrapper as f
from fused.qk_norm_rope import dispatch as d
from reference.qk_norm_rope import chain as qk_chain


def test_specialised_ints_are_the_kernels():
    """Every int parameter is either value-specialised (in the key exactly) or in the kernel's
    do_not_specialize, as the JIT builds its parameters from the decorator's arguments."""
    import inspect

    from triton.runtime.jit import JITFunction

    from fused.qk_norm_rope import kernels as k

    kernel = k.qk_norm_rope_kernel
    dns = getattr(kernel, "do_not_specialize", None) or kernel.kwargs["do_not_specialize"]  # JIT / interpreter
    jit = JITFunction(kernel.fn, do_not_specialize=dns)
    specialised = {p.name for p in jit.params if not p.is_constexpr and not p.do_not_specialize}
    assert specialised - set(d.POINTERS) - {"eps"} == set(d.SPECIALISED_INTS)
    assert set(d.CONSTEXPRS) == {p.name for p in jit.params if p.is_constexpr}
    assert list(d.ALL_ARGS) == list(inspect.signature(kernel.fn).parameters)


def _variants(device):
    from cases.qk_norm_rope import catalog as c

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

    checks = []
    validate = qk_chain.validate
    monkeypatch.setattr(qk_chain, "validate", lambda **a: checks.append(1) or validate(**a))
    for name, kw in _variants(device):
        for layout, args in (("aligned", kw), ("unaligned-q", _unaligned(kw))):
            for checked in (True, "device"):
                monkeypatch.setenv(d.FAST_LAUNCH_ENV, "0")
                want = _bytes(args, checked)
                monkeypatch.setenv(d.FAST_LAUNCH_ENV, "1")
                first = _bytes(args, checked)  # seen once: through the JIT, then cached
                n = len(d._compiled)
                n_checks = len(checks)
                got = _bytes(args, checked)  # through the cached CompiledKernel (device-checked: the plan)
                assert len(d._compiled) == n, (name, layout)  # no new variant on the second call
                assert len(checks) == n_checks + (checked is True), (name, layout, checked)
                assert all(torch.equal(a, b) for a, b in zip(want, first)), (name, layout, checked)
                assert all(torch.equal(a, b) for a, b in zip(want, got)), (name, layout, checked)
    assert dc.pending() == []


@pytest.mark.gpu
def test_alignment_and_dtype_are_in_the_key(device, monkeypatch):
    monkeypatch.setattr(d, "_compiled", {})  # the other tests' variants out of the count
    name, kw = next(_variants(device))
    f.qk_norm_rope(**copy.deepcopy(kw))
    n = len(d._compiled)
    f.qk_norm_rope(**copy.deepcopy(_unaligned(kw)))
    assert len(d._compiled) == n + 1  # another variant, not the aligned one's binary
    f.qk_norm_rope(**{**copy.deepcopy(kw), "positions": kw["positions"].to(torch.int32)})
    assert len(d._compiled) == n + 2


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
    from fused.qk_norm_rope import kernels as k

    name, kw = next(_variants(device))
    fake = _FakeJit()
    monkeypatch.setattr(k, "qk_norm_rope_kernel", fake)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(d, "_compiled", {})
    monkeypatch.setattr(d, "plans", {})
    f.qk_norm_rope(**copy.deepcopy(kw), checked=False)
    f.qk_norm_rope(**copy.deepcopy(kw), checked=False)
    assert len(fake.jit_calls) == 1 and len(fake.compiled.calls) == 1
    grid, jit_kw = fake.jit_calls[0]
    g0, g1, g2, args = fake.compiled.calls[0]
    assert (g0, g1, g2) == tuple(grid) and len(grid) == 3
    jit_kw = {n: v for n, v in jit_kw.items() if n != "num_warps"}
    want = [jit_kw.get(n, default) for n, default in d.ALL_ARGS.items()]
    assert len(args) == len(want)
    def same_arg(name, a, b):  # each call deep-copies its inputs: equal tensors, not the same ones
        if not isinstance(a, torch.Tensor):
            return a == b
        meta = (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        return meta and (name in ("q_out_ptr", "kv_out_ptr", "ring_ptr") or torch.equal(a, b))  # fresh outputs

    same = [same_arg(n, a, b) for n, a, b in zip(d.ALL_ARGS, args, want)]
    assert all(same), [n for n, ok in zip(d.ALL_ARGS, same) if not ok]
    # the second call went through the first one's plan, with its own tensors and fresh outputs
    assert len(d.plans) == 1
    kw2 = copy.deepcopy(kw)
    q_out, kv_out = f.qk_norm_rope(**kw2, checked=False)
    got = dict(zip(d.ALL_ARGS, fake.compiled.calls[-1][3]))
    for param, name in (("q_ptr", "q"), ("kv_ptr", "kv"), ("kv_w_ptr", "kv_norm_weight"), ("cos_ptr", "cos"),
                        ("sin_ptr", "sin"), ("pos_ptr", "positions")):
        assert got[param] is kw2[name], param
    assert got["q_out_ptr"] is q_out and got["kv_out_ptr"] is kv_out
    assert q_out is not fake.compiled.calls[0][3][0]
    # the plan keeps no tensor of the call that made it alive
    assert not [n for n, v in next(iter(d.plans.values())).template.items() if isinstance(v, torch.Tensor)]
    monkeypatch.setenv(d.FAST_LAUNCH_ENV, "0")
    f.qk_norm_rope(**copy.deepcopy(kw), checked=False)
    assert len(fake.jit_calls) == 2


# ----------------------------------------------------------------------------- call plans

class _VariantJit:
    """A JIT that compiles one stand-in binary per call, which remembers what it was compiled for (every
    pointer's dtype and 16-byte alignment, the specialised ints, the constexprs, num_warps) and records
    each launch through it."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def run(num_warps, **kw):
            binary = _Binary(self, _compiled_for(kw, num_warps))
            binary[grid](*[kw.get(n, d) for n, d in d.ALL_ARGS.items()])
            return binary
        return run


class _Binary:
    def __init__(self, jit, signature):
        self.jit, self.signature = jit, signature

    def __getitem__(self, grid):
        return lambda *args: self.jit.launches.append((self.signature, tuple(grid[:2]), args))


def _compiled_for(kw, num_warps):
    ptrs = tuple(None if kw.get(n) is None else (kw[n].dtype, kw[n].data_ptr() % 16 == 0) for n in d.POINTERS)
    return ptrs, tuple(kw[n] for n in d.SPECIALISED_INTS), tuple(kw.get(n) for n in d.CONSTEXPRS), num_warps


def _outcome(jit, call):
    """What a call did: the error it raised (type, argument, message), or its one launch: the binary's
    signature, the grid and every argument (a tensor by its metadata, an input's also by its pointer)."""
    before = len(jit.launches)
    try:
        outs = call()
    except Exception as e:  # noqa: BLE001 - the outcome compared is the error itself
        return type(e).__name__, getattr(e, "arg", None), str(e)
    assert len(jit.launches) == before + 1
    signature, grid, args = jit.launches[-1]
    fresh = {t.data_ptr() for t in outs}
    def meta(a):
        if not isinstance(a, torch.Tensor):
            return a
        return a.dtype, tuple(a.shape), a.stride(), None if a.data_ptr() in fresh else a.data_ptr()
    return signature, grid, tuple(map(meta, args))


def _dense(t, *, inner=1, pad=0, offset=0):
    """t's values in another layout: rows padded by ``pad`` elements, inner stride ``inner``, the first
    element ``offset`` elements into its buffer."""
    rows = t.reshape(-1, t.shape[-1]) if t.dim() > 1 else t.reshape(1, -1)
    buf = torch.zeros(offset + rows.shape[0] * (rows.shape[1] * inner + pad), dtype=t.dtype, device=t.device)
    view = buf[offset:].view(rows.shape[0], -1)[:, : rows.shape[1] * inner: inner]
    view.copy_(rows)
    return view.view(t.shape) if inner == 1 else view.reshape(t.shape) if t.dim() == 1 else view


def _mutations(kw):
    """One property of one argument changed each: the ones that stay valid must launch differently,
    the others raise; either way, what the call would do without a plan."""
    q, kv = kw["q"], kw["kv"]
    out = {
        "same": {}, "copies": {n: copy.deepcopy(t) for n, t in kw.items() if isinstance(t, torch.Tensor)},
        "q-fp16": {"q": q.half()}, "q-fp32": {"q": q.float()},
        "q-unaligned": {"q": _dense(q, offset=1)}, "q-heads-padded": {"q": _dense(q, pad=8)},
        "q-meta": {"q": q.to("meta")}, "q-list": {"q": q.tolist()},
        "kv-row-stride": {"kv": _dense(kv, pad=64)}, "kv-inner-stride": {"kv": _dense(kv, inner=2)},
        "kv-unaligned": {"kv": _dense(kv, offset=3)}, "kv-rows": {"kv": kv[:-1]},
        "kv_norm_weight-fp32": {"kv_norm_weight": kw["kv_norm_weight"].float()},
        "q_norm_weight": {"q_norm_weight": kw["kv_norm_weight"].clone()},
        "cos-unaligned": {"cos": _dense(kw["cos"], offset=2)}, "cos-row-stride": {"cos": _dense(kw["cos"], pad=4)},
        "cos-rows": {"cos": kw["cos"][:-1], "sin": kw["sin"][:-1]},
        "positions-int32": {"positions": kw["positions"].int()},
        "positions-sparse": {"positions": kw["positions"].to_sparse()},
        "positions-strided": {"positions": _dense(kw["positions"], inner=2)},
        "q_out": {"q_out": torch.empty_like(q)}, "q_out-bad": {"q_out": torch.empty_like(q)[:, :-1]},
        "eps": {"eps": 1e-5}, "eps-zero": {"eps": 0.0}, "eps-np": {"eps": np.float64(kw["eps"])},
        "rope_dim": {"rope_dim": 32}, "rope_dim-np": {"rope_dim": np.int64(kw["rope_dim"])},
        "rope_style": {"rope_style": "neox"}, "rope_style-bad": {"rope_style": "gptj"},
        "checked-off": {"checked": False},
    }
    for name in ("ring", "loc", "swa_cache"):
        t = kw.get(name)
        if t is not None:
            out[f"{name}-unaligned"] = {name: _dense(t, offset=1)}
            out[f"{name}-shorter"] = {name: t[:-1]}  # the store: fewer rows; loc: not (T,)
            out[f"{name}-dropped"] = {name: None}
    if kw.get("loc") is not None:
        out["loc-int32"] = {"loc": kw["loc"].int()}
    if kw.get("swa_page_size") is not None:
        out["swa_page_size"] = {"swa_page_size": 2 * kw["swa_page_size"]}
        out["swa_page_size-np"] = {"swa_page_size": np.int64(kw["swa_page_size"])}
    return out


@pytest.mark.parametrize("variant", [3, 4, 5], ids=["verify", "decode-ring", "decode-paged"])
def test_a_plan_serves_only_the_metadata_it_checked(device, monkeypatch, variant):
    """After a valid call, every call that differs from it in one property (a dtype, a shape, a stride,
    a device, an alignment, a layout, a scalar, the check mode) does exactly what it does without plans:
    the same error, or the same launch through a binary compiled for its own arguments. A key that
    missed a property would reuse the valid call's checks and binary: the outcomes differ."""
    from fused.qk_norm_rope import kernels as k

    name, kw = list(_variants(device))[variant]
    jit = _VariantJit()
    monkeypatch.setattr(k, "qk_norm_rope_kernel", jit)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    checks = []
    validate = qk_chain.validate
    monkeypatch.setattr(qk_chain, "validate", lambda **a: checks.append(1) or validate(**a))
    base = {**kw, "checked": "device"}
    served = []
    for mname, change in _mutations(kw).items():
        args = {**base, **change}
        monkeypatch.setattr(d, "plans", {})
        monkeypatch.setattr(d, "_compiled", {})
        monkeypatch.setenv(d.FAST_LAUNCH_ENV, "0")
        want = _outcome(jit, lambda: f.qk_norm_rope(**args))
        monkeypatch.setenv(d.FAST_LAUNCH_ENV, "1")
        _outcome(jit, lambda: f.qk_norm_rope(**base))  # the valid call: its plan made
        _outcome(jit, lambda: f.qk_norm_rope(**base))  # and taken
        validated = len(checks)
        got = _outcome(jit, lambda: f.qk_norm_rope(**args))
        assert got == want, mname
        if len(checks) == validated:
            served.append(mname)  # launched by the plan, not checked again
    # the comparison is not vacuous: the unchanged call, and one with other tensors of the same
    # metadata, are served by the plan; every other one is checked (numpy scalars: not a key's exact types)
    assert served == ["same", "copies"], served
