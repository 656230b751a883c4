"""Every op's ``compile_specs()`` agrees with its kernels: each entry's signature is the kernel's
runtime arguments in order and its constexprs exactly the kernel's constexpr arguments (a stale
entry fails only on a compile run, far from the change, or compiles another variant than the
wrapper launches). ``fused.compile_specs`` derives both from the kernel and refuses what it cannot."""
from __future__ import annotations

import importlib

import pytest

from fused import compile_specs as cs
from harness.ops import BUILTIN


@pytest.mark.parametrize("op", BUILTIN)
def test_compile_specs_match_their_kernels(op):
    """Planted: an argument added to verify_accept's kernel while its entries were written by hand fails."""
    specs = importlib.import_module(f"fused.{op}.wrapper").compile_specs()
    assert specs
    for name, kernel, sig, const, _warps, *_targets in specs:
        assert list(sig) == cs.runtime_args(kernel), name
        assert sorted(const) == sorted(cs.constexpr_args(kernel)), name


def _kernel(out_ptr, x_ptr, n, scale, BLOCK: "tl.constexpr", HAS_X: "tl.constexpr"):  # noqa: F821 (a stand-in)
    pass


def test_signature_types_every_runtime_argument_in_order():
    assert cs.signature(_kernel, {"out_ptr": "*fp32", "x_ptr": "*bf16", "scale": "fp32"}) == {
        "out_ptr": "*fp32", "x_ptr": "*bf16", "n": "i32", "scale": "fp32"}
    assert cs.constexpr_args(_kernel) == ["BLOCK", "HAS_X"]


@pytest.mark.parametrize("types,what", [({"out_ptr": "*fp32"}, "x_ptr"),  # a pointer left untyped
                                        ({"out_ptr": "*fp32", "x_ptr": "*bf16", "y_ptr": "*bf16"}, "y_ptr"),
                                        ({"out_ptr": "*fp32", "x_ptr": "*bf16", "BLOCK": "i32"}, "BLOCK")])
def test_signature_refuses_what_it_cannot_derive(types, what):
    with pytest.raises(TypeError, match=what):
        cs.signature(_kernel, types)


@pytest.mark.parametrize("const,what", [({"BLOCK": 64}, "HAS_X"), ({"BLOCK": 64, "HAS_X": True, "OTHER": 1}, "OTHER")])
def test_variant_takes_exactly_the_kernels_constexprs(const, what):
    with pytest.raises(TypeError, match=what):
        cs.variant("x", _kernel, {"out_ptr": "*fp32", "x_ptr": "*bf16"}, const, 4)
    entry = cs.variant("b64", _kernel, {"out_ptr": "*fp32", "x_ptr": "*bf16"}, {"HAS_X": True, "BLOCK": 64}, 4,
                       ("sm90",))
    assert entry[0] == "_kernel[b64]" and list(entry[3]) == ["BLOCK", "HAS_X"] and entry[5] == ("sm90",)
