"""The runner's per-case setup: fresh inputs are exact copies (bytes, strides, offsets, shared
storages), and running the implementations of a case together gives what separate runs give;
a NaN is a ``finite:`` failure, never a ``numeric:`` one; the poisoned-allocator run sees an
element the implementation never wrote."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from cases.mla_fp8_prepare import catalog as mla_cases
from cases.verify_attention import catalog as va_cases
from harness.parity import records as run_records
from harness.parity import runners
from harness.registry import Impl, OpSpec, OutputSpec


def _storage_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.untyped_storage().cpu())


@pytest.mark.parametrize("copier", [copy.deepcopy, runners.copy_inputs])
def test_fresh_copies_keep_layout_bytes_and_aliasing(copier):
    """The copy every run gets (``CaseSetup.fresh``: ``runners.copy_inputs``, which does what ``copy.deepcopy``
    does): layout, the whole storage's bytes (past a view's extent too), shared storages shared again."""
    base = torch.randn(6, 10).to(torch.float8_e4m3fn)
    k = base[:, :8]  # a strided view with its own extent
    v = base[1:, 2:6]  # another view of the same storage, offset
    q = torch.randn(4, 3).t()  # transposed
    w = torch.randn(5)[1:4]  # offset into a storage of its own, bytes on both sides
    x = torch.randn(2, 1, 3).as_strided((2, 1, 3), (3, 7, 1))  # contiguous, an odd stride on its size-1 axis
    o = torch.arange(4.0).as_strided((2, 2), (1, 1))  # overlapping, as many elements as its storage holds
    inputs = {"k": k, "v": v, "q": q, "w": w, "x": x, "o": o, "e": torch.empty(0, 4), "n": 3, "none": None, "s": "neox"}
    out = copier(inputs)
    for name in ("k", "v", "q", "w", "x", "o", "e"):
        a, b = inputs[name], out[name]
        assert b.dtype == a.dtype and b.shape == a.shape and b.stride() == a.stride(), name
        assert b.storage_offset() == a.storage_offset(), name
        assert _storage_bytes(b) == _storage_bytes(a), name
        assert b.untyped_storage().data_ptr() != a.untyped_storage().data_ptr() or not a.numel(), name
    assert out["k"].untyped_storage().data_ptr() == out["v"].untyped_storage().data_ptr()
    out["k"].view(torch.uint8)[1, 2] = 0x7F  # a write through one view shows through the other, as before
    assert out["v"].view(torch.uint8)[0, 0] == 0x7F and inputs["v"].view(torch.uint8)[0, 0] != 0x7F
    assert out["n"] == 3 and out["none"] is None and out["s"] == "neox"


def test_fresh_copies_of_other_values_are_deep_copies():
    """A value ``copy_inputs`` has no fast path for (a list, a tensor that needs grad's machinery) gets deepcopy."""
    inputs = {"xs": [torch.ones(2)], "g": torch.ones(2, requires_grad=True)}
    out = runners.copy_inputs(inputs)
    assert out["xs"] is not inputs["xs"] and out["xs"][0].data_ptr() != inputs["xs"][0].data_ptr()
    assert out["g"].requires_grad and out["g"].data_ptr() != inputs["g"].data_ptr()


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


# ----------------------------------------------------------------------------- finite: and the poisoned allocator

def _one_nan(**kw):
    """The reference chain with one planted NaN at o[1, 2, 3]."""
    from reference.verify_attention import chain as r

    o = r.verify_attention(**kw)["o"].clone()
    o[1, 2, 3] = float("nan")
    return {"o": o}


def test_a_planted_nan_fails_finite_not_numeric(registry, device):
    spec = registry.ops["verify_attention"]
    case = {c.name: c for c in va_cases.catalog()}["width-2"]
    res = runners.run_case(spec, Impl("verify_attention", "plant-one-nan", "external", _one_nan), case, device,
                           determinism=False)
    by = {r.check: r for r in res.records}
    for suffix in ("", "@poisoned", "@poisoned-alloc"):
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

    @staticmethod
    def last_unwritten(x):
        """Writes every element but the last of its torch.empty output."""
        y = torch.empty_like(x)
        y[:-1] = 1 / x[:-1]
        return {"y": y}


def test_the_oracles_own_infinities_pass(device):
    res = runners.run_case(_Toy.spec(), Impl("toy", "right", "external", _Toy.right), None, device)
    assert res.records and all(r.passed for r in res.records), [r for r in res.records if not r.passed]
    assert {"finite:y", "finite:y@poisoned-alloc", "numeric:y@poisoned-alloc"} <= {r.check for r in res.records}


@pytest.mark.parametrize("determinism", [False, True])  # its own run / the determinism rerun
def test_poisoned_alloc_run_flags_an_unwritten_element(device, determinism):
    spec = _Toy.spec()
    impl = Impl("toy", "last-unwritten", "external", _Toy.last_unwritten)
    res = runners.run_case(spec, impl, None, device, determinism=determinism, poisoned=False)
    f = {r.check: r for r in res.records}["finite:y@poisoned-alloc"]
    assert not f.passed and f.worst.startswith("(31,): nan/0.125"), f
    off = runners.run_case(spec, impl, None, device, determinism=determinism, poisoned=False, poisoned_alloc=False)
    assert not any(r.check.endswith("@poisoned-alloc") for r in off.records)


def test_the_determinism_rerun_is_the_poisoned_alloc_run(device):
    """Runs per case: first + one rerun (determinism and poisoned-alloc) + poisoned outputs; a
    planted nondeterministic implementation still fails determinism."""
    calls = []

    def counted(x):
        calls.append(1)
        return _Toy.right(x)

    impl = Impl("toy", "counted", "external", counted)
    for kw, n in (({}, 3), ({"poisoned": False}, 2), ({"determinism": False, "poisoned": False}, 2),
                  ({"poisoned_alloc": False, "poisoned": False}, 2),
                  ({"determinism": False, "poisoned_alloc": False, "poisoned": False}, 1)):
        calls.clear()
        res = runners.run_case(_Toy.spec(), impl, None, device, **kw)
        assert len(calls) == n and all(r.passed for r in res.records), (kw, len(calls))

    def noisy(x):
        return {"y": 1 / x + torch.randn(x.shape) * 1e-3}

    res = runners.run_case(_Toy.spec(), Impl("toy", "noisy", "external", noisy), None, device, poisoned=False)
    assert not {r.check: r for r in res.records}["determinism"].passed


def test_compiled_impls_skip_the_poisoned_alloc_run(device):
    """torch.compile would recompile under every fresh mode (runners.POISONED_ALLOC_SKIPS)."""
    res = runners.run_case(_Toy.spec(), Impl("toy", "compiled", "compiled", _Toy.right), None, device)
    assert res.records and not any(r.check.endswith("@poisoned-alloc") for r in res.records)


# ----------------------------------------------------------------------------- reruns that reuse the first run's records

def _toy_changing_on_call(call: int, plant):
    """A toy implementation right on every call but number ``call`` (1-based), where ``plant(y)`` edits its output."""
    calls = []

    def fn(x):
        calls.append(1)
        y = _Toy.right(x)["y"]
        if len(calls) == call:
            plant(y)
        return {"y": y}

    return fn


def _nan_at_3(y):
    y[3] = float("nan")


def test_a_rerun_differing_in_one_element_is_still_reported(device):
    """The rerun and the poisoned run reuse the first run's records only when their bytes are the
    first run's: one element that differs in the rerun fails determinism and its @poisoned-alloc
    checks; in the poisoned run, its @poisoned checks; the first run's records stay clean."""
    res = runners.run_case(_Toy.spec(), Impl("toy", "rerun-differs", "external", _toy_changing_on_call(2, _nan_at_3)),
                           None, device)
    by = {r.check: r for r in res.records}
    assert not by["determinism"].passed and "(3,)" in by["determinism"].worst, by["determinism"]
    f = by["finite:y@poisoned-alloc"]
    assert not f.passed and f.nan_inf_mismatch == 1 and f.worst.startswith("(3,): nan/"), f
    assert by["numeric:y@poisoned-alloc"].nan_inf_mismatch == 1
    assert all(by[c].passed for c in ("finite:y", "numeric:y", "finite:y@poisoned", "numeric:y@poisoned"))

    def one_ulp(y):
        y[5] = torch.nextafter(y[5], torch.tensor(float("inf")))

    res = runners.run_case(_Toy.spec(), Impl("toy", "poisoned-differs", "external", _toy_changing_on_call(3, one_ulp)),
                           None, device)
    by = {r.check: r for r in res.records}
    assert by["determinism"].passed and by["numeric:y@poisoned"].err > by["numeric:y"].err, by["numeric:y@poisoned"]
    assert by["numeric:y@poisoned"].worst.startswith("(5,)") and by["numeric:y@poisoned-alloc"] == \
        dataclasses.replace(by["numeric:y"], check="numeric:y@poisoned-alloc")


def test_a_rerun_writing_the_first_runs_output_buffer_is_compared(device):
    """An implementation returning one persistent buffer from every call: the rerun's write
    changes the first run's output too, so the rerun is compared on its own bytes, not matched
    against the first run's (now overwritten) tensor."""
    buf = {}

    def persistent(x):
        y = buf.setdefault("y", torch.empty_like(x))
        torch.reciprocal(x, out=y)
        buf["n"] = buf.get("n", 0) + 1
        if buf["n"] == 2:
            y[3] = float("nan")
        return {"y": y}

    res = runners.run_case(_Toy.spec(), Impl("toy", "persistent", "external", persistent), None, device)
    by = {r.check: r for r in res.records}
    assert by["finite:y"].passed and not by["finite:y@poisoned-alloc"].passed, by["finite:y@poisoned-alloc"]


def _fields(res):
    return [tuple("nan" if isinstance(v, float) and v != v else v for v in dataclasses.astuple(r)) for r in res.records]


@pytest.mark.parametrize("op, name", [("qk_norm_rope", "dsv4-decode-b1-h16"), ("qk_norm_rope", "caller-q-out"),
                                      ("mla_fp8_prepare", None)])
def test_reused_records_equal_a_full_comparison(registry, device, monkeypatch, op, name):
    """Every field of every record (names, verdicts, errors, worst elements) is what comparing
    the rerun and the poisoned run in full gives (``run_records._same_each`` forced False), for ops with
    effect rows (the ring, the KV pool) and a caller-provided output."""
    from cases.qk_norm_rope import catalog as qk_cases

    spec = registry.ops[op]
    case = mla_cases.catalog()[0] if name is None else {c.name: c for c in qk_cases.catalog()}[name]
    impl = registry.impls[f"{op}/fused"]
    fast = runners.run_case(spec, impl, case, device)
    monkeypatch.setattr(run_records, "_same_each", lambda groups: [False] * len(groups))
    full = runners.run_case(spec, impl, case, device)
    assert _fields(fast) == _fields(full)
    assert any(r.check.endswith("@poisoned") for r in fast.records)


def test_a_rerun_writing_the_first_runs_buffer_is_compared(device):
    """A kernel that keeps the first call's buffer pointer (a captured graph, a cached workspace)
    and writes it on every later call: the rerun's own buffer stays unwritten, and its effect
    check fails although the first run's buffer holds the right rows."""
    from harness.registry import Effect

    x = torch.tensor([2.0, 4.0, 8.0, 0.5])
    spec = OpSpec(name="toy-buf", case_type=object, catalog=lambda **_: [], strategy=lambda: None,
                  build_inputs=lambda case, dev: {"x": x.clone(), "buf": torch.zeros(3, 4)},
                  reference=lambda x, buf: (buf[1].copy_(1 / x), {})[1], oracle=lambda x, buf: {"row": 1 / x.double()},
                  outputs=(), effects=lambda case, inputs, oracle: [Effect("buf", torch.tensor([1]), oracle["row"][None])],
                  writable=("buf",))
    captured = {}

    def stale_pointer(x, buf):
        captured.setdefault("buf", buf)[1] = 1 / x
        return {}

    res = runners.run_case(spec, Impl("toy-buf", "stale-pointer", "external", stale_pointer), None, device)
    by = {r.check: r for r in res.records}
    assert by["effect:buf"].passed and by["untouched:buf"].passed, by["effect:buf"]
    assert not by["effect:buf@poisoned-alloc"].passed and not by["finite:buf@poisoned"].passed  # NaN: finite owns it
    assert not by["determinism"].passed


def test_a_run_sends_its_checks_to_the_host_in_a_few_transfers(registry, device, monkeypatch):
    """Each host transfer is a sync on a GPU, and the nightly's processes share one GPU: a transfer waits
    for every process's queued work. The checks of one call's outputs, of its effects and of its untouched
    inputs go to the host as one batch each (``compare.Batch``: a transfer per stage), whatever the number
    of outputs and inputs. Counted here: every ``tolist``, ``item`` and ``torch.equal`` of a qk_norm_rope
    run (three calls, its inputs, outputs and ring), the wrapper's own value checks included."""
    transfers = []

    def counting(name, fn):
        def wrapped(*a, **kw):
            transfers.append(name)
            return fn(*a, **kw)
        return wrapped

    spec = registry.ops["qk_norm_rope"]
    impl = registry.impls["qk_norm_rope/fused"]
    case = next(c for c in spec.catalog(big=False) if c.name == "dsv4-verify-b1-l3-h16")
    setup = runners.CaseSetup(spec, case, device)
    for owner, name in ((torch.Tensor, "tolist"), (torch.Tensor, "item"), (torch, "equal")):
        monkeypatch.setattr(owner, name, counting(name, getattr(owner, name)))
    res = runners.run_case(spec, impl, case, device, setup=lambda: setup)
    assert res.records and all(r.passed for r in res.records), [r for r in res.records if not r.passed][:2]
    assert len(transfers) <= 16, transfers  # 12 batched; 36 with a transfer per check (21 of them torch.equal)


# views, allocations and host reads: no kernel of their own on a GPU
_NO_KERNEL = {"view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "select", "slice", "t", "expand",
              "detach", "alias", "unsqueeze", "squeeze", "permute", "transpose", "flatten", "unbind", "split",
              "narrow", "lift_fresh", "empty", "empty_like", "new_empty", "empty_strided", "set_",
              "_local_scalar_dense"}
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.equal, torch.Tensor.__bool__, torch.Tensor.__int__,
               torch.Tensor.__float__}


