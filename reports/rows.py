"""Row dataclasses: field order is column order; provenance rides on every row."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import operator
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a frame is made: the processes that only make rows (parity workers, `list`)
    import pandas as pd  # do not pay pandas' (and pyarrow's) ~0.4 s import

# Row statuses that fail a run: ``timeout`` is a case (or timeline) that gave no result within its
# time limit (``--case-timeout-s``; its worker was killed): never a pass, never a slow pass.
FAILING = ("fail", "timeout")


def failing(status: pd.Series) -> pd.Series:
    """True where a row's status fails the run (``FAILING``)."""
    return status.isin(FAILING)


@dataclass(frozen=True)
class Provenance:
    git_sha: str
    device: str
    arch: str
    fp8_format: str
    torch: str
    triton: str
    shim: str  # interpreter conversion shim id, "" when compiled
    profile: str
    seed: int


def with_provenance(cls):
    """A row class: ``cls``'s own fields (a frozen dataclass), then Provenance's, as columns in
    that order; provenance is defined once, in ``Provenance``."""
    row = type(cls.__name__, (Provenance, cls), {"__doc__": cls.__doc__, "__module__": cls.__module__,
                                                   "__qualname__": cls.__qualname__})
    return dataclass(frozen=True)(row)


@with_provenance
@dataclass(frozen=True)
class ParityRow:
    op: str
    impl: str
    kind: str
    case: str  # display id (catalog name or encoded id)
    check: str
    status: str  # pass | fail | timeout | refused | known (a failure a ledger entry explains, harness.ledger)
    err: float  # scaled error (see harness.tolerance)
    ref_err: float
    allowed: float
    max_abs: float
    max_rel: float
    mismatch_frac: float
    nan_inf_mismatch: int
    worst: str
    detail: str
    seconds: float
    fp8_policy: str
    precision: str  # the implementation's declared precision class (harness.tolerance)
    nan_policy: str  # the NaN handling it is held to (harness.registry.nan_policy_of; "": the op has no choice)
    known: str  # the ledger entry that explains this row ("" when none)
    repro: str


def parity_row(record, *, status: str, known: str = "", **where) -> ParityRow:
    """The row of one check's record (a ``harness.compare.Record``): its check, measures, worst and
    detail copied as they are, with its ``status`` and ``known`` (the ledger entry that explains it);
    ``where``: the other columns (op, impl, kind, case, seconds, fp8_policy, precision, nan_policy, repro and the
    provenance's). Every ``ParityRow`` of a run is made here (``harness.parity.suite``)."""
    return ParityRow(check=record.check, status=status, err=record.err, ref_err=record.ref_err,
                     allowed=record.allowed, max_abs=record.max_abs, max_rel=record.max_rel,
                     mismatch_frac=record.mismatch_frac, nan_inf_mismatch=record.nan_inf_mismatch,
                     worst=record.worst, detail=record.detail, known=known, **where)


