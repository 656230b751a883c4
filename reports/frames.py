"""CSV files -> one frame per row type: shards merged, columns checked against the dataclass."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from reports.rows import ParityRow


def _str_columns(row_type: type) -> list[str]:
    return [f.name for f in dataclasses.fields(row_type) if f.type in ("str", str)]


# Columns added after CSVs were first written, with the value every older row meant: a previous
# nightly's CSV (the baseline of the next) still reads.
ADDED_COLUMNS = {"precision": "exact-fp32", "known": ""}


def read(paths: list[str | Path], row_type: type = ParityRow) -> pd.DataFrame:
    """Concatenate CSVs of one row type (e.g. the shards of one run). Columns in dataclass order;
    a file missing a column raises (but for ``ADDED_COLUMNS``, filled with their old meaning);
    rows repeated exactly (a shard passed twice) are dropped."""
    cols = [f.name for f in dataclasses.fields(row_type)]
    frames = []
    for p in paths:
        f = pd.read_csv(p)
        for c, old in ADDED_COLUMNS.items():
            if c in cols and c not in f.columns:
                f[c] = old
        missing = [c for c in cols if c not in f.columns]
        if missing:
            raise ValueError(f"{p}: not a {row_type.__name__} CSV, missing columns {missing}")
        frames.append(f[cols + [c for c in f.columns if c not in cols]])
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    strs = [c for c in _str_columns(row_type) if c in out.columns]
    for c in strs:  # empty detail/worst/shim cells read back as NaN: make them "" again
        out[c] = out[c].astype(object).where(out[c].notna(), "").astype(str)
    return out.drop_duplicates(ignore_index=True)
