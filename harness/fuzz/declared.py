"""What each op's ``cases/<op>/bad_inputs.py`` declares: the arguments of its public call
(``Arg``) and its public entry points (``Target``); ``args`` and ``targets`` collect them per op."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


@dataclass(frozen=True)
class Arg:
    """One argument of an op's public call, as the classes see it."""
    name: str
    # data (read-only activations / KV pools) | param (weights) | table (cos, sin) | buffer (written pool)
    # | out (caller-provided output) | index (read indices) | slots (write slots, negative = padding)
    # | map (slot_map) | indptr | tree (a draft tree's pointers or row permutation: -1 is legal, an entry
    # is not changed alone; the layout classes apply, the range classes do not) | float | int | bool | enum
    kind: str
    layout: str = ""  # tensors: rows (unit innermost stride, any row strides) | contiguous | any
    needs: tuple[tuple[str, Any], ...] = ()  # case fields under which the call passes and reads it


@dataclass(frozen=True)
class Target:
    """A public function and how it is called with the op's step keyword arguments."""
    name: str  # "module:attr"; a plant is "module:attr@<the target it is called like>"
    op: str
    kind: str  # reference | fused | external (harness.registry.KINDS)
    ref: str  # the target whose answer on the legal input is this one's contract
    call: str = "kwargs"  # kwargs (the step's keyword arguments) | qk-bare | mla-bare
    limit: str = ""  # its declared coverage ("" = every legal input): split_kv | shared_kv (verify kernels) | mla

    @property
    def fn_path(self) -> str:
        return self.name.split("@", 1)[0]

    @property
    def outputs(self) -> tuple[str, ...]:
        return {"qk-bare": ("q_out", "kv_out"), "mla-bare": ("q8",)}.get(self.call, ())

    def forwards(self, name: str) -> bool:
        """Does a step argument reach the function (under its own name, ``rename``)?"""
        if self.call == "qk-bare":
            return name != "forward_mode"
        if self.call == "mla-bare":
            return name in ("q_nope", "q_rope", "k_nope", "k_rope", "kv_buffer", "decode_kernel_loc", "kv_descale",
                            "fp8_policy")
        return True

    def rename(self, name: str) -> str:
        return "loc" if self.call == "mla-bare" and name == "decode_kernel_loc" else name

    def applies(self, case) -> bool:
        if self.call == "mla-bare":  # it writes rows, at the physical rows of the capture loc
            return case.capture_loc and case.save_kv_cache
        return True


DECODE = (("mode", "decode"),)  # Arg.needs: read in decode only
