"""Every op has its five pieces under one name stem, every implementation is well formed, shared
modules name no op (they loop over the registry), and the packages import each other without cycles."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from harness.ops import BUILTIN

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("op", BUILTIN)
def test_five_pieces(op, registry):
    for piece in (f"reference/{op}.py", f"fused/{op}.py", f"cases/{op}.py", f"harness/ops/{op}.py", f"tests/test_{op}.py"):
        assert (ROOT / piece).is_file(), f"{op}: missing {piece}"
    assert op in registry.ops, f"{op}: no registry entry"
    kinds = {i.kind for i in registry.for_op(op)}
    assert {"reference", "fused"} <= kinds, f"{op}: implementations {kinds}"


def test_no_stray_op_modules(registry):
    """A reference/fused module without a registry entry is an op nobody checks. A module of one op's
    own (``<op>_<part>.py``: a second form of its chain, a baseline) belongs to that op."""
    for folder in ("reference", "fused"):
        for f in (ROOT / folder).glob("*.py"):
            if f.stem.startswith("_") or f.stem in ("checks", "kv_model", "device_checks"):  # shared, not ops
                continue
            owner = f.stem if f.stem in registry.ops else next((op for op in registry.ops
                                                                if f.stem.startswith(f"{op}_")), None)
            assert owner in registry.ops, f"{folder}/{f.name} has no registry entry in harness/ops"


def test_reference_never_imports_triton():
    for f in (ROOT / "reference").glob("*.py"):
        assert "triton" not in f.read_text(), f"{f.name}: reference/ must stay pure PyTorch"


def test_mutants_are_documented(registry):
    mutants = [i for i in registry.impls.values() if i.kind == "mutant"]
    assert mutants
    for m in mutants:
        assert m.doc and m.catches, f"{m.key}: a mutant names its bug class and the checks that catch it"


# ----------------------------------------------------------------------------- op names stay in their stem files

SCANNED = ("harness", "cases", "reports", "reference", "fused")  # + noxfile.py
# files that name ops by design: the op list itself, and a vendor's adapter (a plugin implements named
# ops, as an entry point does) with the ledger of its known failures
OP_NAMING_FILES = {"harness/ops/__init__.py", "harness/adapters/sglang.py", "cases/ledgers/sglang.py"}


def _py_files():
    yield ROOT / "noxfile.py"
    for top in SCANNED:
        yield from sorted((ROOT / top).rglob("*.py"))


def _names_op(text: str, op: str) -> bool:
    """``text`` (a string constant, or a constant part of an f-string) is the op's name, an id built
    on it (``op/impl``, ``op:case``) or a module path ending in it (``fused.op``); prose (any
    whitespace) never is."""
    return re.fullmatch(rf"(?:[\w.]*\.)?{re.escape(op)}(?:[/:.]\S*)?", text) is not None


def op_literals(ops) -> set[tuple[str, str]]:
    """(file relative to the root, op) for every string constant naming a registered op outside
    that op's stem files (files whose name stem is the op)."""
    found = set()
    for f in _py_files():
        rel = f.relative_to(ROOT).as_posix()
        if rel in OP_NAMING_FILES:
            continue
        for node in ast.walk(ast.parse(f.read_text(), filename=rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):  # f-string parts are Constants too
                found |= {(rel, op) for op in ops if op != f.stem and _names_op(node.value, op)}
    return found


def test_no_op_name_outside_its_stem_files(registry):
    """Shared modules loop over the registry (``OpSpec`` fields, ``Registry.by_role``) and never
    spell an op's name: adding an op touches only its own files and ``harness.ops.BUILTIN``."""
    found = sorted(op_literals(registry.ops))
    assert not found, ("op names in shared modules (put what they say in the op's OpSpec in harness/ops/<op>.py, "
                       f"or in a file of the op's stem): {found}")


def test_op_literal_scan_sees_plain_and_fstring_names():
    tree = "x = 'qk_norm_rope'\ny = f'qk_norm_rope/{n}'\nz = 'fused.qk_norm_rope.wrapper'\nw = 'qk_norm_rope is an op'\n"
    hits = [n.value for n in ast.walk(ast.parse(tree)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and _names_op(n.value, "qk_norm_rope")]
    assert sorted(hits) == ["fused.qk_norm_rope.wrapper", "qk_norm_rope", "qk_norm_rope/"]


# ----------------------------------------------------------------------------- module size

MAX_MODULE_LINES = 330  # one job per module: harness/ modules of 100-300 lines, a kernel split off past ~300
# modules still over the limit, each with the reason it is not split yet. It may only shrink: an entry
# back under the limit fails too (remove it).
LONG_MODULES: dict[str, str] = {}  # none left


def long_modules(limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """(file relative to the root) -> its line count, for every module of ``SCANNED`` over ``limit`` lines."""
    return {rel: n for top in SCANNED for f in sorted((ROOT / top).rglob("*.py"))
            if (n := len(f.read_text().splitlines())) > limit and (rel := f.relative_to(ROOT).as_posix())}


def test_modules_stay_short():
    """Every module of harness/, cases/, reference/, fused/ and reports/ is at most ``MAX_MODULE_LINES``
    lines, save the ``LONG_MODULES`` (each with its reason)."""
    found = long_modules()
    new = {f: n for f, n in found.items() if f not in LONG_MODULES}
    assert not new, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {new}"
    paid = sorted(set(LONG_MODULES) - set(found))
    assert not paid, f"no longer over {MAX_MODULE_LINES} lines: remove from LONG_MODULES {paid}"


# ----------------------------------------------------------------------------- imports between the packages

# what reference/ and fused/ may take from harness/ (they import nothing else of it, nor of cases/ or reports/)
DEVICE_HELPERS = {"harness.devices": {"prepare_triton", "kernel_arch"}}


def _modules() -> dict[str, Path]:
    mods = {}
    for top in SCANNED:
        for f in (ROOT / top).rglob("*.py"):
            rel = f.relative_to(ROOT).with_suffix("")
            mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = f
    return mods


def _type_checking_only(tree) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (annotations only: never imported at run time)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def import_edges(mods: dict[str, Path]) -> dict[str, dict[str, set[str]]]:
    """module -> {imported module of the scanned packages: names taken from it ('' for the module
    itself)}: module-level and function-level imports alike, relative ones resolved."""
    def owner(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, dict[str, set[str]]] = {m: {} for m in mods}
    for m, f in mods.items():
        tree = ast.parse(f.read_text())
        skip = _type_checking_only(tree)
        pkg = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            pairs = []
            if isinstance(node, ast.Import):
                pairs = [(a.name, "") for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                pairs = [(f"{base}.{a.name}", "") if f"{base}.{a.name}" in mods else (base, a.name) for a in node.names]
            for target, name in pairs:
                t = owner(target)
                if t and t != m:
                    edges[m].setdefault(t, set()).add(name)
    return edges


def cross_package_cycles(edges) -> list[list[str]]:
    """Strongly connected components of the import graph that span more than one package."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len({c.split(".")[0] for c in comp}) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_packages():
    """Imports between harness/, cases/, reference/, fused/ and reports/ form no cycle (data flows
    cases -> inputs -> implementations -> records -> reports), counting imports inside functions."""
    edges = import_edges(_modules())
    cycles = cross_package_cycles(edges)
    detail = [[f"{a} -> {b}" for a in c for b in edges[a] if b in c and a.split(".")[0] != b.split(".")[0]]
              for c in cycles]
    assert not cycles, f"import cycles across packages (the cross-package edges of each): {detail}"


def test_kernels_and_chains_import_only_the_device_helpers():
    """reference/ and fused/ stand alone: from harness/ only ``DEVICE_HELPERS``, nothing of cases/ or reports/."""
    bad = []
    for m, targets in import_edges(_modules()).items():
        if m.split(".")[0] not in ("reference", "fused"):
            continue
        for t, names in targets.items():
            top = t.split(".")[0]
            if top in ("cases", "reports") or (top == "harness" and not names <= DEVICE_HELPERS.get(t, set())):
                bad.append(f"{m} imports {t} {sorted(names)}")
    assert not bad, bad


def test_cycle_finder_sees_a_function_level_cycle():
    edges = {"harness.a": {"cases.b": {""}}, "cases.b": {"harness.a": {"f"}}, "reports.c": {"harness.a": {""}}}
    assert cross_package_cycles(edges) == [["cases.b", "harness.a"]]
