"""Prometheus metrics of one guard server (its own registry: no module-level state).

The per-request path only bumps plain counts and bucket tallies (`on_event`,
`on_chunk_gap`); the exposition is built when `/metrics` is scraped (a custom collector),
so a request pays no metric-library locking per event.

Every series of an admitted request carries `model` (the pool: its model name, `default`
without `models:`); refusals before admission (`floorguard_refused_before_admission`) are
by status and reason only, since no pool has been chosen for them.
Label values are bounded by the configuration: tenants, classes, models and backends come
from it, reasons are the guard's own codes (anything else is `other`). Tenant × backend is
never one series (that product grows with the fleet): latencies are by tenant, service
also by backend, inter-token gaps by class.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from mypy_extensions import mypyc_attr
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from floorguard.core.contract import ContractClass
from floorguard.core.events import TERMINAL_KINDS, EventKind, TraceEvent, first_token_due
from floorguard.core.guard import Guard
from floorguard.core.refusals import REFUSALS
from floorguard.proxy.observe.usage import Usage
from floorguard.store.shared import SharedFloor

__all__ = ["LATENCY_BUCKETS_S", "GuardMetrics", "Timing"]

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60)
"""Queue wait, time to first token, service: 10 ms to a minute."""
GAP_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5)
"""Inter-token gaps of streamed replies: 5 ms to 2.5 s."""

_CODE = re.compile(r"^[a-z0-9_]{1,40}$")


class _Histogram:
    """Bucket tallies per label tuple, rendered at scrape time (cumulative, with +Inf)."""

    __slots__ = ("_bounds", "_series")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = ([0] * (len(self._bounds) + 1), [0.0])
        bucket = 0  # bisect_left, in the loop a compiled build runs natively
        for bound in self._bounds:
            if value <= bound:
                break
            bucket += 1
        series[0][bucket] += 1
        series[1][0] += value

    def family(self, name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=labels)
        for key, (counts, total) in sorted(self._series.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*map(str, self._bounds), "+Inf"), counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric(list(key), buckets, total[0])
        return family


class Timing:
    __slots__ = (
        "admitted_at",
        "arrived_at",
        "backend",
        "deadline_at",
        "dispatched_at",
        "entitled",
        "first_by",
        "first_token_at",
    )

    def __init__(self, arrived_at: float) -> None:
        self.arrived_at = arrived_at
        self.admitted_at: float | None = None
        self.deadline_at: float | None = None
        self.dispatched_at: float | None = None
        self.first_token_at: float | None = None
        self.backend = ""
        self.entitled = False
        self.first_by: float | None = None
        """When its first token is due (its contract's TTFT; None: none)."""


class GuardMetrics:
    """`pools`: model label → (its guard, its shared floor or None)."""

    def __init__(
        self,
        pools: Mapping[str, tuple[Guard, SharedFloor | None]],
        clock_now: Callable[[], float],
        learner_callouts: Mapping[str, int] | None = None,
        *,
        backend_ids: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.learner_callouts: Mapping[str, int] = (
            {} if learner_callouts is None else learner_callouts  # shared, maybe empty
        )
        """HTTP learner callouts by outcome (ok, timeout, error)."""
        # The counts are `defaultdict(int)`s, not `Counter`s: a Counter's item assignment goes
        # through a Python-level slot (it defines `__delitem__`), ≈ 1,000 instructions a
        # count in a compiled build, and a request makes six or more.
        self.admitted: defaultdict[tuple[str, str, str, str], int] = defaultdict(int)
        """(model, tenant, class, entitled) → admissions."""
        self.outcomes: defaultdict[tuple[str, str, str, str, str], int] = defaultdict(int)
        """(model, tenant, class, outcome, reason) → terminal outcomes."""
        self.late: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        """(model, tenant, class) → completions after their deadline."""
        self.floor_ended: defaultdict[tuple[str, str], int] = defaultdict(int)
        """(model, tenant) → floor-entitled requests that ended (any outcome)."""
        self.floor_met: defaultdict[tuple[str, str], int] = defaultdict(int)
        """(model, tenant) → floor-entitled requests completed by their deadline: with
        `floor_ended`, the tenant's SLO attainment."""
        self.floor_ttft_ended: defaultdict[tuple[str, str], int] = defaultdict(int)
        """(model, tenant) → floor-entitled requests of a contract with a TTFT that ended."""
        self.floor_ttft_met: defaultdict[tuple[str, str], int] = defaultdict(int)
        """(model, tenant) → those whose first byte came by arrival + TTFT (docs/design.md
        §19): with `floor_ttft_ended`, the tenant's TTFT attainment."""
        self.tokens: defaultdict[tuple[str, str, str, str], int] = defaultdict(int)
        """(model, tenant, class, kind) → tokens the backend reported (`prompt`,
        `completion`: its `usage`)."""
        self.usage_estimated: defaultdict[tuple[str, str], int] = defaultdict(int)
        """(model, why: `cut` | `unreported`) → replies billed the guard's estimate."""
        self.refused: defaultdict[tuple[str, str], int] = defaultdict(int)
        """(status, reason) → requests refused before admission: identity, the body, its
        fields, routing, no healthy backend — before any guard decided (docs/design.md §17)."""
        self.queue_wait = _Histogram(LATENCY_BUCKETS_S)
        self.ttft = _Histogram(LATENCY_BUCKETS_S)
        self.service = _Histogram(LATENCY_BUCKETS_S)
        self.gaps = _Histogram(GAP_BUCKETS_S)
        self.pools = dict(pools)
        self._backend_ids = {k: list(v) for k, v in (backend_ids or {}).items()}
        self.backends_up: dict[str, Callable[[], Sequence[bool]]] = {}
        """By model: each backend's health now (the edge sets it once its pools exist)."""
        self._timings: dict[Any, Timing] = {}
        self.ended: dict[Any, tuple[Timing, TraceEvent]] | None = None
        """With an access log: each ended request's timing and terminal event, until the
        edge takes it (`take_ended`)."""
        self._reasons: dict[str, str] = {str(reason): str(reason) for reason in REFUSALS}
        """Each reason seen, as its label: the refusal table's always its own."""
        self.registry.register(_GuardCollector(self, clock_now))
        ProcessCollector(registry=self.registry)  # CPU, memory, descriptors (Linux)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def _reason(self, reason: str | None) -> str:
        """A reason as a label value: the guard's own codes, anything else `other`."""
        if not reason:
            return ""
        label = self._reasons.get(reason)
        if label is None:
            label = reason if _CODE.match(reason) and len(self._reasons) < 256 else "other"
            self._reasons[reason] = label
        return label

    def on_usage(self, model: str, tenant: str, cls: ContractClass, usage: Usage) -> None:
        """What a reply cost, as its backend reported it."""
        label = _LABEL[cls]
        self.tokens[model, tenant, label, "prompt"] += usage.prompt_tokens
        self.tokens[model, tenant, label, "completion"] += usage.completion_tokens
        if usage.estimated is not None:
            self.usage_estimated[model, usage.estimated] += 1

    def on_refused(self, status: int, reason: str | None) -> None:
        """A request the edge refused before any guard saw it."""
        self.refused[str(status), self._reason(reason) or "other"] += 1

    def backends_changed(self, model: str, ids: Sequence[str]) -> None:
        """A reload appended backends (`model`'s pool, by position)."""
        self._backend_ids[model] = list(ids)

    def _backend(self, model: str, backend: int | None) -> str:
        ids = self._backend_ids.get(model)
        if backend is None or backend < 0:
            return ""
        return ids[backend] if ids and backend < len(ids) else str(backend)

    def on_event(self, event: TraceEvent) -> None:
        kind = event.kind
        if kind is EventKind.ENQUEUE:  # counted by nothing here (every admission has one)
            return
        model, rid = event.pool or "default", event.request_id
        if kind is EventKind.ARRIVE:
            arrived = self._timings[rid] = Timing(event.at)
            pool = self.pools.get(model)
            contract = pool[0].contract_of(event.tenant or "") if pool is not None else None
            if contract is not None and contract.ttft_budget_s is not None:
                arrived.first_by = first_token_due(event, contract)
            return
        timing = self._timings.get(rid)
        if kind is EventKind.ADMIT:
            entitled = "true" if event.entitled else "false"
            self.admitted[model, event.tenant or "", _cls(event), entitled] += 1
            if timing is not None:
                timing.admitted_at = event.at
                timing.deadline_at = event.deadline_at
                timing.entitled = bool(event.entitled)
        elif kind is EventKind.DISPATCH and timing is not None:
            timing.dispatched_at = event.at
            timing.backend = self._backend(model, event.backend)
            if timing.admitted_at is not None:
                labels = (model, _cls(event), event.tenant or "")
                self.queue_wait.observe(labels, event.at - timing.admitted_at)
        elif kind is EventKind.REQUEUE and timing is not None:
            timing.dispatched_at = None  # waits again; its wait so far was observed
            timing.admitted_at = event.at
        elif kind is EventKind.FIRST_TOKEN and timing is not None:
            timing.first_token_at = event.at
            labels = (model, _cls(event), event.tenant or "")
            self.ttft.observe(labels, event.at - timing.arrived_at)
        elif kind in TERMINAL_KINDS:
            self._ended(event, model, timing)

    def _ended(self, event: TraceEvent, model: str, timing: Timing | None) -> None:
        kind, cls, tenant = event.kind, _cls(event), event.tenant or ""
        reason = self._reason(event.reason)
        self.outcomes[model, tenant, cls, _LABEL[kind], reason] += 1
        self._timings.pop(event.request_id, None)
        if timing is None:
            return
        if self.ended is not None:
            if len(self.ended) > 65_536:  # never taken (a bug): stay bounded
                self.ended.clear()
            self.ended[event.request_id] = (timing, event)
        on_time = kind is EventKind.COMPLETE and not (
            timing.deadline_at is not None and event.at > timing.deadline_at
        )
        if timing.entitled:
            self.floor_ended[model, tenant] += 1
            self.floor_met[model, tenant] += on_time
            if timing.first_by is not None:
                first = timing.first_token_at
                if first is None and kind is EventKind.COMPLETE:
                    first = event.at  # not streamed: its first byte is its end
                self.floor_ttft_ended[model, tenant] += 1
                self.floor_ttft_met[model, tenant] += first is not None and first <= timing.first_by
        if kind is EventKind.COMPLETE:
            if not on_time:
                self.late[model, tenant, cls] += 1
            if timing.dispatched_at is not None:
                labels = (model, cls, timing.backend)
                self.service.observe(labels, event.at - timing.dispatched_at)
            if timing.first_token_at is None:  # not streamed: its first token is its end
                labels = (model, cls, tenant)
                self.ttft.observe(labels, event.at - timing.arrived_at)

    def totals(self) -> dict[str, int]:
        """Cumulative counts for the status page's charts (every pool, every tenant)."""
        out = {
            "entitled": 0,
            "surplus": 0,
            "late": sum(self.late.values()),
            "floor_ended": sum(self.floor_ended.values()),
            "floor_met": sum(self.floor_met.values()),
        }
        for (_, _, _, entitled), n in self.admitted.items():
            out["entitled" if entitled == "true" else "surplus"] += n
        for (_, _, _, outcome, _), n in self.outcomes.items():
            out[outcome] = out.get(outcome, 0) + n
        return out

    def attainment(self) -> dict[str, Any]:
        """`/admin/status`: per model and tenant, the floor-entitled requests ended, those
        met (completed by their deadline) and the completions after their deadline (any
        class); per class, completions and late ones. Since the guard started."""
        tenants: dict[str, dict[str, dict[str, int]]] = {}
        for (model, tenant), n in self.floor_ended.items():
            row = tenants.setdefault(model, {}).setdefault(tenant, _row())
            row["floor"] += n
            row["met"] += self.floor_met.get((model, tenant), 0)
        classes: dict[str, dict[str, int]] = {}
        for (model, tenant, cls, outcome, _), n in self.outcomes.items():
            if outcome == "complete":
                tenants.setdefault(model, {}).setdefault(tenant, _row())["completed"] += n
                classes.setdefault(cls, {"completed": 0, "late": 0})["completed"] += n
        for (model, tenant, cls), n in self.late.items():
            tenants.setdefault(model, {}).setdefault(tenant, _row())["late"] += n
            classes.setdefault(cls, {"completed": 0, "late": 0})["late"] += n
        return {"tenants": tenants, "classes": classes}

    def take_ended(self, rid: Any) -> tuple[Timing, TraceEvent] | None:
        return self.ended.pop(rid, None) if self.ended is not None else None

    def on_chunk_gap(self, model: str, cls: ContractClass, gap_s: float) -> None:
        """The silence between two chunks of a streamed reply (one token per chunk, as
        vLLM streams by default): the inter-token latency."""
        self.gaps.observe((model, _LABEL[cls]), gap_s)


def _row() -> dict[str, int]:
    return {"floor": 0, "met": 0, "completed": 0, "late": 0}


_LABEL: dict[ContractClass | EventKind | None, str] = {
    None: "none",
    **{c: c.value for c in ContractClass},
    **{k: k.value for k in EventKind},
}
"""Label values by enum member: a dict lookup per event, not an enum `.value` lookup."""


def _cls(event: TraceEvent) -> str:
    return _LABEL[event.cls]


_GAUGES: tuple[tuple[str, str, Callable[[Guard], float]], ...] = (
    ("floorguard_queued", "Requests queued in the guard", lambda g: g.num_queued),
    (
        "floorguard_queued_entitled",
        "Floor-entitled requests queued (Q_A)",
        lambda g: g.num_queued_entitled,
    ),
    ("floorguard_in_flight", "Requests in flight to backends", lambda g: g.num_in_flight),
)
"""What a pool holds now."""

_COUNTS: tuple[tuple[str, str, Callable[[Guard], float]], ...] = (
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
"""What a pool's monitors counted since it started: counters (`…_total`), read with
`rate()` / `increase()` (they were gauges, which a dashboard cannot rate)."""


@mypyc_attr(native_class=False)  # its base is prometheus-client's, which mypyc does not compile
class _GuardCollector(Collector):
    """Reads the counts and the pools' state at scrape time."""

    def __init__(self, metrics: GuardMetrics, now: Callable[[], float]) -> None:
        self._metrics = metrics
        self._now = now

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        yield _counter(
            "floorguard_requests",
            "Terminal outcomes by model, tenant, class, reason",
            ["model", "tenant", "cls", "outcome", "reason"],
            m.outcomes,
        )
        yield _counter(
            "floorguard_admitted",
            "Admissions",
            ["model", "tenant", "cls", "entitled"],
            m.admitted,
        )
        yield _counter(
            "floorguard_late",
            "Completions after their deadline",
            ["model", "tenant", "cls"],
            m.late,
        )
        yield _counter(
            "floorguard_floor_requests",
            "Floor-entitled requests that ended (any outcome): the SLO attainment's base",
            ["model", "tenant"],
            m.floor_ended,
        )
        yield _counter(
            "floorguard_floor_met",
            "Floor-entitled requests completed by their deadline: attainment = "
            "rate(floorguard_floor_met_total) / rate(floorguard_floor_requests_total)",
            ["model", "tenant"],
            m.floor_met,
        )
        yield _counter(
            "floorguard_floor_ttft_requests",
            "Floor-entitled requests of a contract with a TTFT that ended (any outcome)",
            ["model", "tenant"],
            m.floor_ttft_ended,
        )
        yield _counter(
            "floorguard_floor_ttft_met",
            "Floor-entitled requests whose first byte came by arrival + TTFT (docs/design.md "
            "§19): TTFT attainment = rate(floorguard_floor_ttft_met_total) / "
            "rate(floorguard_floor_ttft_requests_total)",
            ["model", "tenant"],
            m.floor_ttft_met,
        )
        yield _counter(
            "floorguard_tokens",
            "Tokens the backends reported (their usage; the guard's estimate where a reply "
            "ended without it), by model, tenant, class and kind",
            ["model", "tenant", "cls", "kind"],
            m.tokens,
        )
        yield _counter(
            "floorguard_usage_estimated",
            "Replies billed the guard's estimate: cut before their usage, or a backend that "
            "reported none",
            ["model", "why"],
            m.usage_estimated,
        )
        yield _counter(
            "floorguard_refused_before_admission",
            "Requests refused before admission (identity, body, fields, routing), by status "
            "and reason",
            ["status", "reason"],
            m.refused,
        )
        yield _counter(
            "floorguard_learner_callouts",
            "HTTP learner callouts by outcome",
            ["outcome"],
            {(k,): v for k, v in m.learner_callouts.items()},
        )
        yield m.queue_wait.family(
            "floorguard_queue_wait_seconds",
            "Admission to dispatch (the guard's queue)",
            ["model", "cls", "tenant"],
        )
        yield m.ttft.family(
            "floorguard_ttft_seconds",
            "Arrival to the first byte of the reply (streamed: the first token; else the end)",
            ["model", "cls", "tenant"],
        )
        yield m.service.family(
            "floorguard_service_seconds", "Dispatch to completion", ["model", "cls", "backend"]
        )
        yield m.gaps.family(
            "floorguard_inter_token_seconds",
            "Gaps between chunks of streamed replies",
            ["model", "cls"],
        )
        yield from self._pools()
        yield self._backends_up()

    def _pools(self) -> Iterator[Metric]:
        """Each pool's gauges read now: the shared store's, the guard's, the credits left."""
        store_calls = CounterMetricFamily(
            "floorguard_store_calls",
            "Shared-floor store calls by outcome (docs/replicas.md)",
            labels=["model", "outcome"],
        )
        degraded = GaugeMetricFamily(
            "floorguard_store_degraded",
            "1 while Redis is unreachable and the fallback policy grants the floor",
            labels=["model"],
        )
        replicas = GaugeMetricFamily(
            "floorguard_store_replicas",
            "The replicas live in the shared store: fail-static's ⌊B/N⌋ and the slot shares "
            "follow it (docs/replicas.md)",
            labels=["model"],
        )
        gauges: list[GaugeMetricFamily | CounterMetricFamily] = [
            GaugeMetricFamily(name, doc, labels=["model"]) for name, doc, _ in _GAUGES
        ]
        gauges += [CounterMetricFamily(name, doc, labels=["model"]) for name, doc, _ in _COUNTS]
        credits = GaugeMetricFamily(
            "floorguard_credits_left",
            "Floor credits left in the current window",
            labels=["model", "tenant"],
        )
        now, m = self._now(), self._metrics
        shared = False
        for model, (guard, floor) in m.pools.items():
            if floor is not None:
                shared = True
                for outcome, count in sorted(floor.calls.items()):
                    store_calls.add_metric([model, outcome], count)
                degraded.add_metric([model], float(floor.degraded))
                replicas.add_metric([model], float(floor.replicas))
            for family, (_, _, read) in zip(gauges, _GAUGES + _COUNTS, strict=True):
                family.add_metric([model], read(guard))
            for contract in guard.config.contracts:
                if contract.cls is ContractClass.ASSURED:
                    left = guard.credits_left(contract.tenant, now)
                    credits.add_metric([model, contract.tenant], float(left or 0))
        if shared:
            yield store_calls
            yield degraded
            yield replicas
        yield from gauges
        yield credits

    def _backends_up(self) -> GaugeMetricFamily:
        up = GaugeMetricFamily(
            "floorguard_backend_up",
            "1 while the backend answers its health probe",
            labels=["model", "backend"],
        )
        m = self._metrics
        for model, healthy in m.backends_up.items():
            ids = m._backend_ids.get(model)
            for n, ok in enumerate(healthy()):
                up.add_metric([model, ids[n] if ids else str(n)], float(ok))
        return up


def _counter(
    name: str, doc: str, labels: list[str], counts: Mapping[Any, int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, count in sorted(counts.items()):
        family.add_metric(list(key), count)
    return family
