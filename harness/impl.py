"""An implementation of an op: ``Impl`` (what it computes, when it refuses, what it declares about
its precision and writes), checked by the same suite whatever its kind: built-in, mutant, an entry
point or ``--impl module:attr`` (``harness.registry`` loads them)."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from harness import tolerance

ENTRY_POINT_SOURCE = "entry point "  # Impl.source of an entry point's impls starts so
KINDS = ("reference", "fused", "compiled", "external", "mutant")


def always(case, device) -> bool | str:
    return True


@functools.cache
def _takes_inputs(fn) -> bool:
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:  # (case, device) only
        return False
    except ValueError:  # no signature to inspect (a builtin): the two-argument form
        return False
    return True


def can_handle_takes_inputs(fn) -> bool:
    """Whether ``fn`` is the three-argument form ``can_handle(case, device, inputs)`` (its signature
    binds three positional arguments); decided once per function."""
    try:
        return _takes_inputs(fn)
    except TypeError:  # an unhashable callable object: inspect it every time
        return _takes_inputs.__wrapped__(fn)


@dataclass(frozen=True)
class Impl:
    op: str
    name: str
    kind: str
    fn: Callable[..., Mapping]  # kwargs from OpSpec.build_inputs -> {output name: tensor or None}
    # True, or the reason it refuses: can_handle(case, device), or can_handle(case, device, inputs)
    # with a copy of the exact inputs fn will get (a vendor's own check on the real tensors)
    can_handle: Callable[..., bool | str] = always
    fp8_policy: str = ""  # declared fp8 overflow policy, shown in reports
    doc: str = ""
    catches: tuple[str, ...] = field(default=())  # mutants: checks expected to flag it
    # the roundings its design makes on purpose, "+"-joined (harness.tolerance.PRECISION_CLASSES);
    # the allowance is derived from the reference chain with exactly those roundings emulated
    precision: str = "exact-fp32"
    may_write: tuple[str, ...] = ()  # inputs it may modify in place beyond the op's writable buffers
    source: str = ""  # how it was loaded ("module:attr" of --impl or an entry point); "" for built-ins
    # its Triton kernels for ``python -m harness compile --impl``: a zero-argument callable returning
    # (name, jit function, signature, constexprs, num_warps[, targets]) tuples, as fused/<op>.py's
    # compile_specs() does; None: it declares none
    compile_specs: Callable[[], list] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")
        try:
            tolerance.parse_precision(self.precision)
        except ValueError as exc:
            raise ValueError(f"{self.op}/{self.name}: {exc}") from None

    @property
    def key(self) -> str:
        return f"{self.op}/{self.name}"

    def handles(self, case, device, inputs: Callable[[], dict] | None = None) -> bool | str:
        """``can_handle`` in whichever form it takes; ``inputs()`` builds a fresh copy of the case's
        inputs, called only for the three-argument form (None there: the two-argument call is an error)."""
        if not can_handle_takes_inputs(self.can_handle):
            return self.can_handle(case, device)
        if inputs is None:
            raise TypeError(f"{self.key}: can_handle takes the inputs; the caller gave none")
        return self.can_handle(case, device, inputs())

    @property
    def impl_arg(self) -> str:
        """The ``--impl`` value that selects this implementation in a fresh process: its name for
        built-ins, mutants and entry points (loaded by default), ``module:attr[name]`` for one
        loaded by ``--impl module:attr``."""
        if self.source and not self.source.startswith(ENTRY_POINT_SOURCE):
            return f"{self.source}[{self.name}]"
        return self.name


