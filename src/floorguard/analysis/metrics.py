"""Run metrics computed from a folded trace (docs/design.md §8)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from floorguard.analysis.records import RequestRecord, TraceRecords
from floorguard.core.contract import ContractClass, MeterKind

__all__ = [
    "UNMET_OUTCOMES",
    "UNMET_TEXT",
    "ClassMetrics",
    "RunMetrics",
    "entitled_ids",
    "floor_attainment",
    "max_assured_backlog",
    "measure",
    "ratio",
    "unmet_count",
    "worst_phase",
]

UNMET_OUTCOMES = ("rejected", "dropped", "late", "failed", "aborted")
"""What counts as unmet (docs/design.md §8): every offered request that did not complete on time."""
UNMET_TEXT = "*unmet* = (rejected + dropped + late + failed + aborted) / offered (design §8)"
"""The definition in words, for every table's legend."""


def unmet_count(counts: Mapping[str, int], prefix: str = "") -> int:
    """The unmet requests among `counts` (keyed by outcome, with an optional prefix such
    as the tables' `a_` / `o_`)."""
    return sum(counts[prefix + outcome] for outcome in UNMET_OUTCOMES)


def ratio(numerator: float, denominator: float) -> float | None:
    """`numerator / denominator`, or None when the denominator is zero (JSON null)."""
    return numerator / denominator if denominator else None


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


@dataclass(frozen=True)
class ClassMetrics:
    offered: int
    admitted: int
    rejected: int
    dropped: int
    late: int
    failed: int
    aborted: int
    completed: int
    miss: float | None
    """late / admitted (admitted basis)."""
    unmet: float | None
    """(rejected + dropped + late + failed + aborted) / offered (offered basis)."""
    sojourn_p50_s: float | None
    sojourn_p95_s: float | None
    sojourn_p99_s: float | None
    queue_wait_p50_s: float | None
    queue_wait_p99_s: float | None
    service_mean_s: float | None
    service_max_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def class_metrics(records: Sequence[RequestRecord]) -> ClassMetrics:
    count = {k: 0 for k in ("completed", "rejected", "dropped", "failed", "aborted")}
    for r in records:
        if r.outcome is not None:
            count[r.outcome] += 1
    done = [r for r in records if r.outcome == "completed"]
    late = sum(r.late for r in done)
    admitted = sum(r.admitted for r in records)
    unmet = unmet_count({**count, "late": late})
    sojourn = [r.sojourn_s for r in done]
    # a client-side log knows no dispatch time: its wait and service are NaN and skipped
    wait = [r.queue_wait_s for r in done if not math.isnan(r.queue_wait_s)]
    service = [r.service_s for r in done if not math.isnan(r.service_s)]
    return ClassMetrics(
        offered=len(records),
        admitted=admitted,
        rejected=count["rejected"],
        dropped=count["dropped"],
        late=late,
        failed=count["failed"],
        aborted=count["aborted"],
        completed=count["completed"],
        miss=ratio(late, admitted),
        unmet=ratio(unmet, len(records)),
        sojourn_p50_s=_percentile(sojourn, 50),
        sojourn_p95_s=_percentile(sojourn, 95),
        sojourn_p99_s=_percentile(sojourn, 99),
        queue_wait_p50_s=_percentile(wait, 50),
        queue_wait_p99_s=_percentile(wait, 99),
        service_mean_s=float(np.mean(service)) if service else None,
        service_max_s=max(service) if service else None,
    )


def entitled_ids(trace: TraceRecords, phase_s: float = 0.0) -> set[object]:
    """The floor-entitled requests by the contract's own windows shifted by `phase_s`: in each
    window, the assured arrivals whose weight fits what is left of `B`, in arrival order (for a
    count meter: the first `min(B, offered)`). At the guard's own origin (`phase_s` 0), a
    record's `window` — the guard's, as it reported it to a client — wins over its arrival
    time on the client's clock."""
    config = trace.config
    schedule = config.schedule
    token_meter = config.meter is MeterKind.TOKEN
    floors = {c.tenant: c.floor for c in config.contracts if c.assured}
    used: dict[tuple[str, int], int] = {}
    out: set[object] = set()
    for r in trace.records:
        floor = floors.get(r.tenant)
        if floor is None:
            continue
        window = math.floor((r.arrival_at - schedule.origin_at - phase_s) / schedule.window_s)
        if phase_s == 0.0 and r.window is not None:
            window = r.window
        weight = r.num_prompt_tokens + r.num_output_tokens if token_meter else 1
        key = (r.tenant, window)
        if used.get(key, 0) + weight <= floor:
            used[key] = used.get(key, 0) + weight
            out.add(r.request_id)
    return out


