"""Row dataclasses: field order is column order; provenance rides on every row."""
from __future__ import annotations

import dataclasses
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


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


@dataclass(frozen=True)
class ParityRow:
    op: str
    impl: str
    kind: str
    case: str  # display id (catalog name or encoded id)
    check: str
    status: str  # pass | fail | refused
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
    repro: str
    # provenance
    git_sha: str
    device: str
    arch: str
    fp8_format: str
    torch: str
    triton: str
    shim: str
    profile: str
    seed: int


def git_sha(root: Path | None = None) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root or Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
        sha = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root or Path(__file__).parent,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def to_frame(rows: list) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame(columns=[f.name for f in dataclasses.fields(ParityRow)])
    return pd.DataFrame([dataclasses.asdict(r) for r in rows], columns=[f.name for f in dataclasses.fields(type(rows[0]))])


def write_csv(rows: list, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    to_frame(rows).to_csv(path, index=False)
    return path
