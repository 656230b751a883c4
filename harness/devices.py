"""The only module that asks which device this is: CPU interpreter, CUDA or ROCm, the arch,
and the fp8 format per arch.

``prepare_triton()`` must run before any ``@triton.jit`` is evaluated (Triton decides
interpreter vs compiler at decoration time); ``fused/__init__.py`` calls it, so importing any
fused module is enough. On a machine without a GPU it sets ``TRITON_INTERPRET=1`` and installs
the conversion shim (``harness.shim``); both are recorded in every row's provenance.

fp8 formats: ``e4m3fn`` on NVIDIA and AMD gfx950 (MI355), ``e4m3fnuz`` on AMD gfx942 (MI300).
On the CPU the format is whatever the run asks for (both run under the interpreter).

Naming the device (``resolve``: what ``python -m harness list`` prints) imports torch only where the
answer needs it: with a CPU-only build of torch (its ``torch.version``, read from the file) there is no
GPU to ask about, and neither torch nor Triton is imported.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FP8_FORMATS = ("e4m3fn", "e4m3fnuz")  # torch.float8_<format>
_FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")
# the id of harness.shim's conversions (what the interpreter's casts and arithmetic do), in every row's provenance:
# change it with the shim
SHIM_ID = ("vp-interp-shim/4 (bf16 RNE, fp8 RNE+satfinite, bf16 dot upcast, rtz bf16/fp16, rtz fp8 refused, "
           "bf16 arithmetic in fp32, half reductions rounded per add, elementwise and/or/not, fp32 float arguments)")


class DeviceUnavailable(RuntimeError):
    """The requested device kind is not present on this machine."""


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" (Triton interpreter), "cuda" or "rocm"
    name: str  # e.g. "NVIDIA H200", "cpu"
    arch: str  # "sm90", "gfx942", "interpreter"
    fp8_format: str  # "e4m3fn" or "e4m3fnuz"
    shim: str  # interpreter shim id, "" when compiled

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device("cpu" if self.kind == "cpu" else "cuda")

    @property
    def fp8_dtype(self) -> torch.dtype:
        return fp8_dtype(self.fp8_format)

    @property
    def interpreted(self) -> bool:
        return self.kind == "cpu"


def fp8_format_for_arch(arch: str) -> str:
    """The native fp8 e4m3 flavour of an arch: fnuz only on gfx940/941/942."""
    return "e4m3fnuz" if arch.split(":")[0] in _FNUZ_ARCHS else "e4m3fn"


def fp8_dtype(fmt: str) -> torch.dtype:
    """``torch.float8_<fmt>`` of a format of ``FP8_FORMATS``."""
    import torch

    if fmt not in FP8_FORMATS:
        raise ValueError(f"fp8_format: expected one of {sorted(FP8_FORMATS)}, got {fmt!r}")
    return getattr(torch, f"float8_{fmt}")


def gpu_build() -> bool:
    """Whether this torch is built for a GPU (``torch.version.cuda`` or ``.hip`` set), without importing
    torch: read from its generated ``torch/version.py`` (plain assignments). True where it cannot be read,
    so that ``gpu_present`` asks torch."""
    if "torch" in sys.modules:
        import torch

        return bool(torch.version.cuda or torch.version.hip)
    try:
        spec = importlib.util.find_spec("torch")
        tree = ast.parse(Path(spec.submodule_search_locations[0], "version.py").read_text())
        found = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        return bool(found["cuda"] or found["hip"])
    except Exception:  # noqa: BLE001 - no such file, another layout, not a literal: torch answers
        return True


def gpu_present() -> bool:
    """Whether torch sees a GPU (``torch.cuda.is_available``); a CPU-only build answers no without its import."""
    if not gpu_build():
        return False
    import torch

    return torch.cuda.is_available()


_STAND_IN: list[Device] = []  # the GPU a dry run answers as (``stand_in_gpu``)


def stand_in_gpu(device: Device) -> None:
    """Answer as ``device`` from now on in this process: ``select`` and ``kernel_arch`` report it
    instead of asking GPU 0. A dry run (``harness.gpu.warmup_worker``) calls it before any kernel
    module is imported, so that the kernels specialise for the target it compiles for."""
    _STAND_IN[:] = [device]


def _gpu_device() -> Device:
    import torch

    if _STAND_IN:
        return _STAND_IN[0]
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip:
        arch = props.gcnArchName.split(":")[0]
        return Device("rocm", props.name, arch, fp8_format_for_arch(arch), "")
    arch = f"sm{props.major}{props.minor}"
    return Device("cuda", props.name, arch, fp8_format_for_arch(arch), "")


@functools.cache
def _gpu_arch() -> str:
    return _gpu_device().arch


def kernel_arch() -> str:
    """The target Triton kernels run on: ``"interpreter"`` under ``TRITON_INTERPRET=1`` (read at
    every call), else GPU 0's arch (``sm90``, ``gfx942``; asked once). The one device helper
    ``fused/`` uses besides ``prepare_triton``."""
    return "interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else _gpu_arch()


def prepare_triton() -> None:
    """Choose interpreter vs compiler for Triton. Call before importing kernels."""
    # FP fusion (FMA contraction) changes rounding; triton 3.9 warns that its default flips in
    # 3.10. Pin today's default explicitly so every version computes the same thing.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    want = os.environ.get("VP_DEVICE", "auto")
    if want == "compile":  # ahead-of-time compile check: real JITFunctions, no interpreter
        return
    if want == "cpu" or (want == "auto" and not gpu_present()):
        os.environ["TRITON_INTERPRET"] = "1"
    if os.environ.get("TRITON_INTERPRET") == "1":
        from harness import shim

        shim.install()


SYNC_ENV = "VP_CUDA_SYNC"  # "spin" (CUDA's default for few processes) | "blocking"
_CU_CTX_SCHED = {"spin": 0x01, "blocking": 0x04}  # CU_CTX_SCHED_SPIN, CU_CTX_SCHED_BLOCKING_SYNC


@functools.cache
def cuda_sync_mode(mode: str) -> None:
    """How this process's host threads wait for the GPU (a sync, ``.item()``, a device-to-host copy):
    ``spin`` polls on a core until the work is done, ``blocking`` sleeps and is woken. Set on the
    primary context of GPU 0 through the driver (``cuDevicePrimaryCtxSetFlags``), before torch first
    uses the device; ``select`` calls it when ``VP_CUDA_SYNC`` is set. Many processes sharing one GPU
    (the nightly's concurrent steps) wait on each other's work: spinning, each waiting process holds
    a core that the others' host work needs. NVIDIA only (ROCm: ``DeviceUnavailable``)."""
    import ctypes

    import torch

    if mode not in _CU_CTX_SCHED:
        raise ValueError(f"{SYNC_ENV}: expected one of {sorted(_CU_CTX_SCHED)}, got {mode!r}")
    if torch.version.hip:
        raise DeviceUnavailable(f"{SYNC_ENV}={mode}: only on NVIDIA GPUs (this torch is a ROCm build)")
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise DeviceUnavailable(f"{SYNC_ENV}={mode}: the CUDA driver library: {exc}") from exc
    dev = ctypes.c_int()
    for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), 0)),
                       ("cuDevicePrimaryCtxSetFlags_v2", None)):
        rc = getattr(cu, call)(*(args if args is not None else (dev, _CU_CTX_SCHED[mode])))
        if rc != 0:
            raise DeviceUnavailable(f"{SYNC_ENV}={mode}: {call} returned CUDA error {rc}")


