"""An op's declaration: one frozen ``OpSpec`` per op (``harness/ops/<op>.py``) with its outputs
(``OutputSpec``), the buffers it writes (``Effect``), its rows in the kill matrix (``KillPlan``) and
its GPU-only checks (``GpuPlan``). The shared machinery reads these fields and names no op."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness import tolerance


@dataclass(frozen=True)
class OutputSpec:
    name: str
    contract: str  # "numeric" (vs fp64 oracle, tolerance policy) or "exact" (bytes vs reference chain)
    when: Callable[[Any], bool] = lambda case: True  # is this output part of the contract for the case
    # exact outputs: (reported value, inputs after the call, writable buffers before it) -> the value compared
    # instead of the reported one (what the call did, where the output only says what it claims to have done);
    # computed on the buffers' device. Its docstring's first line explains a failing record.
    observed: Callable[[Any, Mapping, Mapping], Any] | None = None


@dataclass(frozen=True)
class Effect:
    """A buffer an op may write: rows ``rows`` must hold ``expected`` afterwards, all others keep their bytes."""
    buffer: str  # input name of the buffer
    rows: Any  # LongTensor of written row indices (may be empty)
    oracle_rows: Any  # oracle values for those rows (numeric) — or None for exact contracts
    contract: str = "numeric"
    # what the contract compares of the rows: None, the rows themselves; else a function of
    # ``buffer[rows]`` (on its device) returning the values a reader sees (a paged fp8 pool's token
    # records decoded), applied to the implementation's rows and the reference chain's alike
    view: Callable[[Any], Any] | None = None
    # (len(rows), n) bool, or None (whole rows): the bytes among the first n of each listed row that
    # the op writes; the other bytes of those rows must keep theirs (``untouched:``), as unlisted rows do
    written_bytes: Any = None


@dataclass(frozen=True)
class KillPlan:
    """The op's row set in the mutant kill matrix (``harness.mutants.killmatrix``)."""
    clean: tuple[str, ...]  # implementations that must pass every family (clean rows)
    cases: tuple[str, ...]  # catalog names: the fixed targeted parity subset, the same for every implementation
    timelines: tuple[str, ...] = ()  # ``family/name`` timelines of cases.timelines: the families that use the op


@dataclass(frozen=True)
class GpuPlan:
    """What ``harness.gpu.checks`` runs of the op and expects (``harness.gpu.runners`` docstring)."""
    cases: tuple[str, ...]  # catalog names for launches and graph: realistic verify batches
    full: str  # catalog name for the determinism rerun: the largest real shape of the catalog
    fused_launches: int  # device kernels of one fused call, by design
    # the reference chain's launch functions: names in reference/<op>.py, or ``module:name`` for one of
    # another module of the chain
    stages: tuple[str, ...]
    expected_stages: Callable[[Any, dict], int]  # calls of them in one reference call of (case, inputs)
    step: str  # the function of fused/<op>.py that takes ``gate_fn``
    reference_not_capturable: str = ""  # why the reference chain cannot be captured ("": it can)
    # inputs -> [(module, attribute, value)] patched while a call runs as a CUDA graph runs it, beyond
    # the generic ones (``harness.gpu.runners.capture_safe``); called outside capture
    capture_patches: Callable[[dict], list] = lambda inputs: []


# "prepare": a timeline family's prepare step; "attn": the attention of every family; "accept": the
# acceptance after every verify step (the n a timeline's backend rolls back to)
ROLES = ("", "prepare", "attn", "accept")


@dataclass(frozen=True)
class OpSpec:
    name: str
    case_type: type
    catalog: Callable[[], list]  # named cases
    strategy: Callable[[], Any]  # hypothesis strategy of cases
    build_inputs: Callable[[Any, Any], dict]  # (case, Device) -> kwargs for an implementation
    reference: Callable[..., Mapping]  # the unfused chain: kwargs -> outputs
    oracle: Callable[..., Mapping]  # fp64: kwargs -> outputs
    outputs: tuple[OutputSpec, ...]
    effects: Callable[[Any, dict, Mapping], list[Effect]]  # (case, inputs, oracle) -> buffers written
    writable: tuple[str, ...] = ()  # input buffers an implementation may write (canary-checked)
    out_args: tuple[str, ...] = ()  # caller-provided output arguments (poisoned with NaN in one run)
    inputs: tuple[str, ...] = ()  # every keyword build_inputs gives (Impl.may_write is checked against it)
    doc: str = ""
    # Under the Triton interpreter a profile's generated-case count is capped here for ops whose
    # kernels cost seconds per launch there; compiled devices always run the full count.
    interpreter_generated: int | None = None
    # precision class name (harness.tolerance.PRECISION_CLASSES) -> keyword arguments that make
    # ``reference`` emulate that rounding; an Impl may declare only the roundings listed here
    roundings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # free choices of the chain (its split partition) that change how much an emulated rounding
    # costs: the rounded chain runs once per entry (keyword overrides; {} = the case as built) and
    # the allowance is the largest of their errors, since a kernel's own choice is not known
    rounding_variants: tuple[Mapping[str, Any], ...] = ({},)
    # --- what the shared machinery needs about the op (it loops over the registry, naming no op)
    # output or written buffer name -> its tolerance, replacing the dtype's floor (harness.tolerance)
    tolerances: Mapping[str, tolerance.Tolerance] = field(default_factory=dict)
    role: str = ""  # ROLES: the op's place in the timeline / end-to-end models, looked up by role
    kill: KillPlan | None = None  # its rows in the kill matrix (None: none)
    gpu: GpuPlan | None = None  # its GPU-only checks (None: none)
    nightly: bool = True  # the nightly runs its parity step
    # nightly parity workers relative to the other ops (their cost per case: implementations, checks);
    # < 1 for an op cheaper per case (harness.nightly.run.parity_jobs)
    parity_weight: float = 1
    # relative cost of running one case (any unit, e.g. the elements it reads), for scheduling only:
    # the suite hands the costliest cases to its workers first, so that a long case does not start last
    # and leave the others idle; None: plan order (``cases/<op>.py::case_cost`` when it has one)
    case_cost: Callable[[Any], float] | None = None
    bench: str = ""  # module of its benchmark (harness.bench.perf's per-op API); "": none
    # role "prepare": zero-argument factory of its harness.timelines.runner.Prepare adapter (harness/prepares/<op>.py)
    timeline: Callable[[], Any] | None = None

    def tolerance(self, output: str, dtype) -> tolerance.Tolerance:
        """The tolerance of ``output`` (an output or written buffer) in ``dtype``: its override in
        ``tolerances``, else the dtype's floor (``harness.tolerance``)."""
        if output in self.tolerances:
            return self.tolerances[output]
        return tolerance.floor(self.name, output, dtype)
