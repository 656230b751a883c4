"""``--before`` of the benchmarks: an earlier tree's op module loaded beside ours (e.g.
``python -m cases.qk_norm_rope.bench --vs-sglang --before OLD/fused/qk_norm_rope.py``), with the kernels
and the dispatch of that tree, so that what is timed as ``before`` is that tree's code throughout."""
from __future__ import annotations

import sys
from pathlib import Path


def load_module(path):
    """A kernel module from a file (``--before``: e.g. an earlier commit's fused/qk_norm_rope/wrapper.py) with
    its own companions: a ``kernels/qk_norm_rope.py`` beside the file stands in for
    ``fused.qk_norm_rope.kernels`` and a ``qk_norm_rope_dispatch.py`` for ``fused.qk_norm_rope.dispatch``
    while the file is imported (the dispatch launches the kernel its own import found, so both must be
    the file's tree's; a file without them holds its kernels). Ours are back in place afterwards."""
    import importlib
    import importlib.util

    def load(name, file):
        spec = importlib.util.spec_from_file_location(name, file)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look their module up
        spec.loader.exec_module(mod)
        return mod

    path = Path(path)
    # (our module's name, the file's companion, its name loaded), in import order: the dispatch imports the kernels
    companions = [c for c in (
        (f"fused.kernels.{path.stem}", path.parent / "kernels" / path.name, f"{path.stem}_before_kernels"),
        (f"fused.{path.stem}_dispatch", path.parent / f"{path.stem}_dispatch.py", f"{path.stem}_before_dispatch"))
        if c[1].is_file()]
    ours = {name: importlib.import_module(name) for name, _, _ in companions}

    def put(name, mod):
        package, _, attr = name.rpartition(".")
        sys.modules[name] = mod
        setattr(sys.modules[package], attr, mod)  # ``from fused import x`` reads the attribute first

    try:
        for name, file, loaded in companions:
            put(name, load(loaded, file))
        return load(f"{path.stem}_before", path)
    finally:
        for name, mod in ours.items():
            put(name, mod)
