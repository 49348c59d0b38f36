"""Readers for public LLM arrival traces.

* Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps as
  `2023-11-16 18:17:03.9799600` (7 fractional digits).
* BurstGPT: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`,
  timestamps in seconds.

Both become a `TraceData`: arrival offsets in seconds from the first row (sorted), token
counts, and every other column as strings (for class assignment by column).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from floorguard.errors import WorkloadError

__all__ = ["TraceData", "load_azure", "load_burstgpt", "load_trace"]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = (
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
)


@dataclass(frozen=True)
class TraceData:
    source: str
    arrival_s: np.ndarray
    """Seconds since the first arrival, non-decreasing."""
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0


def _read_rows(path: Path, expected: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    if not path.is_file():
        raise WorkloadError(f"trace file {str(path)!r} does not exist")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in expected if c not in header]
        if missing:
            raise WorkloadError(f"{path}: missing columns {missing}; found {header}")
        rows = [row for row in reader if row]
    if not rows:
        raise WorkloadError(f"{path}: no data rows")
    return header, rows


def _column(header: list[str], rows: list[list[str]], name: str, path: Path) -> list[str]:
    i = header.index(name)
    try:
        return [row[i] for row in rows]
    except IndexError as exc:
        raise WorkloadError(f"{path}: a row has fewer columns than the header") from exc


def _ints(values: list[str], name: str, path: Path) -> np.ndarray:
    try:
        return np.asarray([int(float(v)) for v in values], dtype=np.int64)
    except ValueError as exc:
        raise WorkloadError(f"{path}: column {name!r} has a non-number ({exc})") from exc


def _build(
    source: str,
    stamps: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    columns: dict[str, np.ndarray],
) -> TraceData:
    order = np.argsort(stamps, kind="stable")
    stamps = stamps[order]
    return TraceData(
        source,
        stamps - stamps[0],
        prompt[order],
        output[order],
        {k: v[order] for k, v in columns.items()},
    )


def load_azure(path: str | Path) -> TraceData:
    path = Path(path)
    header, rows = _read_rows(path, AZURE_COLUMNS)
    try:
        stamps = np.asarray(
            [
                datetime.fromisoformat(v.strip()[:26]).timestamp()
                for v in _column(header, rows, "TIMESTAMP", path)
            ]
        )
    except ValueError as exc:
        raise WorkloadError(f"{path}: bad TIMESTAMP ({exc})") from exc
    return _build(
        str(path),
        stamps,
        _ints(_column(header, rows, "ContextTokens", path), "ContextTokens", path),
        _ints(_column(header, rows, "GeneratedTokens", path), "GeneratedTokens", path),
        {},
    )


def load_burstgpt(path: str | Path) -> TraceData:
    path = Path(path)
    header, rows = _read_rows(path, BURSTGPT_COLUMNS)
    try:
        stamps = np.asarray([float(v) for v in _column(header, rows, "Timestamp", path)])
    except ValueError as exc:
        raise WorkloadError(f"{path}: bad Timestamp ({exc})") from exc
    columns = {
        name: np.asarray(_column(header, rows, name, path)) for name in ("Model", "Log Type")
    }
    return _build(
        str(path),
        stamps,
        _ints(_column(header, rows, "Request tokens", path), "Request tokens", path),
        _ints(_column(header, rows, "Response tokens", path), "Response tokens", path),
        columns,
    )


def load_trace(path: str | Path) -> TraceData:
    """Either format, told apart by the header."""
    if not Path(path).is_file():
        raise WorkloadError(f"trace file {str(path)!r} does not exist")
    with Path(path).open(encoding="utf-8") as f:
        header = f.readline()
    if "GeneratedTokens" in header:
        return load_azure(path)
    if "Response tokens" in header:
        return load_burstgpt(path)
    raise WorkloadError(f"{path}: neither the Azure nor the BurstGPT trace format: {header!r}")