def resolve(requested: str = "auto", *, fp8_format: str | None = None) -> Device:
    """The Device "auto" | "cpu" | "cuda" | "rocm" is on this machine, Triton left as it is (``select``
    prepares it): what ``python -m harness list`` prints. ``fp8_format`` overrides the arch's format only
    on the CPU, where both formats run. On a GPU it sets ``VP_CUDA_SYNC``'s mode before torch first uses it."""
    if requested not in ("auto", "cpu", "cuda", "rocm"):
        raise ValueError(f"device: expected auto, cpu, cuda or rocm, got {requested!r}")
    if requested == "auto":
        requested = "cpu" if not gpu_present() else ("rocm" if _hip_build() else "cuda")
    if requested == "cpu":
        fmt = fp8_format or "e4m3fn"
        if fmt not in FP8_FORMATS:
            raise ValueError(f"fp8_format: expected one of {sorted(FP8_FORMATS)}, got {fmt!r}")
        return Device("cpu", "cpu", "interpreter", fmt, SHIM_ID)
    if not gpu_present():
        raise DeviceUnavailable(f"device {requested!r} requested but torch sees no GPU")
    if os.environ.get(SYNC_ENV, "spin") != "spin":
        cuda_sync_mode(os.environ[SYNC_ENV])
    dev = _gpu_device()
    if dev.kind != requested:
        raise DeviceUnavailable(f"device {requested!r} requested but this GPU is {dev.kind} ({dev.name})")
    return dev


def _hip_build() -> bool:
    import torch

    return bool(torch.version.hip)


def select(requested: str = "auto", *, fp8_format: str | None = None) -> Device:
    """Resolve "auto" | "cpu" | "cuda" | "rocm" to a Device (``resolve``) and prepare Triton for it."""
    dev = resolve(requested, fp8_format=fp8_format)
    os.environ["VP_DEVICE"] = dev.kind
    if not dev.interpreted and os.environ.get("TRITON_INTERPRET") == "1":
        raise DeviceUnavailable("TRITON_INTERPRET=1 is set but a GPU run was requested; unset it")
    prepare_triton()
    return dev


def versions() -> dict[str, str]:
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__}


def synchronize(dev: Device) -> None:
    if not dev.interpreted:
        import torch

        torch.cuda.synchronize()
