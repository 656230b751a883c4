"""Every op has its five pieces under one name stem, and every implementation is well formed."""
from __future__ import annotations

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
    """A reference/fused module without a registry entry is an op nobody checks."""
    for folder in ("reference", "fused"):
        for f in (ROOT / folder).glob("*.py"):
            if f.stem.startswith("_") or f.stem in ("checks", "kv_model"):  # shared models, not ops
                continue
            assert f.stem in registry.ops, f"{folder}/{f.name} has no registry entry in harness/ops"


def test_reference_never_imports_triton():
    for f in (ROOT / "reference").glob("*.py"):
        assert "triton" not in f.read_text(), f"{f.name}: reference/ must stay pure PyTorch"


def test_mutants_are_documented(registry):
    mutants = [i for i in registry.impls.values() if i.kind == "mutant"]
    assert mutants
    for m in mutants:
        assert m.doc and m.catches, f"{m.key}: a mutant names its bug class and the checks that catch it"