def git_sha(root: Path | None = None) -> str:
    """``HEAD`` (12 hex), and for a tree with uncommitted changes to tracked files ``+dirty.<8 hex>``:
    a hash of ``git diff HEAD``, so that two runs of different uncommitted code never share a sha
    (a copied working tree on a GPU runner whose ``.git`` is older still names its exact sources:
    that HEAD plus that diff)."""
    cwd = root or Path(__file__).parent
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10)
        sha = out.stdout.strip() or "unknown"
        diff = subprocess.run(["git", "diff", "HEAD", "--no-ext-diff", "--binary"], cwd=cwd, capture_output=True,
                              timeout=30).stdout
        return sha + (f"+dirty.{hashlib.sha256(diff).hexdigest()[:8]}" if diff.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def to_frame(rows: list, row_type: type = ParityRow) -> pd.DataFrame:
    """Rows -> frame in column order; no rows -> the empty frame of ``row_type``."""
    import pandas as pd

    if not rows:
        return pd.DataFrame(columns=[f.name for f in dataclasses.fields(row_type)])
    names = [f.name for f in dataclasses.fields(type(rows[0]))]
    # a row's fields are scalars: read them as they are. ``dataclasses.asdict`` deep-copies every value: 8.5 s
    # for one nightly step's 230K rows on the 2-core CI machine, against 1.35 s this way
    return pd.DataFrame.from_records([operator.attrgetter(*names)(r) for r in rows], columns=names)


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary file beside ``path`` to write to, renamed over ``path`` when the block ends (atomic
    on POSIX) and removed when it raises: a crash, a kill or a full disk mid-write leaves the previous
    file as it was, never a truncated one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


PARQUET_SUFFIX = ".parquet"
# Free-text columns: one value per row more often than not, so a dictionary of them saves nothing (Parquet
# still tries one per page); every other text column (provenance, ids, statuses, repro) is stored dictionary-
# encoded: a few thousand distinct values over a million rows.
FREE_TEXT = ("worst", "detail")


def is_parquet(path: str | Path) -> bool:
    """``path`` names a Parquet file (by its suffix, ``PARQUET_SUFFIX``); anything else is CSV (``.gz`` too)."""
    return str(path).endswith(PARQUET_SUFFIX)


def to_parquet(frame: pd.DataFrame, path: str | Path) -> None:
    """``frame`` as Parquet (zstd): its text columns but ``FREE_TEXT`` as pandas categoricals, so that
    Parquet keeps them dictionary-encoded (and ``pd.read_parquet`` gives them back as categoricals)."""
    import pandas as pd

    text = [c for c in frame.columns if c not in FREE_TEXT and not pd.api.types.is_numeric_dtype(frame[c])
            and not isinstance(frame[c].dtype, pd.CategoricalDtype)]
    frame.astype({c: "category" for c in text}).to_parquet(path, engine="pyarrow", compression="zstd", index=False)


def write_frame(frame: pd.DataFrame, path: str | Path) -> Path:
    """``frame`` at ``path``, all or nothing (``replacing``): Parquet when the name ends in ``.parquet``
    (``to_parquet``), else CSV (gzip-compressed when it ends in ``.gz``)."""
    with replacing(path) as tmp:
        if is_parquet(path):
            to_parquet(frame, tmp)
        else:
            frame.to_csv(tmp, index=False, compression="gzip" if str(path).endswith(".gz") else None)
    return Path(path)


def write_csv(rows: list, path: str | Path, row_type: type = ParityRow) -> Path:
    """Rows of ``row_type`` at ``path``: CSV, or Parquet for a ``.parquet`` name (``write_frame``: the previous file
    is replaced whole or kept)."""
    return write_frame(to_frame(rows, row_type), path)


@with_provenance
@dataclass(frozen=True)
class PerfRow:
    """One benchmarked (op, impl, shape). Times in microseconds; the ratios are the benchmark's
    own (reference or compiled p50 over this impl's p50 in the same ``mode``: > 1 means this impl is
    faster); NaN where a number was not measured."""
    op: str
    impl: str
    case: str  # shape id, e.g. "B=8,L=4,H=16"
    mode: str  # eager (do_bench, the host's launch path included) | graph (replayed from a CUDA graph: p50 only)
    p20_us: float
    p50_us: float
    p80_us: float
    reference_p50_us: float
    compiled_p50_us: float
    speedup_vs_reference: float
    speedup_vs_compiled: float
    gbps: float  # achieved bandwidth (bytes the op must move / p50)
    frac_of_copy: float  # gbps / measured device-to-device copy bandwidth
    launches: int


@with_provenance
@dataclass(frozen=True)
class GateRow:
    """One end-to-end gate verdict: a path under test vs the reference path on the same problems
    (``harness.e2e.gate`` for the micro-engine, ``harness.e2e.client`` for two servers)."""
    layout: str  # micro-model / target layout (server mode: the endpoint's model name)
    path: str  # path under test (server mode: endpoint label)
    expect: str  # pass | fail (a path mutant must fail the gate)
    model: str  # model file + sha, or "random-init"
    drafter: str
    extraction: str  # strict | flexible (lm-eval gsm8k filters)
    problems: int
    accuracy: float
    accuracy_lo: float  # 95 % Clopper-Pearson
    accuracy_hi: float
    ref_accuracy: float  # the reference path (server mode: the A endpoint) on the same problems
    exact_agreement: float  # fraction of problems whose output equals non-speculative greedy (reference path; -1 sampled)
    tie_divergences: int  # disagreeing problems whose first differing token was a near-tie (rounding; -1 sampled)
    mean_accept_len: float  # tokens produced per verify step (nan when not measured)
    worse: int  # McNemar discordant pairs: reference right, path wrong
    better: int  # reference wrong, path right
    p_value: float  # exact McNemar (two-sided)
    temperature: float  # 0: greedy; > 0: sampled (the baseline is plain sampling, not greedy)
    dist_tokens: int  # tokens in the distribution test of the emitted tokens (0: not run, greedy)
    dist_log10_p: float  # its log10 smallest Bonferroni-adjusted p-value (harness.e2e.stats.uniformity; 0: not run)
    verdict: str  # pass | fail
    detail: str
    seconds: float


@with_provenance
@dataclass(frozen=True)
class TimelineRow:
    """One check of one store-timing timeline run (``harness.timelines.runner``): a timeline through one
    path, compared with the logical truth after every layer call."""
    path: str  # "<model family>:<prepare>+<attn>" or "<model family>:<path mutant>"
    timeline: str  # catalog name, or the encoded id of a generated timeline
    model_family: str
    step: int
    mode: str  # extend | decode | target_verify
    layer: int
    family: str  # check family: timeline | gate
    check: str
    status: str  # pass | fail | timeout
    err: float
    allowed: float
    detail: str
    repro: str  # the run's one-line repro (reports.timeline_rows.repro_line)


# The values the harness writes in each row type's verdict columns; ``reports.frames.read``
# refuses any other (a hand-edited "FAIL" or a blank must never read as passing).
PARITY_STATUSES = ("pass", "fail", "timeout", "refused", "known")  # timeout: FAILING (a case past its limit)
VERDICTS = {ParityRow: {"status": PARITY_STATUSES}, TimelineRow: {"status": ("pass", "fail", "timeout")},
            GateRow: {"expect": ("pass", "fail"), "verdict": ("pass", "fail")},
            PerfRow: {"mode": ("eager", "graph")}}


def columns(row_type: type) -> list[str]:
    return [f.name for f in dataclasses.fields(row_type)]
