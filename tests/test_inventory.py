"""Every op has its four homes under one name stem, every implementation is well formed, shared
modules name no op (they loop over the registry), and the packages import each other without cycles."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from harness.ops import BUILTIN

ROOT = Path(__file__).resolve().parents[1]


HOMES = ("reference/{op}", "fused/{op}", "cases/{op}")  # + tests/test_{op}*.py
MAX_HARNESS_TOP_MODULES = 20  # harness/'s public core; everything else lives in a wing (a subpackage)


@pytest.mark.parametrize("op", BUILTIN)
def test_four_homes(op, registry):
    """An op lives in ``reference/<op>/`` (its chain), ``fused/<op>/`` (its wrapper), ``cases/<op>/``
    (its spec and catalog) and its tests, and is registered with a reference and a fused implementation."""
    for piece in (f"reference/{op}/chain.py", f"fused/{op}/wrapper.py", f"cases/{op}/spec.py", f"cases/{op}/catalog.py"):
        assert (ROOT / piece).is_file(), f"{op}: missing {piece}"
    assert list(ROOT.glob(f"tests/test_{op}*.py")), f"{op}: no tests/test_{op}*.py"
    assert op in registry.ops, f"{op}: no registry entry"
    kinds = {i.kind for i in registry.for_op(op)}
    assert {"reference", "fused"} <= kinds, f"{op}: implementations {kinds}"


def op_files(op: str) -> list[str]:
    """Every file of the scanned packages named after ``op`` (a module or a package of its name
    stem, or a module ``<op>_<part>.py``), relative to the root."""
    found = []
    for top in SCANNED:
        for f in (ROOT / top).rglob("*"):
            rel = f.relative_to(ROOT)
            if any(part == op or part.startswith(f"{op}_") or part in (f"{op}.py",) for part in rel.parts) \
                    and f.suffix == ".py":
                found.append(rel.as_posix())
    return sorted(found)


@pytest.mark.parametrize("op", BUILTIN)
def test_an_op_lives_in_its_homes_only(op):
    """No file named after the op outside its three package homes (its tests aside)."""
    homes = tuple(h.format(op=op) + "/" for h in HOMES)
    stray = [f for f in op_files(op) if not f.startswith(homes)]
    assert not stray, f"{op}: files outside {homes}: {stray}"


def test_harness_top_level_is_a_small_core():
    """``harness/``'s top level holds at most ``MAX_HARNESS_TOP_MODULES`` modules; a command or a wing
    is a subpackage."""
    top = sorted(f.name for f in (ROOT / "harness").glob("*.py"))
    assert len(top) <= MAX_HARNESS_TOP_MODULES, top


def test_no_stray_op_packages(registry):
    """A package of reference/, fused/ or cases/ named like no registered op is an op nobody checks."""
    for folder in ("reference", "fused", "cases"):
        for d in (ROOT / folder).iterdir():
            if (d / "__init__.py").is_file() and d.name not in ("mutants", "ledgers"):
                assert d.name in registry.ops, f"{folder}/{d.name} has no registry entry (harness.ops.BUILTIN)"


def test_reference_never_imports_triton():
    for f in (ROOT / "reference").rglob("*.py"):
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
OP_NAMING_FILES = {"harness/ops.py", "harness/adapters/sglang.py", "harness/adapters/sglang_jit.py",
                   "cases/ledgers/sglang.py", "harness/adapters/vllm.py", "cases/ledgers/vllm.py"}  # engine adapters map onto named ops


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
    that op's own files (in a folder of the op's name, or a module whose name stem is the op)."""
    found = set()
    for f in _py_files():
        rel = f.relative_to(ROOT).as_posix()
        if rel in OP_NAMING_FILES:
            continue
        for node in ast.walk(ast.parse(f.read_text(), filename=rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):  # f-string parts are Constants too
                found |= {(rel, op) for op in ops if op != f.stem and op not in f.relative_to(ROOT).parts
                          and _names_op(node.value, op)}
    return found


def test_no_op_name_outside_its_stem_files(registry):
    """Shared modules loop over the registry (``OpSpec`` fields, ``Registry.by_role``) and never
    spell an op's name: adding an op touches only its own files and ``harness.ops.BUILTIN``."""
    found = sorted(op_literals(registry.ops))
    assert not found, ("op names in shared modules (put what they say in the op's OpSpec in cases/<op>/spec.py, "
                       f"or in a file of the op's stem): {found}")


def test_op_literal_scan_sees_plain_and_fstring_names():
    tree = "x = 'qk_norm_rope'\ny = f'qk_norm_rope/{n}'\nz = 'fused.qk_norm_rope.wrapper'\nw = 'qk_norm_rope is an op'\n"
    hits = [n.value for n in ast.walk(ast.parse(tree)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and _names_op(n.value, "qk_norm_rope")]
    assert sorted(hits) == ["fused.qk_norm_rope.wrapper", "qk_norm_rope", "qk_norm_rope/"]


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


def _test_modules() -> dict[str, Path]:
    """The tests, by module name (``tests.test_x``): readers of the scanned modules."""
    return {f"tests.{f.stem}": f for f in (ROOT / "tests").rglob("*.py") if f.parent == ROOT / "tests"}


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


# ----------------------------------------------------------------------------- the layout rules

def _module_level_bindings(tree) -> tuple[set[str], set[str]]:
    """(names a module defines: def, class, assignment, for/with targets, at module level or under a
    module-level if/try; names it binds by importing them)."""
    defined, imported = set(), set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    imported.add(a.asname or a.name.split(".")[0])
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
                targets = (node.targets if isinstance(node, ast.Assign) else
                           [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)) else
                           [i.optional_vars for i in node.items if i.optional_vars])
                for t in targets:
                    defined.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            if isinstance(node, (ast.If, ast.Try, ast.For, ast.While, ast.With)):
                for part in ("body", "orelse", "finalbody"):
                    visit(getattr(node, part, []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
    visit(tree.body)
    return defined, imported - defined


def _declared_all(tree) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_aliases(tree, m: str, mods: dict[str, Path]) -> dict[str, str]:
    """local name -> scanned module it is bound to (``import a.b as x``, ``from a import b``)."""
    pkg = m if mods[m].name == "__init__.py" else m.rpartition(".")[0]
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in mods:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                if f"{base}.{a.name}" in mods:
                    out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def house_violations(mods: dict[str, Path], readers: dict[str, Path] | None = None) -> dict[str, list[str]]:
    """The layout rules over ``mods`` (module -> file): ``private`` (a ``_name`` of one module
    used in another: imported from it, or read as ``module._name``), ``reexport`` (a name imported
    from a module that only imports it itself; a package ``__init__`` may re-export what its
    ``__all__`` declares) and ``cycle`` (modules that import each other, directly or round a loop,
    imports inside functions included). ``readers`` (the tests): modules whose use of a re-exported
    name counts too (a façade kept for its tests is a façade)."""
    everything = {**mods, **(readers or {})}
    trees = {m: ast.parse(f.read_text()) for m, f in everything.items()}
    binds = {m: _module_level_bindings(trees[m]) for m in mods}
    edges = import_edges(everything)
    out: dict[str, list[str]] = {"private": [], "reexport": [], "cycle": [], "patch": []}

    def reexported(t: str, n: str) -> bool:
        return (t in mods and n in binds[t][1]
                and not (mods[t].name == "__init__.py" and n in _declared_all(trees[t])))

    for m, targets in edges.items():
        for t, names in targets.items():
            for n in sorted(names - {""}):
                if _is_private(n) and m in mods:
                    out["private"].append(f"{m} imports {t}.{n}")
                if reexported(t, n):
                    out["reexport"].append(f"{m} imports {n} from {t}, which only imports it")
        aliases = _module_aliases(trees[m], m, everything)
        for node in ast.walk(trees[m]):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and aliases[node.value.id] != m):
                continue
            t = aliases[node.value.id]
            if _is_private(node.attr) and m in mods:
                out["private"].append(f"{m} reads {t}.{node.attr}")
            if reexported(t, node.attr):
                out["reexport"].append(f"{m} reads {t}.{node.attr}, which {t} only imports")
    for m in mods:
        out["patch"] += module_patches(m, trees[m], _module_aliases(trees[m], m, everything))
    out["private"] += private_attributes({m: trees[m] for m in mods})
    out["private"] = sorted(set(out["private"]))
    out["reexport"] = sorted(set(out["reexport"]))
    out["cycle"] = [" <-> ".join(c) for c in import_cycles({m: {t: n for t, n in e.items() if t in mods}
                                                            for m, e in edges.items() if m in mods})]
    return out


# tools that swap module attributes on purpose, each for a reason of its own (not a call path of the harness)
PATCH_TOOLS = {
    "harness.bench.before": "imports an earlier tree's fused module in place of ours (the --before comparison)",
    "harness.bench.wrapper_checks": "stubs the validators to time a wrapper without them (an ablation)",
    "harness.shim": "patches Triton's interpreter (a third-party module) so a kernel computes on the CPU as compiled "
                    "Triton does",
}


def module_patches(m: str, tree: ast.Module, aliases: dict[str, str]) -> list[str]:
    """Where module ``m`` rebinds names of other objects at run time: a ``setattr`` call, an assignment to
    an attribute of an imported module, ``unittest.mock`` (``PATCH_TOOLS`` aside)."""
    if m in PATCH_TOOLS:
        return []
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr":
            out.append(f"{m}:{n.lineno} calls {ast.unparse(n)}")
        elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
              and n.value.id in aliases):
            out.append(f"{m}:{n.lineno} assigns {ast.unparse(n)}")
        elif isinstance(n, (ast.Import, ast.ImportFrom)) and any(
                "unittest.mock" in f"{getattr(n, 'module', '') or ''}.{a.name}" for a in n.names):
            out.append(f"{m}:{n.lineno} imports unittest.mock")
    return out


def private_attributes(trees: dict[str, ast.Module]) -> list[str]:
    """``obj._name`` read in one module (``obj`` not ``self`` / ``cls``) where ``_name`` is a method,
    class or attribute that only other modules define: another module's private member."""
    defined: dict[str, set[str]] = {}
    for m, tree in trees.items():
        for n in ast.walk(tree):
            names = []
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [n.name]
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                names = [n.attr]
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names = [n.id]
            for name in names:
                if _is_private(name):
                    defined.setdefault(name, set()).add(m)
    out = []
    for m, tree in trees.items():
        for n in ast.walk(tree):
            if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and _is_private(n.attr)
                    and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
                    and n.attr in defined and m not in defined[n.attr]):
                out.append(f"{m} reads {ast.unparse(n)} ({n.attr} of {', '.join(sorted(defined[n.attr]))})")
    return out


