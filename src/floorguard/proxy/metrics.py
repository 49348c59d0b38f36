"""Prometheus metrics of one guard server (its own registry: no module-level state)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from floorguard.core.contract import ContractClass
from floorguard.core.events import TERMINAL_KINDS, TraceEvent
from floorguard.core.guard import Guard

__all__ = ["GuardMetrics"]


def _credits_of(guard: Guard, tenant: str, now: Callable[[], float]) -> Callable[[], float]:
    return lambda: float(guard.credits_left(tenant, now()) or 0)


class GuardMetrics:
    def __init__(self, guard: Guard, clock_now: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.outcomes = Counter(
            "floorguard_requests",
            "Terminal outcomes by tenant, class, reason",
            ["tenant", "cls", "outcome", "reason"],
            registry=r,
        )
        self.admitted = Counter(
            "floorguard_admitted", "Admissions", ["tenant", "cls", "entitled"], registry=r
        )
        self.late = Counter(
            "floorguard_late", "Completions after their deadline", ["tenant", "cls"], registry=r
        )
        self.service = Histogram(
            "floorguard_service_seconds",
            "Dispatch to completion",
            ["cls"],
            buckets=(0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30),
            registry=r,
        )
        Gauge("floorguard_queued", "Requests queued in the guard", registry=r).set_function(
            lambda: guard.num_queued
        )
        Gauge(
            "floorguard_queued_entitled", "Floor-entitled requests queued (Q_A)", registry=r
        ).set_function(lambda: guard.num_queued_entitled)
        Gauge("floorguard_in_flight", "Requests in flight to backends", registry=r).set_function(
            lambda: guard.num_in_flight
        )
        Gauge(
            "floorguard_learner_faults", "Learner exceptions and malformed proposals", registry=r
        ).set_function(lambda: guard.stats.learner_faults)
        Gauge("floorguard_envelope_above_ceiling", "Services above s_max", registry=r).set_function(
            lambda: guard.envelope.num_above_upper
        )
        Gauge("floorguard_envelope_below_lower", "Services below L", registry=r).set_function(
            lambda: guard.envelope.num_below_lower
        )
        Gauge(
            "floorguard_capacity_alarms", "Busy windows with capacity below the floor", registry=r
        ).set_function(lambda: guard.capacity.num_alarms)
        credits = Gauge(
            "floorguard_credits_left",
            "Floor credits left in the current window",
            ["tenant"],
            registry=r,
        )
        for contract in guard.config.contracts:
            if contract.cls is ContractClass.ASSURED:
                credits.labels(contract.tenant).set_function(
                    _credits_of(guard, contract.tenant, clock_now)
                )

    def on_event(self, event: TraceEvent) -> None:
        cls = event.cls.value if event.cls is not None else "none"
        tenant = event.tenant or ""
        if event.kind.value == "admit":
            self.admitted.labels(tenant, cls, str(bool(event.entitled)).lower()).inc()
        elif event.kind in TERMINAL_KINDS:
            self.outcomes.labels(tenant, cls, event.kind.value, event.reason or "").inc()