def _own_cost(spec, impls, case, device, monkeypatch) -> dict:
    """Per (implementation, case) run of ``impls`` on ``case`` (one setup): the torch ops the harness's own
    stages dispatch (``copy`` and the three ``compare`` stages: what is not the implementation's calls or the
    case's inputs, reference and oracle), those of them that launch device work, and its host reads."""
    import contextlib

    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from harness.parity import stages

    own, stage, count = ("copy", "compare", "compare:rerun", "compare:poisoned"), ["-"], {"ops": 0, "kernels": 0,
                                                                                          "reads": 0}
    timed = stages.timed

    @contextlib.contextmanager
    def tagged(name):
        prev, stage[0] = stage[0], name
        try:
            with timed(name):
                yield
        finally:
            stage[0] = prev

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            moved = bool(args) and isinstance(args[0], torch.Tensor) and \
                (kwargs or {}).get("device") not in (None, args[0].device)
            if stage[0] in own and not moved:  # a copy to another device: once per case, not counted
                count["ops"] += 1
                count["kernels"] += func.overloadpacket.__name__ not in _NO_KERNEL
            return func(*args, **(kwargs or {}))

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if stage[0] in own and func in _HOST_READS:
                count["reads"] += 1
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(stages, "timed", tagged)
    with Ops(), Reads():
        results = runners.run_impls(spec, impls, case, device)
    assert all(r.records and all(x.passed for x in r.records) for r in results), results
    return {k: v / len(impls) for k, v in count.items()}


