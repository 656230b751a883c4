"""Results files -> one frame per row type: shards merged, columns checked against the dataclass.

A results file is CSV (``.csv``, ``.csv.gz``) or Parquet (``reports.rows.to_parquet``: the merged
results of a report, a nightly's per-op rows), told apart by its first bytes, whatever its name. A
file the report cannot trust is refused with ``CSVError`` naming it (and the row): unreadable, not
CSV text nor Parquet (binary, a gzip stream or a Parquet file cut short), no rows (a header only: an
empty shard), a row cut short (a truncated file), columns of another row type, or a verdict the
harness never writes (``reports.rows.VERDICTS``).
"""
from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path

import pandas as pd
import pyarrow as pa

from harness.usage import UsageError
from reports.rows import VERDICTS, GateRow, ParityRow, PerfRow, TimelineRow

# Columns that any two exactly equal rows share and that few distinct rows do: ``read`` looks for repeated rows
# among the rows that repeat these first (every column of 670K parity rows: 1.8 s; these: 0.5 s, 2026-12-08).
_REPEAT_KEYS = {ParityRow: ["case", "impl", "check", "seconds"],
                TimelineRow: ["timeline", "path", "step", "layer", "check"]}


class CSVError(UsageError):
    """A results file (CSV or Parquet) the report cannot trust; ``arg`` is the file (a usage error: the report's
    reading imports no torch)."""


def _str_columns(row_type: type) -> list[str]:
    return [f.name for f in dataclasses.fields(row_type) if f.type in ("str", str)]


# Columns added after CSVs were first written, with the value every older row meant: a previous
# nightly's CSV (the baseline of the next) still reads.
ADDED_COLUMNS = {"precision": "exact-fp32", "known": "", "nan_policy": ""}
# ... of one row type only (TimelineRow has a ``mode`` of its own, which must never be filled in):
# PerfRow's mode, every row eager before graph-replayed rows were written
# GateRow's temperature and distribution test, every row greedy before the sampled gate
ADDED_BY_TYPE = {PerfRow: {"mode": "eager"}, GateRow: {"temperature": 0.0, "dist_tokens": 0, "dist_log10_p": 0.0}}

_UNREADABLE = (OSError, EOFError, zlib.error, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError,
               pa.ArrowException)
PARQUET_MAGIC = b"PAR1"  # a Parquet file's first (and last) four bytes


def is_parquet_file(path: str | Path) -> bool:
    """``path`` holds Parquet (its first bytes), whatever its name; False for anything else or an unreadable file."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError:
        return False


def read_table(path: str | Path) -> pd.DataFrame:
    """A CSV or Parquet file as it is, in one call (``is_parquet_file`` decides which); raises what the
    reader raises."""
    return pd.read_parquet(path, engine="pyarrow") if is_parquet_file(path) else pd.read_csv(path)


def read_one(path: str | Path, columns: list[str], what: str, *, complete: str = "seed") -> pd.DataFrame:
    """One CSV or Parquet file with at least one row and every one of ``columns`` (``what``: the row type,
    for the error); ``complete`` names a column every row fills (provenance's ``seed``, the last column of
    every row type): a row without it was cut short."""
    try:
        f = read_table(path)
    except _UNREADABLE as exc:
        kind = "Parquet file" if is_parquet_file(path) else "CSV"
        raise CSVError(str(path), f"cannot read it as a {what} {kind}: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    missing = [c for c in columns if c not in f.columns]
    if missing:
        raise CSVError(str(path), f"not a {what} results file, missing columns {missing}")
    if f.empty:
        raise CSVError(str(path), "no rows (a header only: an empty shard, or a run that ran nothing)")
    cut = f[complete].isna()
    if cut.any():
        raise CSVError(str(path), f"row {int(cut.idxmax()) + 1} is cut short (no {complete!r}): a truncated file?")
    return f


def _check_verdicts(path, f: pd.DataFrame, row_type: type) -> None:
    for col, legal in VERDICTS.get(row_type, {}).items():
        bad = ~f[col].isin(legal)
        if bad.any():
            i = int(bad.idxmax())
            val = "" if pd.isna(f[col].iloc[i]) else f[col].iloc[i]
            raise CSVError(str(path), f"row {i + 1}: {col} {val!r} is not one of {', '.join(legal)}")


def read(paths: list[str | Path], row_type: type = ParityRow, *, counts: list | None = None) -> pd.DataFrame:
    """Concatenate results files (CSV or Parquet) of one row type (e.g. the shards of one run). Columns in dataclass order;
    a file missing a column raises (but for ``ADDED_COLUMNS`` and the row type's ``ADDED_BY_TYPE``,
    filled with their old meaning), as does any file the module docstring lists; rows repeated exactly (a shard passed twice) are
    dropped. ``counts``, when given, gets (path, rows) per file."""
    cols = [f.name for f in dataclasses.fields(row_type)]
    added = ADDED_COLUMNS | ADDED_BY_TYPE.get(row_type, {})
    frames = []
    strs = _str_columns(row_type)
    for p in paths:
        f = read_one(p, [c for c in cols if c not in added], row_type.__name__)
        for c, old in added.items():
            if c in cols and c not in f.columns:
                f[c] = old
        _check_verdicts(p, f, row_type)
        f = f[cols + [c for c in f.columns if c not in cols]]
        for c in (c for c in strs if c in f.columns):
            f[c] = _text(f[c])
        frames.append(f)
        if counts is not None:
            counts.append((p, len(f)))
    if not frames:
        return pd.DataFrame(columns=cols)
    return _drop_repeats(pd.concat(frames, ignore_index=True), _REPEAT_KEYS.get(row_type))


def _drop_repeats(frame: pd.DataFrame, key: list[str] | None) -> pd.DataFrame:
    """``frame.drop_duplicates(ignore_index=True)``, with the whole rows compared only where ``key``'s columns
    repeat (rows equal in every column are equal in those)."""
    if key is None:
        return frame.drop_duplicates(ignore_index=True)
    maybe = frame.duplicated(key, keep=False)
    if not maybe.any():
        return frame.reset_index(drop=True)
    repeated = frame[maybe].duplicated()
    return frame.drop(index=repeated.index[repeated]).reset_index(drop=True)


def _text(col: pd.Series) -> pd.Series:
    """A text column with "" where a cell is empty (an empty detail, worst or shim cell reads back as NaN), per
    file, before the files are concatenated. A Parquet file's dictionary-encoded column (a categorical of
    strings) becomes Python strings through its categories and a string column stays one: rebuilding every
    cell's string instead, after concatenating shards whose categories differ, took 10.7 s of a 640K-row
    nightly report's 23.6 s (2026-12-07). Anything else (a CSV column read as numbers) as before, cell by cell."""
    if isinstance(col.dtype, pd.CategoricalDtype) and pd.api.types.is_string_dtype(col.cat.categories.dtype):
        return col.astype(object).where(col.notna(), "")
    if isinstance(col.dtype, pd.StringDtype):
        return col.fillna("")
    return col.astype(object).where(col.notna(), "").astype(str)
