"""Bad inputs for every op's public entry points: hypothesis strategies that take a valid case and
break it one way at a time, a worker subprocess that makes each call, and the report.

Entry points (``TARGETS``), each called the way the runners call it (the op's step keyword
arguments, ``cases/<op>/catalog.py::build_inputs``):
  qk_norm_rope      reference.qk_norm_rope.chain:{qk_norm_rope_step, qk_norm_rope}, fused.qk_norm_rope.wrapper: the same
  mla_fp8_prepare   reference.mla_fp8_prepare.chain:{mla_fp8_prepare_step, mla_fp8_prepare}, fused: the same
  verify_attention  reference.verify_attention.chain:verify_attention, reference.verify_attention.sdpa: the same,
                    fused.verify_attention.wrapper:{verify_attention, verify_split_kv, verify_shared_kv}
  verify_accept     reference.verify_accept.chain:verify_accept, fused.verify_accept.wrapper:verify_accept
The launch-level helpers (``q_norm_rope``, ``cast_fp8``, ``prefix_split_partials`` ...), the oracles
and the pure gates take arguments their entry point has validated: they are not called here.

A class (``CLASSES``, named ``<group>-<what>``) breaks one argument (or, for ``*`` classes, the
whole call) in one way, and states the one outcome it must have, per op:
  error   a typed error (``reference.checks.VerifyParityInputError``, of the class's subclass
          where it names one) whose message names the broken argument (and the bad value where
          the class says so), with every argument's bytes unchanged;
  answer  the answer of the op's reference chain on the legal equivalent input (``canon``; the
          input itself where the value is legal), by the harness's own checks
          (``harness.parity.records.check_outputs``: exact bytes, or finite + numeric against the fp64
          oracle with the chain's error as allowance; written rows and untouched rows), with no
          byte of a read-only argument, or outside a writable view, changed.
The expectation is the class's, never the implementation's: the reference and the fused entry
points of an op get the same one, so they must agree on what is legal. Only a kernel wrapper with
declared limits (``verify_split_kv`` / ``verify_shared_kv``: its ``can_handle`` and topk == 1;
fused ``mla_fp8_prepare``: ``covered`` and the device's fp8 formats) may refuse a legal input it
does not cover, with a typed error: that is its answer there.

The contract the classes hold the ops to, where the code left a choice: index tensors and tree
masks contiguous (a kernel reads them as ``ptr + i``; kv_indices always had to be); flags bools
(or ``numpy.bool_``), never a str or an int; integer knobs ints (or numpy integers), never a bool
or a float; float scalars real numbers (ints and numpy floats included), never a bool, str or
tensor, with a normal fp32 value; num_kv_splits bounded (10**4 is refused); meta tensors refused
with a DeviceError; no tokens (T = 0) legal where the op has no per-request structure (qk, mla).

Outcomes of one call (``OUTCOMES``): typed-error and correct are the good ones; crash (any
other exception), segfault (the worker died, or a CUDA fault), hang (past ``--timeout``), wrong
(a different answer, an answer where an error is due, or a write into a read-only argument),
partial-write (a rejected call changed bytes), refused (a typed error where an answer is due),
misnamed (a typed error not naming the argument or the value, or of another subclass).

Every call runs in a worker subprocess (``Worker``: one long-lived process, restarted after a
crash or a hang), so a segfault is a result, not a dead run. A failure prints one line that
reproduces it as printed.

    python -m harness.fuzz [--device cpu|cuda] [--classes NAME|GROUP ...] [--ops ...] [--examples N]
    python -m harness.fuzz --list

Layout: each op declares what the fuzzer needs of it in ``cases/<op>/bad_inputs.py`` (its arguments
``ARGS``, entry points ``TARGETS``, small valid cases, and the op's own steps of some classes), of the
types in ``harness.fuzz.declared`` (``Arg``, ``Target``). The shared machinery is in this package:
``args`` (each op's arguments, from those modules), ``targets`` (entry points, their limits, the valid
cases), ``surgery`` (views with junk in their storage, byte snapshots), ``badclass`` (``BadClass`` and
the helpers the classes share) and the three families ``classes_layout`` / ``classes_values`` /
``classes_call``, ``strategies`` (every class, the plan), ``call`` (one call, classified), ``runner``
(the worker subprocess and the pool), ``cli`` (the report and the command line; ``__main__`` runs
it). This package re-exports nothing: import each name from its module.
"""
