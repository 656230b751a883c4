"""Op registry: the declarations of the plugin API and the registry of a run.

An op's declaration is one frozen ``OpSpec`` (``cases/<op>/spec.py`` for a built-in op) with its
outputs (``OutputSpec``), the buffers it writes (``Effect``), its rows in the kill matrix
(``KillPlan``) and its GPU-only checks (``GpuPlan``); the shared machinery reads these fields and
names no op. An implementation of an op is an ``Impl`` (what it computes, when it refuses, what it
declares about its precision and writes), checked by the same suite whatever its kind.

Implementations come from four places (``harness.ops.default_registry`` loads all of them):
  * built-in (``harness.ops``): ``reference``, ``fused``, ``compiled`` (torch.compile of the chain);
  * mutants (``cases.mutants``): deliberately broken, the suite must flag each;
  * the entry-point group ``verify_parity.impls`` of any installed distribution;
  * ``--impl module:attr`` on the command line.
An entry point or ``module:attr`` names an ``Impl``, a list of them, or a zero-argument
callable returning either; ``module:attr[name,name]`` registers only the named ones of that list.
A loaded implementation keeps where it came from in ``Impl.source`` (its repro line loads it
again from there); a broken entry point is recorded in ``Registry.load_errors``, not raised.
The contract an implementation meets per op: docs/plugins.md.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Any

from harness import tolerance

# the plugin API is imported from here (docs/plugins.md)
__all__ = ["ENTRY_POINT_GROUP", "ENTRY_POINT_SOURCE", "KINDS", "ROLES", "Deferred", "DistributionPlan", "Effect",
           "GpuPlan", "Impl",
           "KillPlan", "OpSpec", "OutputSpec", "Registry", "always", "can_handle_takes_inputs", "cwd_on_path",
           "nan_policy_of", "parse_spec"]


# ----------------------------------------------------------------------------- a function imported when called

_TARGET = re.compile(r"^[\w.]+:[\w.]+$")


@functools.cache
def _resolve(target: str) -> Callable:
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Deferred:
    """The function ``module:attr``, imported at its first call: a declaration (an ``OpSpec`` field, an
    ``Impl.fn``) names a function of a module that imports torch without importing that module, so that
    reading the declarations (``python -m harness list``, every ``--help``) imports no torch. Called, it
    calls the function; ``inspect.signature`` sees the function's own signature. Equal when the targets are."""
    target: str  # "module:attr" (attr may be dotted: a class's attribute)

    def __post_init__(self):
        if not isinstance(self.target, str) or not _TARGET.match(self.target):
            raise ValueError(f"Deferred: expected 'module:attr', got {self.target!r}")

    def resolve(self) -> Callable:
        """The function itself (its module imported on the first call)."""
        return _resolve(self.target)

    def __call__(self, *args, **kwargs):
        return _resolve(self.target)(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(_resolve(self.target))


# ----------------------------------------------------------------------------- an op

@dataclass(frozen=True)
class OutputSpec:
    name: str
    contract: str  # "numeric" (vs fp64 oracle, tolerance policy) or "exact" (bytes vs reference chain)
    when: Callable[[Any], bool] = lambda case: True  # is this output part of the contract for the case
    # exact outputs: (reported value, inputs after the call, writable buffers before it) -> the value compared
    # instead of the reported one (what the call did, where the output only says what it claims to have done);
    # computed on the buffers' device. Its docstring's first line explains a failing record.
    observed: Callable[[Any, Mapping, Mapping], Any] | None = None


@dataclass(frozen=True)
class Effect:
    """A buffer an op may write: rows ``rows`` must hold ``expected`` afterwards, all others keep their bytes."""
    buffer: str  # input name of the buffer
    rows: Any  # LongTensor of written row indices (may be empty)
    oracle_rows: Any  # oracle values for those rows (numeric) — or None for exact contracts
    contract: str = "numeric"
    # what the contract compares of the rows: None, the rows themselves; else a function of
    # ``buffer[rows]`` (on its device) returning the values a reader sees (a paged fp8 pool's token
    # records decoded), applied to the implementation's rows and the reference chain's alike
    view: Callable[[Any], Any] | None = None
    # (len(rows), n) bool, or None (whole rows): the bytes among the first n of each listed row that
    # the op writes; the other bytes of those rows must keep theirs (``untouched:``), as unlisted rows do
    written_bytes: Any = None


@dataclass(frozen=True)
class KillPlan:
    """The op's row set in the mutant kill matrix (``harness.mutants.killmatrix``)."""
    clean: tuple[str, ...]  # implementations that must pass every family (clean rows)
    cases: tuple[str, ...]  # catalog names: the fixed targeted parity subset, the same for every implementation
    timelines: tuple[str, ...] = ()  # ``family/name`` timelines of cases.timelines: the families that use the op


@dataclass(frozen=True)
class GpuPlan:
    """What ``harness.gpu.checks`` runs of the op and expects (``harness.gpu.runners`` docstring)."""
    cases: tuple[str, ...]  # catalog names for launches and graph: realistic verify batches
    full: str  # catalog name for the determinism rerun: the largest real shape of the catalog
    fused_launches: int  # device kernels of one fused call, by design
    # the reference chain's launch functions: names in reference/<op>/chain.py, or ``module:name`` for one of
    # another module of the chain
    stages: tuple[str, ...]
    expected_stages: Callable[[Any, dict], int]  # calls of them in one reference call of (case, inputs)
    step: str  # the function of fused/<op>/wrapper.py that takes ``gate_fn``
    reference_not_capturable: str = ""  # why the reference chain cannot be captured ("": it can)
    # inputs -> a context manager entered while a call runs as a CUDA graph runs it, beyond the value
    # checks off (``harness.gpu.runners.capture_safe``): the op's own switches (context variables of its
    # modules); called outside capture
    capture: Callable[[dict], Any] = lambda inputs: contextlib.nullcontext()


@dataclass(frozen=True)
class DistributionPlan:
    """A sampling op's distributional check (``harness.parity.distribution``): on a case it applies
    to, an implementation that draws its own randomness is called on ``batches(case, device)`` (each
    a dict of inputs: the case's requests repeated, fresh draws, its own seed), and ``verdict`` judges
    every (inputs, outputs) pair together against the case's exact distribution, as records whose
    false-alarm probability for a correct implementation is at most ``alpha`` each. One verdict, no rerun."""
    applies: Callable[[Any], bool]  # case -> whether the check runs on it
    batches: Callable[[Any, Any], Any]  # (case, Device) -> iterable of input dicts, one per call
    verdict: Callable[[Any, list, float], list]  # (case, [(inputs, outputs) on the host], alpha) -> [compare.Record]
    alpha: float = 1e-6


# "prepare": a timeline family's prepare step; "attn": the attention of every family; "accept": the
# acceptance after every verify step (the n a timeline's backend rolls back to); "tree-accept": the acceptance
# after a tree family's verify step (the path its backend commits); "sampler": the speculative sampler of the
# end-to-end engine at temperature > 0 (harness.e2e.engine, the sampled gate)
ROLES = ("", "prepare", "attn", "accept", "tree-accept", "sampler")


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
    inputs: tuple[str, ...] = ()  # every keyword build_inputs gives (Impl.may_write is checked against it)
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
    # precision class name -> a function of the op's inputs (a copy) giving the inputs the oracle of that
    # class sees: for a class that changes what a kernel computes on, not only how it rounds (the drafts
    # stored in the fp8 cache before attention: the kernel attends to the stored drafts). The class's
    # records compare the output and its emulated chain with that oracle instead of the op's own
    rounding_oracle_inputs: Mapping[str, Callable[[dict], dict]] = field(default_factory=dict)
    # NaN handling an implementation may declare (``Impl.nan_policy``) -> keyword arguments that make
    # ``reference`` and ``oracle`` honour it; the first is the default, what an undeclared one is held to
    # ({}: the op has one NaN rule, no choice)
    nan_policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # --- what the shared machinery needs about the op (it loops over the registry, naming no op)
    # output or written buffer name -> its tolerance, replacing the dtype's floor (harness.tolerance)
    tolerances: Mapping[str, tolerance.Tolerance] = field(default_factory=dict)
    role: str = ""  # ROLES: the op's place in the timeline / end-to-end models, looked up by role
    kill: KillPlan | None = None  # its rows in the kill matrix (None: none)
    gpu: GpuPlan | None = None  # its GPU-only checks (None: none)
    nightly: bool = True  # the nightly runs its parity step
    # ops of one nightly group share one parity step, named after the group's first op in the plan ("": a
    # step of its own): light ops share one, so the concurrent steps' processes stay within the host
    # (harness.nightly.plan.parity_groups)
    nightly_group: str = ""
    # nightly parity workers relative to the other ops (their cost per case: implementations, checks);
    # < 1 for an op cheaper per case (harness.nightly.plan.parity_jobs)
    parity_weight: float = 1
    # relative cost of running one case (any unit, e.g. the elements it reads), for scheduling only:
    # the suite hands the costliest cases to its workers first, so that a long case does not start last
    # and leave the others idle; None: plan order (``cases/<op>/catalog.py::case_cost`` when it has one)
    case_cost: Callable[[Any], float] | None = None
    bench: str = ""  # module of its benchmark (harness.bench.perf's per-op API); "": none
    # role "prepare": zero-argument factory of its harness.timelines.runner.Prepare adapter (cases/<op>/prepare.py)
    timeline: Callable[[], Any] | None = None
    # a sampling op: the distributional check of implementations that draw their own randomness (None: none)
    distribution: DistributionPlan | None = None

    def tolerance(self, output: str, dtype) -> tolerance.Tolerance:
        """The tolerance of ``output`` (an output or written buffer) in ``dtype``: its override in
        ``tolerances``, else the dtype's floor (``harness.tolerance``)."""
        if output in self.tolerances:
            return self.tolerances[output]
        return tolerance.floor(self.name, output, dtype)


def nan_policy_of(spec: OpSpec, impl) -> str:
    """The NaN policy ``impl`` is held to: its declared ``nan_policy``, else the op's default (the first
    of ``spec.nan_policies``); "" for an op without NaN policies."""
    return impl.nan_policy or next(iter(spec.nan_policies), "")


# ----------------------------------------------------------------------------- an implementation

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
    # declared NaN handling, one of its op's ``OpSpec.nan_policies`` ("": the op's default); the reference
    # and oracle it is held to honour it (``nan_policy_of``), and reports show it
    nan_policy: str = ""
    doc: str = ""
    catches: tuple[str, ...] = field(default=())  # mutants: checks expected to flag it
    # the roundings its design makes on purpose, "+"-joined (harness.tolerance.PRECISION_CLASSES);
    # the allowance is derived from the reference chain with exactly those roundings emulated
    precision: str = "exact-fp32"
    may_write: tuple[str, ...] = ()  # inputs it may modify in place beyond the op's writable buffers
    source: str = ""  # how it was loaded ("module:attr" of --impl or an entry point); "" for built-ins
    # its Triton kernels for ``python -m harness compile --impl``: a zero-argument callable returning
    # (name, jit function, signature, constexprs, num_warps[, targets]) tuples, as fused/<op>/wrapper.py's
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


# ----------------------------------------------------------------------------- the registry

ENTRY_POINT_GROUP = "verify_parity.impls"
_SPEC = re.compile(r"^(?P<module>[\w.]+):(?P<attr>[\w.]+)(?:\[(?P<names>[^\]]*)\])?$")


class Registry:
    def __init__(self):
        self.ops: dict[str, OpSpec] = {}
        self.impls: dict[str, Impl] = {}
        self.load_errors: list[str] = []  # one line per entry point that failed to load
        self._origin: dict[str, Impl] = {}  # key -> the object as loaded (before source was set)

    def add_op(self, spec: OpSpec) -> None:
        if spec.name in self.ops:
            raise ValueError(f"op {spec.name!r} registered twice")
        unknown = sorted((set(spec.roundings) | set(spec.rounding_oracle_inputs))
                         - (set(tolerance.PRECISION_CLASSES) - {tolerance.EXACT}))
        if unknown:
            raise ValueError(f"op {spec.name!r}: roundings {unknown} are not precision classes of harness.tolerance")
        if spec.role not in ROLES:
            raise ValueError(f"op {spec.name!r}: role {spec.role!r} is not one of {ROLES}")
        self.ops[spec.name] = spec

    def by_role(self, role: str) -> list[OpSpec]:
        """The registered ops with ``role`` (registration order)."""
        return [s for s in self.ops.values() if s.role == role]

    def attention(self) -> OpSpec:
        """The one op with role ``attn``: the attention step of every timeline family."""
        found = self.by_role("attn")
        if len(found) != 1:
            raise LookupError(f"expected one op with role 'attn', got {[s.name for s in found]}")
        return found[0]

    def validate(self, impl: Impl) -> None:
        """What can be checked of an implementation before it runs: its op, a name a repro line
        can select (no ``,[]``), ``may_write`` a tuple of input names of the op."""
        if impl.op not in self.ops:
            raise ValueError(f"{impl.key}: unknown op {impl.op!r}; known: {sorted(self.ops)}")
        spec = self.ops[impl.op]
        undefined = sorted(tolerance.parse_precision(impl.precision) - set(spec.roundings))
        if undefined:
            raise ValueError(f"{impl.key}: precision {impl.precision!r} names rounding(s) {undefined} that op "
                             f"{impl.op!r} does not emulate (its OpSpec.roundings: "
                             f"{sorted(spec.roundings) or 'none'}); without an emulated chain there is no allowance")
        if impl.nan_policy and impl.nan_policy not in spec.nan_policies:
            raise ValueError(f"{impl.key}: nan_policy {impl.nan_policy!r} is not one op {impl.op!r} can check "
                             f"(its OpSpec.nan_policies: {list(spec.nan_policies) or 'none'})")
        if not impl.name or any(c in impl.name for c in ",[]"):
            raise ValueError(f"{impl.key}: name must be non-empty, without ',', '[' or ']' "
                             f"(--impl module:attr[name,...] selects by it)")
        mw = impl.may_write
        if isinstance(mw, str) or not all(isinstance(n, str) and n for n in mw):
            raise ValueError(f"{impl.key}: may_write must be a tuple of input names, e.g. ('kv',); got {mw!r}")
        known = spec.inputs
        unknown = [n for n in mw if known and n not in known]
        if unknown:
            raise ValueError(f"{impl.key}: may_write names {unknown}, not inputs of {impl.op}; inputs: {list(known)}")

    def add(self, impl: Impl, *, source: str = "") -> Impl:
        """Register ``impl`` (with ``source`` recorded in ``Impl.source`` when given) and return the
        registered object. The same implementation loaded twice (equal fields, e.g. an entry point
        and ``--impl`` naming one module, or a factory called again) is registered once."""
        self.validate(impl)
        held = self.impls.get(impl.key)
        if held is not None and (self._origin.get(impl.key) is impl or replace(held, source=impl.source) == impl):
            return held
        if held is not None:
            raise ValueError(f"implementation {impl.key} registered twice"
                             + (f" ({held.source} and {source})" if source or held.source else ""))
        self.impls[impl.key] = replace(impl, source=source) if source else impl
        self._origin[impl.key] = impl
        return self.impls[impl.key]

    @staticmethod
    def resolve(obj: Any, *, source: str) -> list[Impl]:
        """An Impl, a list of them, or a zero-argument callable returning either -> the list."""
        if callable(obj) and not isinstance(obj, Impl):
            obj = obj()
        if isinstance(obj, Impl):
            return [obj]
        if isinstance(obj, (str, bytes, Mapping)) or not hasattr(obj, "__iter__"):
            raise TypeError(f"{source}: expected harness.registry.Impl, a list of them or a callable returning "
                            f"either; got {type(obj).__name__}")
        items = list(obj)
        for it in items:
            if not isinstance(it, Impl):
                raise TypeError(f"{source}: expected harness.registry.Impl, got {type(it).__name__}")
        return items

    def add_any(self, obj: Any, *, source: str, select: tuple[str, ...] = (), record: str = "") -> list[Impl]:
        """Register what ``obj`` provides (see ``resolve``); ``select``: only the implementations
        with these names (``name`` or ``op/name``), each of which must exist. ``record``: the
        ``Impl.source`` to set. All are checked before any is registered."""
        items = self.resolve(obj, source=source)
        if select:
            unknown = [n for n in select if not any(n in (i.name, i.key) for i in items)]
            if unknown:
                raise ValueError(f"{source}: no implementation named {', '.join(map(repr, unknown))}; "
                                 f"it provides: {', '.join(i.key for i in items) or 'nothing'}")
            items = [i for i in items if i.name in select or i.key in select]
        for it in items:
            self.validate(it)
        return [self.add(it, source=record) for it in items]

    def for_op(self, op: str, kinds: tuple[str, ...] = KINDS) -> list[Impl]:
        return [i for i in self.impls.values() if i.op == op and i.kind in kinds]

    def load_entry_points(self) -> list[Impl]:
        """Every entry point of the group; one that fails to load (import error, a bad object, a
        clash) is recorded in ``load_errors``, naming its distribution, and skipped."""
        out = []
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(ep, "dist", None)
            dist = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "unknown distribution"
            where = f"{ENTRY_POINT_SOURCE}{ep.name} = {ep.value} ({dist})"
            try:
                out += self.add_any(ep.load(), source=where, record=where)
            except Exception as exc:  # a vendor's broken package must not break the other commands
                self.load_errors.append(f"{where}: {type(exc).__name__}: {exc}")
        return out

    def load_spec(self, spec: str) -> list[Impl]:
        """``module:attr`` or ``module:attr[name,name]`` from the command line. Import errors propagate."""
        module, attr, names = parse_spec(spec)
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return self.add_any(obj, source=f"--impl {spec}", select=names, record=f"{module}:{attr}")


def parse_spec(spec: str) -> tuple[str, str, tuple[str, ...]]:
    """``module:attr[name,name]`` -> (module, attr, names); no brackets: no selection."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise ValueError(f"--impl: expected module:attr or module:attr[name,...], got {spec!r}")
    names = tuple(n.strip() for n in (m["names"] or "").split(",") if n.strip())
    if m["names"] is not None and not names:
        raise ValueError(f"--impl {spec}: empty selection []; name the implementations, "
                         f"e.g. {m['module']}:{m['attr']}[mine]")
    return m["module"], m["attr"], names


def cwd_on_path() -> None:
    """``--impl module:attr`` finds modules in the current directory, as under ``python -m harness``:
    also from the ``verify-parity`` console script (its sys.path[0] is its bin directory) and in
    spawned workers."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
