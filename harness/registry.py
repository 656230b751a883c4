"""Op registry: one frozen spec per op, implementations per op, and the plugin API.

Implementations come from four places, checked by the same suite:
  * built-in (``harness.ops``): ``reference``, ``fused``, ``compiled`` (torch.compile of the chain);
  * mutants (``cases.mutants``): deliberately broken, the suite must flag each;
  * the entry-point group ``verify_parity.impls`` of any installed distribution;
  * ``--impl module:attr`` on the command line.
An entry point or ``module:attr`` names an ``Impl``, a list of them, or a zero-argument
callable returning either.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from harness import tolerance

ENTRY_POINT_GROUP = "verify_parity.impls"
KINDS = ("reference", "fused", "compiled", "external", "mutant")


def always(case, device) -> bool | str:
    return True


@dataclass(frozen=True)
class OutputSpec:
    name: str
    contract: str  # "numeric" (vs fp64 oracle, tolerance policy) or "exact" (bytes vs reference chain)
    when: Callable[[Any], bool] = lambda case: True  # is this output part of the contract for the case


@dataclass(frozen=True)
class Effect:
    """A buffer an op may write: rows ``rows`` must hold ``expected`` afterwards, all others keep their bytes."""
    buffer: str  # input name of the buffer
    rows: Any  # LongTensor of written row indices (may be empty)
    oracle_rows: Any  # oracle values for those rows (numeric) — or None for exact contracts
    contract: str = "numeric"


@dataclass(frozen=True)
class OpSpec:
    name: str
    case_type: type
    catalog: Callable[[], list]  # named cases
    strategy: Callable[[], Any]  # hypothesis strategy of cases
    build_inputs: Callable[[Any, Any], dict]  # (case, Device) -> kwargs for an implementation
    reference: Callable[..., Mapping]  # the unfused chain: kwargs -> outputs
    oracle: Callable[..., Mapping]  # fp64: kwargs -> outputs
    outputs: tuple[OutputSpec, ...]
    effects: Callable[[Any, dict, Mapping], list[Effect]]  # (case, inputs, oracle) -> buffers written
    writable: tuple[str, ...] = ()  # input buffers an implementation may write (canary-checked)
    out_args: tuple[str, ...] = ()  # caller-provided output arguments (poisoned with NaN in one run)
    doc: str = ""
    # Under the Triton interpreter a profile's generated-case count is capped here for ops whose
    # kernels cost seconds per launch there; compiled devices always run the full count.
    interpreter_generated: int | None = None
    # precision class name (harness.tolerance.PRECISION_CLASSES) -> keyword arguments that make
    # ``reference`` emulate that rounding; an Impl may declare only the roundings listed here
    roundings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # free choices of the chain (its split partition) that change how much an emulated rounding
    # costs: the rounded chain runs once per entry (keyword overrides; {} = the case as built) and
    # the allowance is the largest of their errors, since a kernel's own choice is not known
    rounding_variants: tuple[Mapping[str, Any], ...] = ({},)


@dataclass(frozen=True)
class Impl:
    op: str
    name: str
    kind: str
    fn: Callable[..., Mapping]  # kwargs from OpSpec.build_inputs -> {output name: tensor or None}
    can_handle: Callable[[Any, Any], bool | str] = always  # True, or the reason it refuses
    fp8_policy: str = ""  # declared fp8 overflow policy, shown in reports
    doc: str = ""
    catches: tuple[str, ...] = field(default=())  # mutants: checks expected to flag it
    # the roundings its design makes on purpose, "+"-joined (harness.tolerance.PRECISION_CLASSES);
    # the allowance is derived from the reference chain with exactly those roundings emulated
    precision: str = "exact-fp32"
    may_write: tuple[str, ...] = ()  # inputs it may modify in place beyond the op's writable buffers
    source: str = ""  # how it was loaded ("module:attr" of --impl or an entry point); "" for built-ins

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


class Registry:
    def __init__(self):
        self.ops: dict[str, OpSpec] = {}
        self.impls: dict[str, Impl] = {}

    def add_op(self, spec: OpSpec) -> None:
        if spec.name in self.ops:
            raise ValueError(f"op {spec.name!r} registered twice")
        unknown = sorted(set(spec.roundings) - (set(tolerance.PRECISION_CLASSES) - {tolerance.EXACT}))
        if unknown:
            raise ValueError(f"op {spec.name!r}: roundings {unknown} are not precision classes of harness.tolerance")
        self.ops[spec.name] = spec

    def add(self, impl: Impl) -> None:
        if impl.op not in self.ops:
            raise ValueError(f"{impl.key}: unknown op {impl.op!r}; known: {sorted(self.ops)}")
        spec = self.ops[impl.op]
        undefined = sorted(tolerance.parse_precision(impl.precision) - set(spec.roundings))
        if undefined:
            raise ValueError(f"{impl.key}: precision {impl.precision!r} names rounding(s) {undefined} that op "
                             f"{impl.op!r} does not emulate (its OpSpec.roundings: "
                             f"{sorted(spec.roundings) or 'none'}); without an emulated chain there is no allowance")
        if self.impls.get(impl.key) is impl:  # same object via an entry point and --impl
            return
        if impl.key in self.impls:
            raise ValueError(f"implementation {impl.key} registered twice")
        self.impls[impl.key] = impl

    def add_any(self, obj: Any, *, source: str) -> list[Impl]:
        """Register an Impl, a list of them, or a zero-argument callable returning either."""
        if callable(obj) and not isinstance(obj, Impl):
            obj = obj()
        items = [obj] if isinstance(obj, Impl) else list(obj)
        for it in items:
            if not isinstance(it, Impl):
                raise TypeError(f"{source}: expected harness.registry.Impl, got {type(it).__name__}")
            self.add(it)
        return items

    def for_op(self, op: str, kinds: tuple[str, ...] = KINDS) -> list[Impl]:
        return [i for i in self.impls.values() if i.op == op and i.kind in kinds]

    def load_entry_points(self) -> list[Impl]:
        out = []
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            out += self.add_any(ep.load(), source=f"entry point {ep.name} = {ep.value}")
        return out

    def load_spec(self, spec: str) -> list[Impl]:
        """``module:attr`` from the command line."""
        if ":" not in spec:
            raise ValueError(f"--impl: expected module:attr, got {spec!r}")
        mod, attr = spec.split(":", 1)
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return self.add_any(obj, source=f"--impl {spec}")


def default_registry(*, with_mutants: bool = True, with_plugins: bool = True, extra: tuple[str, ...] = ()) -> Registry:
    """Built-in ops and implementations, then mutants, entry points and ``extra`` module:attr specs."""
    from harness import ops

    reg = Registry()
    ops.register_builtin(reg)
    if with_mutants:
        from cases import mutants

        mutants.register(reg)
    if with_plugins:
        reg.load_entry_points()
    for spec in extra:
        reg.load_spec(spec)
    return reg