@pytest.mark.parametrize("op, name, ops, kernels, reads", [
    # measured 2026-12-08 on the CPU, per run of the reference and fused implementations: 509.7 ops, 245.7
    # kernels, 16 reads; before (main at 0258e0b: copy.deepcopy, a check per input, the oracle's terms per
    # check, finite and numeric apart): 917, 414.3, 18
    ("qk_norm_rope", "dsv4-decode-b1-h16", 530, 252, 16),  # two outputs, ring effect rows and untouched rows
    # 490, 144.5, 14; before: 798, 230, 16
    ("mla_fp8_prepare", "k3-verify-b1-l3-h8", 510, 150, 14),  # exact bytes, an observed output, the kv pool
])
def test_a_runs_own_checks_are_a_few_hundred_torch_ops(registry, device, monkeypatch, op, name, ops, kernels, reads):
    """On a GPU each torch op of the harness's own work on a run is a call through the dispatcher, and
    most are a kernel launch (5-10 us of host time each); a host read waits for the GPU. The copies of the
    inputs (one per storage), the checks of the outputs (finite and numeric together, the oracle's terms
    once per case), of the effect rows, of the untouched inputs (their bytes compared together) and of the
    reruns (one decision per run) stay within these counts per (implementation, case) run."""
    spec = registry.ops[op]
    case = next(c for c in spec.catalog(big=False) if c.name == name)
    impls = [i for _, i in sorted(registry.impls.items()) if i.op == op and i.kind in ("reference", "fused")]
    cost = _own_cost(spec, impls, case, device, monkeypatch)
    assert cost["ops"] <= ops and cost["kernels"] <= kernels and cost["reads"] <= reads, cost
