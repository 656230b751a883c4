"""What the commands of ``python -m harness`` share before their work: the registry (built-ins,
mutants, entry points, ``--impl module:attr`` plugins), the profile, the device, and the
implementations ``--impl`` / ``--kind`` / ``--op`` select. A bad argument is a ``UsageError``."""
from __future__ import annotations

import argparse
import os
import sys

from harness.usage import UsageError


def load_registry():
    """Built-ins, mutants and entry points; one warning line on stderr per broken entry point."""
    from harness.ops import default_registry

    reg = default_registry()
    for err in reg.load_errors:
        print(f"warning: {err} (skipped)", file=sys.stderr)
    return reg


def load_specs(reg, specs) -> list:
    """Register every ``--impl module:attr[names]``; one that fails is a clear exit naming the spec."""
    loaded = []
    for spec in specs:
        try:
            loaded += reg.load_spec(spec)
        except Exception as exc:  # the user asked for this one: no traceback, the spec and the error
            arg, _, msg = str(exc).partition(": ")
            if arg.startswith("--impl"):  # the registry's own message names the spec
                raise UsageError(arg, msg) from None
            raise UsageError(f"--impl {spec}", f"cannot load it: {type(exc).__name__}: {exc}") from None
    return loaded


def plugin_spec(text: str) -> str:
    """argparse type of ``compile --impl``: a module:attr spec (built-in kernels need no --impl)."""
    if ":" not in text:
        raise argparse.ArgumentTypeError(f"expected module:attr[name,...] (a plugin), got {text!r}")
    return text


def plugin_specs(args) -> tuple[str, ...]:
    return tuple(s for s in getattr(args, "impl", None) or () if ":" in s)


def select_profile(name: str | None):
    """``--profile`` (checked by argparse), else ``$VP_PROFILE``, else ci."""
    from cases import profiles

    env = os.environ.get(profiles.ENV)
    if name is None and env is not None and env not in profiles.PROFILES:
        raise UsageError(profiles.ENV, f"expected one of {', '.join(sorted(profiles.PROFILES))}, got {env!r}")
    return profiles.current(name)


def setup(args, *, prepare: bool = True):
    """The device (``prepare=False``: named only, Triton left alone, as ``list`` does), the profile and
    the registry with ``--impl module:attr``'s implementations loaded (``args.loaded``)."""
    from harness import devices

    prof = select_profile(getattr(args, "profile", None))
    choose = devices.select if prepare else devices.resolve
    dev = choose(args.device, fp8_format=getattr(args, "fp8_format", None))
    reg = load_registry()
    args.loaded = load_specs(reg, plugin_specs(args))
    return dev, prof, reg


def select_impls(reg, args, default_kinds):
    """--impl NAME selects by name; --impl module:attr selects what it loaded; else --kind."""
    names = [s for s in args.impl or () if ":" not in s]
    kinds = tuple(args.kind) if args.kind else default_kinds
    ops = args.op or sorted(reg.ops)  # argparse checked --op against the built-in ops
    chosen = []
    for impl in reg.impls.values():
        if impl.op not in ops:
            continue
        if names or args.loaded:
            if impl.name in names or any(impl is i for i in args.loaded):
                chosen.append(impl)
        elif impl.kind in kinds:
            chosen.append(impl)
    missing = set(names) - {i.name for i in chosen}
    if missing:
        known = sorted({i.name for i in reg.impls.values() if i.op in ops})
        raise UsageError("--impl", f"unknown implementation(s) {', '.join(sorted(missing))} for {', '.join(ops)}; "
                                   f"known: {', '.join(known)}")
    return ops, chosen
