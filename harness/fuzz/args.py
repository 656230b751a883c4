"""The arguments of each op's public call, as the classes see them: name, kind, layout, and the
case fields under which a call reads the argument (each op's ``ARGS`` in ``cases/<op>/bad_inputs.py``)."""
from __future__ import annotations

import importlib
import importlib.util

from harness.fuzz.declared import Arg
from harness.ops import BUILTIN

# the ops with a cases/<op>/bad_inputs.py, in harness.ops.BUILTIN order, and that module of each
MODULES = {op: importlib.import_module(f"cases.{op}.bad_inputs") for op in BUILTIN
           if importlib.util.find_spec(f"cases.{op}.bad_inputs") is not None}
OPS = tuple(MODULES)
ARGS: dict[str, tuple[Arg, ...]] = {op: mod.ARGS for op, mod in MODULES.items()}
TENSOR_KINDS = ("data", "param", "table", "buffer", "out", "index", "slots", "map", "indptr", "tree")
INDEX_KINDS = ("index", "slots", "map", "indptr", "tree")
FLOAT_DATA_KINDS = ("data", "param", "table", "buffer", "out")


def arg(op: str, name: str) -> Arg:
    return next(a for a in ARGS[op] if a.name == name)


def args_of(op: str, *kinds: str, layout: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
            only: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(a.name for a in ARGS[op] if a.kind in kinds and (not layout or a.layout in layout)
                 and a.name not in exclude and (not only or a.name in only))


def tensor_args(op: str) -> tuple[str, ...]:
    return tuple(a.name for a in ARGS[op] if a.kind in TENSOR_KINDS)
