"""Op registry: the ops and implementations of a run, where they are loaded from, and the plugin API
(the declarations themselves: ``harness.spec`` for an op, ``harness.impl`` for an implementation).

Implementations come from four places, checked by the same suite:
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

import importlib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import replace
from importlib import metadata
from typing import Any

from harness import tolerance
from harness.impl import ENTRY_POINT_SOURCE, KINDS, Impl, always, can_handle_takes_inputs
from harness.spec import ROLES, Effect, GpuPlan, KillPlan, OpSpec, OutputSpec

# the plugin API is imported from here (docs/plugins.md): the declarations of harness.spec and harness.impl too
__all__ = ["ENTRY_POINT_GROUP", "ENTRY_POINT_SOURCE", "KINDS", "ROLES", "Effect", "GpuPlan", "Impl", "KillPlan",
           "OpSpec", "OutputSpec", "Registry", "always", "can_handle_takes_inputs", "cwd_on_path",
           "default_registry", "parse_spec"]

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
        unknown = sorted(set(spec.roundings) - (set(tolerance.PRECISION_CLASSES) - {tolerance.EXACT}))
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
