"""Prometheus metrics of one guard server (its own registry: no module-level state).

The per-request path only bumps plain counts (`on_event`, `on_complete`); the exposition
is built when `/metrics` is scraped (a custom collector), so a request pays no metric-library
locking per event.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from floorguard.core.contract import ContractClass
from floorguard.core.events import TERMINAL_KINDS, EventKind, TraceEvent
from floorguard.core.guard import Guard
from floorguard.store.shared import SharedFloor

__all__ = ["GuardMetrics"]


class GuardMetrics:
    def __init__(
        self,
        guard: Guard,
        clock_now: Callable[[], float],
        learner_callouts: Tally[str] | None = None,
        shared_floor: SharedFloor | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.learner_callouts: Tally[str] = (
            Tally() if learner_callouts is None else learner_callouts  # shared, maybe empty
        )
        """HTTP learner callouts by outcome (ok, timeout, error)."""
        self.admitted: Tally[tuple[str, str, str]] = Tally()
        """(tenant, class, entitled) → admissions."""
        self.outcomes: Tally[tuple[str, str, str, str]] = Tally()
        """(tenant, class, outcome, reason) → terminal outcomes."""
        self.late: Tally[tuple[str, str]] = Tally()
        """(tenant, class) → completions after their deadline."""
        self._service = Histogram(
            "floorguard_service_seconds",
            "Dispatch to completion",
            ["cls"],
            buckets=(0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30),
            registry=self.registry,
        )
        self._service_of = {cls: self._service.labels(cls.value) for cls in ContractClass}
        self.shared_floor = shared_floor
        self.registry.register(_GuardCollector(self, guard, clock_now))

    def on_event(self, event: TraceEvent) -> None:
        kind = event.kind
        if kind is EventKind.ADMIT:
            entitled = "true" if event.entitled else "false"
            self.admitted[event.tenant or "", _cls(event), entitled] += 1
        elif kind in TERMINAL_KINDS:
            self.outcomes[event.tenant or "", _cls(event), kind.value, event.reason or ""] += 1

    def on_complete(self, tenant: str, cls: ContractClass, service_s: float, late: bool) -> None:
        self._service_of[cls].observe(service_s)
        if late:
            self.late[tenant, cls.value] += 1


def _cls(event: TraceEvent) -> str:
    return event.cls.value if event.cls is not None else "none"


_GAUGES: tuple[tuple[str, str, Callable[[Guard], float]], ...] = (
    ("floorguard_queued", "Requests queued in the guard", lambda g: g.num_queued),
    (
        "floorguard_queued_entitled",
        "Floor-entitled requests queued (Q_A)",
        lambda g: g.num_queued_entitled,
    ),
    ("floorguard_in_flight", "Requests in flight to backends", lambda g: g.num_in_flight),
    (
        "floorguard_learner_faults",
        "Learner exceptions and malformed proposals",
        lambda g: g.stats.learner_faults,
    ),
    (
        "floorguard_envelope_above_ceiling",
        "Services above s_max",
        lambda g: g.envelope.num_above_upper,
    ),
    ("floorguard_envelope_below_lower", "Services below L", lambda g: g.envelope.num_below_lower),
    (
        "floorguard_capacity_alarms",
        "Busy windows with capacity below the floor",
        lambda g: g.capacity.num_alarms,
    ),
)


class _GuardCollector(Collector):
    """Reads the counts and the guard's state at scrape time."""

    def __init__(self, metrics: GuardMetrics, guard: Guard, now: Callable[[], float]) -> None:
        self._metrics = metrics
        self._guard = guard
        self._now = now

    def collect(self) -> Iterator[Metric]:
        m, guard = self._metrics, self._guard
        yield _counter(
            "floorguard_requests",
            "Terminal outcomes by tenant, class, reason",
            ["tenant", "cls", "outcome", "reason"],
            m.outcomes,
        )
        yield _counter(
            "floorguard_admitted", "Admissions", ["tenant", "cls", "entitled"], m.admitted
        )
        yield _counter(
            "floorguard_late", "Completions after their deadline", ["tenant", "cls"], m.late
        )
        yield _counter(
            "floorguard_learner_callouts",
            "HTTP learner callouts by outcome",
            ["outcome"],
            {(k,): v for k, v in m.learner_callouts.items()},
        )
        if m.shared_floor is not None:
            floor = m.shared_floor
            yield _counter(
                "floorguard_store_calls",
                "Shared-floor store calls by outcome (docs/replicas.md)",
                ["outcome"],
                {(k,): v for k, v in floor.calls.items()},
            )
            yield GaugeMetricFamily(
                "floorguard_store_degraded",
                "1 while Redis is unreachable and the fallback policy grants the floor",
                value=float(floor.degraded),
            )
        for name, doc, read in _GAUGES:
            yield GaugeMetricFamily(name, doc, value=read(guard))
        credits = GaugeMetricFamily(
            "floorguard_credits_left", "Floor credits left in the current window", labels=["tenant"]
        )
        now = self._now()
        for contract in guard.config.contracts:
            if contract.cls is ContractClass.ASSURED:
                left = guard.credits_left(contract.tenant, now)
                credits.add_metric([contract.tenant], float(left or 0))
        yield credits


def _counter(
    name: str, doc: str, labels: list[str], counts: Mapping[Any, int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, count in sorted(counts.items()):
        family.add_metric(list(key), count)
    return family
