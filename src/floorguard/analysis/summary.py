"""Pool the metrics of several reps into the `floorguard simulate --json` contract.

Counts are summed over reps and the ratios recomputed from the sums (never averaged);
`rho_eff` and goodput are per-run quantities and are averaged; `max_assured_backlog` is the
largest over reps. A ratio whose denominator is zero is `None` (JSON null).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from floorguard.analysis.metrics import (
    ClassMetrics,
    RunMetrics,
    ratio,
    unmet_count,
    worst_phase,
)

__all__ = ["pool_class", "pool_runs"]

_COUNTS = ("offered", "admitted", "rejected", "dropped", "late", "failed", "aborted", "completed")


def pool_class(per_rep: Sequence[ClassMetrics]) -> dict[str, Any]:
    total = {k: sum(getattr(m, k) for m in per_rep) for k in _COUNTS}
    unmet = unmet_count(total)
    p99 = [m.sojourn_p99_s for m in per_rep if m.sojourn_p99_s is not None]
    service = [m.service_max_s for m in per_rep if m.service_max_s is not None]
    return {
        **total,
        "miss": ratio(total["late"], total["admitted"]),
        "unmet": ratio(unmet, total["offered"]),
        "sojourn_p99_ms_max_over_reps": max(p99) * 1e3 if p99 else None,
        "service_max_ms": max(service) * 1e3 if service else None,
    }


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def pool_runs(runs: Sequence[RunMetrics]) -> dict[str, Any]:
    assured = pool_class([r.assured for r in runs])
    phases: dict[float, list[int]] = {}
    for run in runs:
        for phase, met, entitled in run.phase_counts:
            pooled = phases.setdefault(phase, [0, 0])
            pooled[0] += met
            pooled[1] += entitled
    met, entitled = phases.get(0.0, [0, 0])
    worst, worst_at = worst_phase((p, m, e) for p, (m, e) in sorted(phases.items()))
    assured.update(
        entitled=entitled,
        attainment=ratio(met, entitled),
        attainment_worst_phase=worst,
        worst_phase_ms=worst_at * 1e3,
    )
    return {
        "assured": assured,
        "opportunistic": pool_class([r.opportunistic for r in runs]),
        "rho_eff": _mean([r.rho_eff for r in runs]),
        "max_assured_backlog": max((r.max_assured_backlog for r in runs), default=0),
        "goodput_per_s": _mean([r.goodput_per_s for r in runs]),
        "fire_cv": _mean([r.fire_cv for r in runs]),
        "max_fire_lag_s": max((r.max_fire_lag_s for r in runs), default=0.0),
    }