def floor_attainment(trace: TraceRecords, phase_s: float = 0.0) -> tuple[int, int]:
    """(entitled ∧ admitted ∧ on time, entitled) counts: their ratio is the floor-entitled
    attainment (docs/design.md §8)."""
    ids = entitled_ids(trace, phase_s)
    met = sum(1 for r in trace.records if r.request_id in ids and r.admitted and r.on_time)
    return met, len(ids)


def worst_phase(phase_counts: Iterable[tuple[float, int, int]]) -> tuple[float | None, float]:
    """The lowest attainment over the sweep and its φ (the first on a tie)."""
    worst: float | None = None
    at = 0.0
    for phase, met, entitled in phase_counts:
        value = ratio(met, entitled)
        if value is not None and (worst is None or value < worst):
            worst, at = value, phase
    return worst, at


def max_assured_backlog(records: Iterable[RequestRecord]) -> int:
    """Largest `Q_A`: assured-class requests admitted and not yet started (or dropped).

    Counted by class, not entitlement, so every stack is measured alike; for the guard under
    the `reject` policy the two coincide. (The guard's own `BacklogMonitor`, the §6
    precondition, counts floor-entitled requests only.)"""
    changes: list[tuple[float, int]] = []
    for r in records:
        if r.admitted and r.cls is ContractClass.ASSURED:
            changes.append((r.arrival_at, 0))  # at one instant, admissions count first
            left_at = r.dispatched_at if not math.isnan(r.dispatched_at) else r.ended_at
            changes.append((left_at, 1))
    backlog = peak = 0
    for _, leaving in sorted(changes):
        backlog += -1 if leaving else 1
        peak = max(peak, backlog)
    return peak


@dataclass(frozen=True)
class RunMetrics:
    assured: ClassMetrics
    opportunistic: ClassMetrics
    attainment: float | None
    """Floor-entitled attainment at the guard's own window origin."""
    attainment_worst_phase: float | None
    worst_phase_s: float
    num_entitled: int
    phase_counts: tuple[tuple[float, int, int], ...]
    """(φ, entitled ∧ admitted ∧ on time, entitled) for each phase offset of the sweep."""
    rho_eff: float | None
    """admitted rate × mean measured service / C."""
    max_assured_backlog: int
    goodput_per_s: float | None
    """On-time completions per second of arrival span."""
    span_s: float
    fire_cv: float | None
    """Coefficient of variation of the realized interarrival times."""
    max_fire_lag_s: float


def _fire_cv(arrivals: Sequence[float]) -> float | None:
    if len(arrivals) < 3:
        return None
    gaps = np.diff(np.sort(np.asarray(arrivals)))
    mean = float(gaps.mean())
    return float(gaps.std() / mean) if mean > 0 else None


def measure(trace: TraceRecords, *, num_phases: int = 20) -> RunMetrics:
    records = trace.records
    window_s = trace.config.schedule.window_s
    arrivals = [r.arrival_at for r in records]
    span_s = max(arrivals) - min(arrivals) if arrivals else 0.0
    phase_counts = tuple(
        (phase, *floor_attainment(trace, phase))
        for phase in (window_s * i / num_phases for i in range(num_phases))
    )
    _, met, num_entitled = phase_counts[0]
    worst, worst_at = worst_phase(phase_counts)
    done = [r for r in records if r.outcome == "completed"]
    admitted = sum(r.admitted for r in records)
    services = [r.service_s for r in done if not math.isnan(r.service_s)]
    mean_service = float(np.mean(services)) if services else None
    rho_eff = (
        None
        if mean_service is None or span_s <= 0
        else admitted / span_s * mean_service / trace.config.total_slots
    )
    return RunMetrics(
        assured=class_metrics(trace.of_class(ContractClass.ASSURED)),
        opportunistic=class_metrics(trace.of_class(ContractClass.OPPORTUNISTIC)),
        attainment=ratio(met, num_entitled),
        attainment_worst_phase=worst,
        worst_phase_s=worst_at,
        num_entitled=num_entitled,
        phase_counts=phase_counts,
        rho_eff=rho_eff,
        max_assured_backlog=max_assured_backlog(records),
        goodput_per_s=ratio(sum(r.on_time for r in done), span_s),
        span_s=span_s,
        fire_cv=_fire_cv(arrivals),
        max_fire_lag_s=max((r.arrival_at - r.scheduled_at for r in records), default=0.0),
    )
