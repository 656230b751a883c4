"""The fused kernels that stream a vocabulary row load it in 16-byte vectors when the sizes allow it.

A size or stride in a kernel's ``do_not_specialize`` is one the compiler cannot prove a multiple of
16: the row's addresses and masks are then unaligned for all it knows, and sm90 code loads one bf16
(2 bytes) or fp32 (4 bytes) at a time. Verify_accept's launch 1 was such a kernel at B 64 x V 160K
(16 `ld.global.b16` per tile); ``python -m harness compile`` shows the loads of every variant as the
JIT compiles an aligned launch (``harness.gpu.compile.aligned_attrs``, ``load_widths``)."""
from __future__ import annotations

import re

import pytest

from harness.gpu import compile as cc
from tests.helpers import harness_cli, subprocess_env

# (op, kernel-name prefix): the kernels whose main loop streams (N, V) logits rows
ROW_KERNELS = (("verify_accept", "verify_accept_partial_kernel"), ("verify_tree_accept", "verify_tree_accept_kernel"),
               ("spec_sampling", "spec_sampling_kernel"))

PTX = """
    ld.global.b16 { %rs1 }, [ %rd1 + 0 ];
    ld.global.nc.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd2 + 0 ];
    ld.global.L1::evict_last.v2.b64 { %rd5, %rd6 }, [ %rd3 + 0 ];
    ld.global.b32 { %r9 }, [ %rd4 + 0 ];
    ld.shared.v4.b32 { %r5, %r6, %r7, %r8 }, [ %r10 + 0 ];
    cp.async.cg.shared.global [ %r25 + 0 ], [ %rd11 + 0 ], 0x10, %r26;
    cp.async.ca.shared.global [ %r27 + 0 ], [ %rd12 + 0 ], 8;
    cp.async.commit_group;
    st.global.b32 [ %rd4 + 0 ], { %r9 };
"""


def test_load_widths_reads_each_global_load_form():
    assert cc.load_widths(PTX) == {2: 1, 16: 3, 4: 1, 8: 1}


def test_aligned_attrs_leave_do_not_specialize_out():
    class Kernel:  # what aligned_attrs reads of a JITFunction
        do_not_specialize = ("n", 3)

    sig = {"x_ptr": "*bf16", "n": "i32", "v": "i32", "s": "i64", "scale": "fp32"}
    assert cc.aligned_attrs(Kernel, sig) == {(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}

    class WithConstexpr:  # a JITFunction's positions count every argument, constexprs included
        arg_names = ["x_ptr", "BLOCK", "n", "v"]
        do_not_specialize = (2,)

    assert cc.aligned_attrs(WithConstexpr, {"x_ptr": "*fp32", "n": "i32", "v": "i32"}) == {
        (0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}


@pytest.mark.long
def test_row_kernels_load_16_byte_vectors_on_sm90():
    env = {k: v for k, v in subprocess_env().items() if k != "TRITON_INTERPRET"}
    ops = sorted({op for op, _ in ROW_KERNELS})
    r = harness_cli(["compile", "--target", "sm90", *[a for op in ops for a in ("--op", op)]], env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = [line.split() for line in r.stdout.splitlines()]
    for op, kernel in ROW_KERNELS:
        mine = [line for line in rows if len(line) > 3 and line[0] == op and line[2].startswith(kernel + "[")]
        assert mine, f"no {kernel} variant in:\n{r.stdout[-3000:]}"
        for line in mine:
            loads = " ".join(line[line.index("bytes") + 1:])
            widths = {int(b) for b in re.findall(r"(\d+)B x", loads)}
            assert 16 in widths and 2 not in widths, f"{op} {line[2]}: loads {loads}"
