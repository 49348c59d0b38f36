"""Tidy results → per-condition summaries with their intervals → CSV and Markdown.

Counts are pooled within a condition (never across conditions). Intervals: the run-level
Clopper–Pearson on "runs with no late assured request", and the request-level Wilson on
assured miss, labelled optimistic (requests within a run are correlated).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, cast

import numpy as np

from floorguard.analysis.metrics import UNMET_OUTCOMES, ratio, worst_phase
from floorguard.analysis.stats import Interval, clopper_pearson, wilson
from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow, Summary
from floorguard.experiments.spec import Experiment, Row

__all__ = [
    "condition_of",
    "markdown_table",
    "mean_of",
    "pooled",
    "source_name",
    "summarize",
    "write_csv",
]

CONDITION_FIELDS = [
    f.name for f in fields(Condition) if f.name not in ("detail", "keep_samples", "keep_ids")
]
NESTED = ("phase_counts", "detail", "a_sojourns", "services", "doomed_ids", "on_time_ids")


def condition_of(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row[name] for name in CONDITION_FIELDS)


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(present)) if present else None


def _sum(rows: Sequence[Mapping[str, Any]], key: str) -> int:
    return int(sum(r[key] for r in rows))


def pooled(
    rows: Sequence[Mapping[str, Any]], numerator: Sequence[str], denominator: str
) -> float | None:
    """A ratio pooled over runs: the counts summed first (None when the denominator is 0)."""
    return ratio(sum(_sum(rows, key) for key in numerator), _sum(rows, denominator))


def mean_of(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The mean of a per-run figure over the runs that have it (None and NaN skipped)."""
    return _mean([r[key] for r in rows])


def summarize(rows: Sequence[RunRow]) -> list[Summary]:
    """One summary per condition, in grid order."""
    groups: dict[tuple[Any, ...], list[RunRow]] = {}
    for row in rows:
        groups.setdefault(condition_of(row), []).append(row)
    out = []
    for key, runs in groups.items():
        phases: dict[float, list[int]] = {}
        for run in runs:
            for phase, met, entitled in run["phase_counts"]:
                counts = phases.setdefault(phase, [0, 0])
                counts[0] += met
                counts[1] += entitled
        worst, worst_at = worst_phase((p, m, e) for p, (m, e) in sorted(phases.items()))
        late, admitted = _sum(runs, "a_late"), _sum(runs, "a_admitted")
        summary = {
            **dict(zip(CONDITION_FIELDS, key, strict=True)),
            "runs": len(runs),
            "a_offered": _sum(runs, "a_offered"),
            "a_admitted": admitted,
            "a_rejected": _sum(runs, "a_rejected"),
            "a_dropped": _sum(runs, "a_dropped"),
            "a_late": late,
            "miss": wilson(late, admitted),
            "unmet": pooled(runs, [f"a_{k}" for k in UNMET_OUTCOMES], "a_offered"),
            "held": clopper_pearson(sum(bool(r["held"]) for r in runs), len(runs)),
            "attainment": ratio(_sum(runs, "entitled_met"), _sum(runs, "entitled")),
            "worst_phase": worst,
            "worst_phase_ms": worst_at * 1e3,
            "rho_eff": _mean([r["rho_eff"] for r in runs]),
            "rho_emp": _mean([r["rho_emp"] for r in runs]),
            "rho_hat": _mean([r["rho_hat"] for r in runs]),
            "wait_growth_ms_per_s": _mean([r["a_wait_growth_ms_per_s"] for r in runs]),
            "max_qa": max(r["max_assured_backlog"] for r in runs),
            "dr_firings": _sum(runs, "dr_firings"),
            "wait_p99_ms": _max_ms([r["a_queue_wait_p99_s"] for r in runs]),
            "sojourn_p99_ms": _max_ms([r["a_sojourn_p99_s"] for r in runs]),
            "max_service_ms": _max_ms([r["max_service_s"] for r in runs]),
            "o_unmet": pooled(runs, [f"o_{k}" for k in UNMET_OUTCOMES], "o_offered"),
            "inside_region": all(r["inside_region"] for r in runs),
            "fire_cv": _mean([r["fire_cv"] for r in runs]),
            "max_fire_lag_ms": max(r["max_fire_lag_s"] for r in runs) * 1e3,
        }
        out.append(cast(Summary, summary))
    return out


def _max_ms(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) * 1e3 if present else None


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, Interval):
        return value.fmt()
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


COLUMNS = [
    ("runs", "runs"),
    ("a_offered", "A offered"),
    ("a_admitted", "A admitted"),
    ("a_rejected", "A rejected"),
    ("a_dropped", "A dropped"),
    ("a_late", "A late"),
    ("miss", "A miss, Wilson 95 % (optimistic)"),
    ("held", "runs with 0 late, CP 95 %"),
    ("unmet", "A unmet"),
    ("attainment", "floor attainment"),
    ("worst_phase", "worst-phase attainment"),
    ("rho_eff", "ρ_eff"),
    ("rho_emp", "ρ_emp"),
    ("rho_hat", "ρ̂"),
    ("max_qa", "max Q_A"),
    ("dr_firings", "DR firings"),
    ("wait_p99_ms", "A wait p99 ms"),
    ("o_unmet", "O unmet"),
    ("inside_region", "§6 region"),
]


def source_name(trace_path: str) -> str:
    """A trace's short name for tables ('' is E12's synthetic gamma source)."""
    if not trace_path:
        return "gamma CV 2.9"
    return Path(trace_path).stem.replace("AzureLLMInferenceTrace_", "azure-")


def _cell(field: str, value: Any) -> str:
    return source_name(value) if field == "trace_path" else _fmt(value)


def markdown_table(
    experiment: Experiment,
    summaries: Sequence[Mapping[str, Any]],
    columns: Sequence[tuple[str, str]] = COLUMNS,
) -> str:
    head = [f.replace("trace_path", "source") for f in experiment.shown] + [c[1] for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        cells = [_cell(f, s[f]) for f in experiment.shown] + [_fmt(s[key]) for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    """The tidy table: one row per run, scalar columns only (nested extras go to JSONL)."""
    if not rows:
        path.write_text("")
        return
    names = [k for k in rows[0] if k not in NESTED]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