def import_cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one module in the import graph."""
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


@functools.cache
def _house_violations_of_the_repo() -> dict[str, list[str]]:
    """``house_violations`` of the repository, made once per process: it finds every rule's breaches in one pass
    (~7 s on the 2-core machine), and each rule is a test of its own."""
    return house_violations(_modules(), _test_modules())


@pytest.mark.parametrize("rule", ["private", "reexport", "cycle", "patch"])
def test_house_rules(rule):
    """No ``_name`` used outside the module that defines it, no module re-exporting another's names,
    no import cycle (function-level imports included), no module rebinding another's names at run time
    (a switch is a context variable of the module that reads it, a recorder a hook it calls), over
    harness/, cases/, reference/, fused/ and reports/ (``house_violations``)."""
    found = _house_violations_of_the_repo()[rule]
    assert not found, f"{rule}: {len(found)}\n" + "\n".join(found)


@pytest.mark.parametrize("rule,plant", [
    ("private", {"a": "def _helper():\n    pass\n", "b": "from pkg.a import _helper\n"}),
    ("private", {"a": "def _helper():\n    pass\n", "b": "from pkg import a\n\ndef f():\n    return a._helper()\n"}),
    ("private", {"a": "class Run:\n    def _rec(self):\n        pass\n", "b": "def f(run):\n    run._rec()\n"}),
    ("reexport", {"a": "def helper():\n    pass\n", "b": "from pkg.a import helper\n", "c": "from pkg.b import helper\n"}),
    ("cycle", {"a": "import pkg.b\n", "b": "def f():\n    from pkg import a\n"}),
    ("patch", {"a": "X = 1\n", "b": "from pkg import a\n\n\ndef f():\n    a.X = 2\n"}),
    ("patch", {"a": "X = 1\n", "b": "def f(mods):\n    for mod, name, value in mods:\n        setattr(mod, name, value)\n"}),
    ("patch", {"a": "X = 1\n", "b": "from unittest import mock\n"}),
])
def test_house_rules_bite(tmp_path, rule, plant):
    """Each rule flags its planted breach (a private reach, a re-export, a function-level cycle, a module
    attribute rebound), and the same modules without the breach are clean."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    mods = {"pkg": tmp_path / "pkg" / "__init__.py"}
    for name, text in plant.items():
        (tmp_path / "pkg" / f"{name}.py").write_text(text)
        mods[f"pkg.{name}"] = tmp_path / "pkg" / f"{name}.py"
    assert house_violations(mods)[rule]
    assert not any(v for r, v in house_violations(mods).items() if r != rule)


def test_a_package_may_declare_its_api():
    """A package ``__init__`` re-exporting what its ``__all__`` declares is the plugin API, not a façade."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "pkg"
        root.mkdir()
        (root / "a.py").write_text("def helper():\n    pass\n")
        (root / "__init__.py").write_text("from pkg.a import helper\n\n__all__ = ['helper']\n")
        (root / "b.py").write_text("from pkg import helper\n")
        mods = {"pkg": root / "__init__.py", "pkg.a": root / "a.py", "pkg.b": root / "b.py"}
        assert not house_violations(mods)["reexport"]
