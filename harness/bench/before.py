"""``--before`` of the benchmarks: an earlier tree's op module loaded beside ours (e.g.
``python -m cases.qk_norm_rope.bench --vs-sglang --before OLD/fused/qk_norm_rope/wrapper.py``), with the
kernels and the dispatch of that tree, so that what is timed as ``before`` is that tree's code throughout.

Two layouts load: this tree's (``fused/<op>/wrapper.py`` with ``kernels.py`` and ``dispatch.py`` beside it,
imported as ``fused.<op>.kernels`` and ``fused.<op>.dispatch``) and the one of trees before 2026-12-07
(``fused/<op>.py`` with ``fused/kernels/<op>.py`` and ``fused/<op>_dispatch.py``, imported as
``fused.kernels.<op>`` and ``fused.<op>_dispatch``, and the op's reference as ``from reference import
<op>``). Either way the module comes back with this tree's name for its one launch (``launch``)."""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import types
from pathlib import Path

_MISSING = object()


def _load(name: str, file: Path):
    spec = importlib.util.spec_from_file_location(name, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def layout(path) -> tuple[str, str, list[tuple[str, Path, str]]]:
    """(op, the name the file is loaded under, its companions): [(the module name the file's imports
    give, the companion's file, the name it is loaded under)] in import order (the dispatch imports
    the kernels), those of the file's layout that exist beside it. ``.../fused/<op>/wrapper.py``: this
    tree's layout; any other ``.../fused/<op>.py``: the one of trees before 2026-12-07."""
    path = Path(path)
    if path.name == "wrapper.py":
        op, here = path.parent.name, path.parent
        found = [(f"fused.{op}.kernels", here / "kernels.py"), (f"fused.{op}.dispatch", here / "dispatch.py")]
    else:
        op = path.stem
        found = [(f"fused.kernels.{op}", path.parent / "kernels" / path.name),
                 (f"fused.{op}_dispatch", path.parent / f"{op}_dispatch.py")]
    parts = ("kernels", "dispatch")
    return op, f"{op}_before", [(name, file, f"{op}_before_{part}") for (name, file), part in zip(found, parts)
                                if file.is_file()]


def flat_reference(op: str) -> types.ModuleType:
    """This tree's reference of ``op`` as the one module ``reference.<op>`` of the layout before the
    house: the public names of every module of the package ``reference.<op>``, the chain's last."""
    pkg = importlib.import_module(f"reference.{op}")
    names = sorted((m.name for m in pkgutil.iter_modules(pkg.__path__)), key=lambda n: n == "chain")
    flat = types.ModuleType(f"reference.{op}", f"reference.{op}'s modules as one (--before of an older tree)")
    for n in names:
        mod = importlib.import_module(f"reference.{op}.{n}")
        flat.__dict__.update({k: v for k, v in vars(mod).items() if not k.startswith("_")})
    return flat


class _Stand:
    """Modules put in place while an earlier tree's file is imported (in ``sys.modules`` and as the
    attribute of the parent package: ``from fused import x`` reads the attribute first), and what
    was there before each, put back by ``restore``."""

    def __init__(self):
        self.saved: list[tuple[str, bool, object, object]] = []

    def put(self, name: str, mod, *, in_sys_modules: bool = True) -> None:
        package, _, attr = name.rpartition(".")
        parent = importlib.import_module(package)
        self.saved.append((name, in_sys_modules, sys.modules.get(name, _MISSING), getattr(parent, attr, _MISSING)))
        if in_sys_modules:
            sys.modules[name] = mod
        setattr(parent, attr, mod)

    def restore(self) -> None:
        for name, in_sys_modules, was, attr_was in reversed(self.saved):
            package, _, attr = name.rpartition(".")
            if in_sys_modules and was is _MISSING:
                sys.modules.pop(name, None)
            elif in_sys_modules:
                sys.modules[name] = was
            if attr_was is _MISSING:
                delattr(sys.modules[package], attr)
            else:
                setattr(sys.modules[package], attr, attr_was)
        self.saved.clear()


def load_module(path):
    """A fused op module from a file (``--before``: e.g. an earlier commit's fused/qk_norm_rope/wrapper.py,
    or fused/qk_norm_rope.py of a tree from before 2026-12-07) with its own companions (``layout``): the
    kernels and the dispatch beside the file stand in for the modules its imports name while the file is
    imported (the dispatch launches the kernel its own import found, so both must be the file's tree's;
    a file without them holds its kernels). An older tree's names our tree lacks (``fused.kernels`` and
    its modules, ``fused.<op>_dispatch``; ``reference.<op>`` as one module, ``flat_reference``) exist only
    meanwhile. Ours are back in place afterwards, and the module answers to ``launch`` (``_launch`` in
    trees before it was public)."""
    op, name, companions = layout(path)
    stand = _Stand()
    try:
        if any(n.startswith("fused.kernels.") for n, _, _ in companions) and "fused.kernels" not in sys.modules:
            package = types.ModuleType("fused.kernels", "stand-in for an older tree's fused/kernels/ package")
            package.__path__ = []
            stand.put("fused.kernels", package)
        if Path(path).name != "wrapper.py":  # ``from reference import <op>``: the module of the older layout
            stand.put(f"reference.{op}", flat_reference(op), in_sys_modules=False)
        for mod_name, file, loaded in companions:
            stand.put(mod_name, _load(loaded, file))
        mod = _load(name, Path(path))
    finally:
        stand.restore()
    if not hasattr(mod, "launch"):
        mod.launch = getattr(mod, "_launch")  # the one launch's name in trees before 2026-12-07
    return mod
