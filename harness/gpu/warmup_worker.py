"""The worker side of ``python -m harness warmup`` (``harness.gpu.warmup``): what each process does.

  collect  ``collect(task)``: the task's cases' inputs built and each implementation called as the
           parity run calls it while Triton's ``jit_cache_hook`` answers "skip" (``record``):
           nothing is compiled or launched, each ``Variant`` the calls would launch is noted
  compile  ``compile_variant(v)``: one variant compiled by ``JITFunction.preload`` into Triton's cache
  dry run  ``dry_run(target)`` / ``dry_device(target)``: a process pretending to be a GPU it lacks
           (``--target``): kernels for that target, tensors on the CPU
"""
from __future__ import annotations

import copy
import importlib
import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One specialization of one ``@triton.jit`` kernel, as Triton's JIT keys it."""
    module: str
    qualname: str
    key: str  # the JIT's in-memory cache key (specialization + options)
    data: str  # ``serialize_specialization_data``: what ``JITFunction.preload`` compiles

    @property
    def kernel(self) -> str:
        return f"{self.module}.{self.qualname}"


_SEEN: dict[tuple, Variant] = {}


def record(*, key, fn, compile, **_):
    """``jit_cache_hook``: note the variant; True = do not compile (and so do not launch)."""
    _SEEN.setdefault((fn.module, fn.name, key), Variant(fn.module, fn.name, key, compile["specialization_data"]))
    return True


def dry_run(target: str) -> None:
    """Pretend to be ``target`` (before any kernel module is imported): real JITFunctions, Triton's
    active driver answering with that target, ``harness.devices`` reporting that GPU."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["VP_DEVICE"] = "compile"
    from triton.runtime import driver

    from harness import devices
    from harness.gpu import compile as compile_check

    backend, arch, warp = compile_check.TARGETS[target]

    class _Driver:  # what JITFunction.run and preload ask of the active driver
        def get_current_target(self):
            from triton.backends.compiler import GPUTarget

            return GPUTarget(backend, arch, warp)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    driver.set_active(_Driver())
    devices.stand_in_gpu(dry_device(target))


def dry_device(target: str):
    """The ``Device`` of a dry run: kernels for ``target``, tensors on the CPU."""
    from harness import devices

    kind = "rocm" if target.startswith("gfx") else "cuda"

    @dataclass(frozen=True)
    class DryRunDevice(devices.Device):
        @property
        def torch_device(self):
            import torch

            return torch.device("cpu")

        @property
        def interpreted(self) -> bool:
            return False

    return DryRunDevice(kind, f"dry run ({target})", target, devices.fp8_format_for_arch(target), "")


def init_worker(kind: str, fp8_format: str, plugin_specs: tuple[str, ...], target: str | None) -> None:
    from harness.parity import suite

    if not target:
        suite.worker_init(kind, fp8_format, plugin_specs)
        return
    dry_run(target)
    from harness.ops import default_registry
    from harness.registry import cwd_on_path

    cwd_on_path()
    suite.set_worker_state(dry_device(target), default_registry(extra=plugin_specs))


def call_like_the_run(spec, impls, case, dev, seconds: dict | None = None) -> list[str]:
    """Each implementation's calls of ``harness.parity.runners.run_case`` on ``case`` (the reruns launch
    what the first call launched; the poisoned run takes caller-provided outputs). Errors, one line
    each. ``seconds`` gets the wall time of building the inputs (``inputs``) and of the calls (``calls``)."""
    import torch

    from harness.parity import runners

    t0 = time.perf_counter()
    pristine = spec.build_inputs(case, dev)
    t1 = time.perf_counter()
    errors, ref_out = [], None
    for impl in impls:
        fresh = lambda: copy.deepcopy(pristine)  # noqa: E731
        try:
            if impl.handles(case, dev, fresh) is not True:
                continue
            out = dict(impl.fn(**fresh()))
            if spec.out_args:
                shapes = {n: out[n] for n in spec.out_args if isinstance(out.get(n), torch.Tensor)}
                if len(shapes) < len(spec.out_args):
                    ref_out = ref_out or dict(spec.reference(**fresh()))
                    shapes = {**ref_out, **shapes}
                impl.fn(**runners.provide_outputs(spec, fresh(), shapes, dev))
        except Exception as exc:  # garbage outputs (nothing was launched) may upset host code: say so, go on
            errors.append(f"{impl.key} {case}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    if seconds is not None:
        seconds["inputs"] = seconds.get("inputs", 0.0) + t1 - t0
        seconds["calls"] = seconds.get("calls", 0.0) + time.perf_counter() - t1
    return errors


def collect(task) -> tuple[list[Variant], list[str], dict]:
    from triton import knobs

    from harness.parity import suite

    op, impl_keys, cases = task
    dev, reg = suite.worker_state()
    knobs.runtime.jit_cache_hook = record
    before = set(_SEEN)
    errors, seconds = [], {}
    for case in cases:
        errors += call_like_the_run(reg.ops[op], [reg.impls[k] for k in impl_keys], case, dev, seconds)
    return [v for k, v in _SEEN.items() if k not in before], errors, seconds


def _jit_function(module: str, qualname: str):
    from triton.runtime import jit

    mod = importlib.import_module(module)
    fn = getattr(jit, "_triton_jit_function_registry", {}).get(f"{module}:{qualname}")
    if fn is None:
        fn = mod
        for part in qualname.split("."):
            fn = getattr(fn, part)
    return fn


def compile_variant(v: Variant) -> tuple[float, str]:
    """(seconds, error or "") of compiling one variant into Triton's cache."""
    t0 = time.perf_counter()
    try:
        _jit_function(v.module, v.qualname).preload(v.data)
        return time.perf_counter() - t0, ""
    except Exception as exc:  # the compiler's message is the finding
        return time.perf_counter() - t0, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc) else ''}"

