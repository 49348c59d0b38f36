"""The offline trace checker (SPEC §8): verify a decision log against its own config.

Safety properties, each with a finite bad prefix, are checked in log order and the first
violation's position is reported:

* AF       every assured arrival that fits its window's remaining floor is admitted entitled,
           and no window grants more than `B` (recomputed from arrival times, the config's
           `W`, `t0` and meter; the guard's own window field is not trusted);
* DR       every drop satisfies `t + L(ℓ, p) > D` with the config's lower envelope (`p`: the
           prompt's tokens, its lower bound where the count was only bounded);
* ORDER    assured-first: no surplus request starts while a floor-entitled one waits;
           FIFO: requests start in admission order (a doomed one may leave whenever it
           is doomed: SPEC §12);
* SLOTS    no backend ever has more than its `C` in flight (and, across a fleet's logs, no
           backend more than its own capacity summed over the replicas);
* REQUEUE  (not a property) a request whose backend was unreachable frees its slot and waits
           again at the front of its queue;
* TERMINAL every arrival ends in exactly one terminal outcome (reject, drop, complete, fail,
           abort), and nothing ends twice or without arriving.

SF (an entitled request completes by its deadline) is conditional (SPEC §6): late
completions are reported, and fail the check only when `strict_sf` is asked for.

`check_fleet` checks the logs of replicas that share one floor (a Redis store): each log
on its own for everything but AF, and AF across all of them, per tenant and window as the
shared store reported it (its clock, not the replicas'): no window grants more than `B`,
and no request was refused from the floor while the fleet's grants left room for it. AF is
conditional on the store, as SF is on capacity: where a replica decided on its local
fallback (its log marks the degraded period with `store` events), that window's findings
are reported as conditional, not as violations.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from floorguard.core.contract import (
    CapacityAction,
    ContractClass,
    DispatchOrder,
    GuardConfig,
    MeterKind,
    reload_refusals,
)
from floorguard.core.events import (
    TERMINAL_KINDS,
    EventKind,
    TraceEvent,
    config_from_dict,
    to_json,
)
from floorguard.core.request import RequestId
from floorguard.core.surface import LOCAL_LEASE, NO_LEASE
from floorguard.errors import TraceError

__all__ = ["CheckReport", "Violation", "check_fleet", "check_trace", "format_prefix"]

ORDER_TOLERANCE_S = 0.1
"""Fleet ORDER's allowance for the replicas' clocks and the lease round trip: an entitled
request must have waited from before `t − ε` until after `t + ε` for an opportunistic start
at `t` on another replica to count against it."""

LOST_STATE = "lost-state"
"""A `store` event's reason when Redis lost a tenant's count in a window (`tenant`,
`window`): that window was closed to fresh takes, so its AF findings are conditional."""

_NOT_PER_REQUEST = frozenset(
    {
        EventKind.PROPOSE,
        EventKind.ENQUEUE,
        EventKind.FIRST_TOKEN,
        EventKind.CONFIG,
        EventKind.STORE,
        EventKind.LEASE,
    }
)


@dataclass(frozen=True)
class Violation:
    prop: str
    index: int
    """Position of the violating event in the log (0-based); the bad prefix is [0, index]."""
    request_id: RequestId | None
    message: str
    log: int = 0
    """Which log (`check_fleet`: its position in the list given)."""


@dataclass
class CheckReport:
    num_events: int = 0
    num_requests: int = 0
    num_entitled: int = 0
    num_drops: int = 0
    num_sf_late: int = 0
    violations: list[Violation] = field(default_factory=list)
    conditional: list[Violation] = field(default_factory=list)
    """AF findings in windows where a replica decided on its local fallback (the shared
    store unreachable, marked by `store` events): the floor is conditional on the store
    there, as SF is on capacity; reported, never a failure."""
    degraded_s: list[float] = field(default_factory=list)
    """Per log (`check_fleet`): seconds its shared floor spent degraded."""
    fleet_peak_in_flight: dict[str, int] = field(default_factory=dict)
    """Per backend with a recorded capacity (`check_fleet`): the most requests the fleet
    had in flight there at once."""
    counts: Counter[str] = field(default_factory=Counter)

    def failed(self, strict_sf: bool = False) -> list[Violation]:
        return [v for v in self.violations if strict_sf or v.prop != "SF"]

    def ok(self, strict_sf: bool = False) -> bool:
        return not self.failed(strict_sf)


@dataclass(slots=True)
class _Open:
    tenant: str | None
    cls: ContractClass | None
    arrival_at: float
    deadline_at: float
    num_output_tokens: int
    num_prompt_tokens: int
    prompt_tokens_lower: int
    expected_entitled: bool | None = None
    entitled: bool = False
    left_queue: bool = False
    ended: bool = False
    backend: int | None = None


def _floors_of(config: GuardConfig) -> dict[str, int]:
    return {c.tenant: c.floor for c in config.contracts if c.assured}


@dataclass
class _Floors:
    """Each configuration's floors and the first window they govern: a reload's `config`
    event names its window (SPEC §14: a window already open keeps its floors)."""

    changes: list[tuple[float, dict[str, int]]]

    def at(self, window: int) -> dict[str, int]:
        for first, floors in reversed(self.changes):
            if window >= first:
                return floors
        return self.changes[0][1]

    @property
    def tenants(self) -> set[str]:
        return {t for _, floors in self.changes for t in floors}

    @property
    def reloaded(self) -> bool:
        return len(self.changes) > 1


class _Checker:
    def __init__(
        self, config: GuardConfig, report: CheckReport, *, shared_floor: bool = False
    ) -> None:
        self.config = config
        self.report = report
        self.shared_floor = shared_floor
        """AF is judged across the fleet's logs (`check_fleet`), not per log."""
        self.floors = _Floors([(-math.inf, _floors_of(config))])
        self.used: dict[tuple[str, int], int] = {}
        self.granted: Counter[tuple[str, int]] = Counter()
        self.requests: dict[RequestId, _Open] = {}
        self.waiting_entitled: set[RequestId] = set()
        self.fifo: list[RequestId] = []
        self.fifo_head = 0
        self.in_flight = [0] * len(config.slots)
        self.index = 0

    def violate(self, prop: str, request_id: RequestId | None, message: str) -> None:
        self.report.violations.append(Violation(prop, self.index, request_id, message))

    def reload(self, event: TraceEvent, config: GuardConfig) -> None:
        """A reload's `config` event: slots and queue limits at once, floors from its
        window, which must not be open yet; what cannot change in a reload must not."""
        window = event.window
        assert window is not None
        open_window = math.floor(
            (event.at - self.config.schedule.origin_at) / self.config.schedule.window_s
        )
        if window <= open_window:
            self.violate(
                "AF",
                None,
                f"a reload at t = {event.at:.3f} gives window {window} new floors, but window "
                f"{open_window} is already open",
            )
        refusals = reload_refusals(self.config, config)
        if refusals:
            raise TraceError(
                f"event {self.index}: a reload changed what only a restart may: "
                + "; ".join(refusals)
            )
        while self.floors.changes[-1][0] >= window:  # a reload replacing one not yet in force
            self.floors.changes.pop()
        self.floors.changes.append((window, _floors_of(config)))
        self.in_flight += [0] * (len(config.slots) - len(self.in_flight))
        self.config = config

    def on_event(self, event: TraceEvent) -> None:
        kind, rid = event.kind, event.request_id
        if kind is EventKind.ARRIVE:
            self._arrive(event)
            return
        if kind in _NOT_PER_REQUEST:
            return
        state = self.requests.get(rid)  # type: ignore[arg-type]
        if state is None:
            self.violate("TERMINAL", rid, f"{kind.value} for a request that never arrived")
            return
        if state.ended:
            self.violate("TERMINAL", rid, f"{kind.value} after the request already ended")
            return
        handler = getattr(self, f"_on_{kind.value}", None)
        if handler is not None:
            handler(event, state)
        if kind in TERMINAL_KINDS:
            state.ended = True
            self.report.counts[kind.value] += 1

    def _arrive(self, event: TraceEvent) -> None:
        rid = event.request_id
        if rid in self.requests:
            self.violate("TERMINAL", rid, "arrived twice")
            return
        self.report.num_requests += 1
        state = _Open(
            event.tenant,
            event.cls,
            event.at,
            event.deadline_at if event.deadline_at is not None else math.inf,
            event.num_output_tokens or 0,
            event.num_prompt_tokens or 0,
            event.min_prompt_tokens
            if event.min_prompt_tokens is not None
            else (event.num_prompt_tokens or 0),
        )
        self.requests[rid] = state  # type: ignore[index]
        if self.shared_floor:
            return
        schedule = self.config.schedule
        window = math.floor((event.at - schedule.origin_at) / schedule.window_s)
        floor = self.floors.at(window).get(event.tenant or "")
        if floor is None:
            return
        weight = (
            state.num_prompt_tokens + state.num_output_tokens
            if self.config.meter is MeterKind.TOKEN
            else 1
        )
        key = (event.tenant or "", window)
        state.expected_entitled = self.used.get(key, 0) + weight <= floor
        if state.expected_entitled:
            self.used[key] = self.used.get(key, 0) + weight
            self.report.num_entitled += 1

    def _decided(self, state: _Open, rid: RequestId | None, entitled: bool, what: str) -> None:
        if state.expected_entitled and not entitled:
            self.violate("AF", rid, f"floor-entitled assured request was {what}")
        if entitled and state.expected_entitled is False:
            self.violate("AF", rid, "admitted from the floor beyond B in its window")
        state.expected_entitled = None  # decided once

    def _on_admit(self, event: TraceEvent, state: _Open) -> None:
        state.entitled = bool(event.entitled)
        if self.shared_floor and state.entitled:
            self.report.num_entitled += 1
        if state.expected_entitled is not None:
            self._decided(state, event.request_id, state.entitled, "admitted as surplus")
        if state.entitled:
            self.waiting_entitled.add(event.request_id)  # type: ignore[arg-type]
        self.fifo.append(event.request_id)  # type: ignore[arg-type]

    def _on_demote(self, event: TraceEvent, state: _Open) -> None:
        if state.expected_entitled is not None:
            self._decided(state, event.request_id, False, "demoted")

    def _on_reject(self, event: TraceEvent, state: _Open) -> None:
        if (
            state.expected_entitled
            and event.reason == "floor_lowered"
            and (self.config.capacity_action is CapacityAction.LOWER_FLOOR)
        ):
            # The config lowers the floor under measured capacity loss (SPEC §4.4): this
            # entitled request was refused by that policy; it still counts against B.
            state.expected_entitled = None
        if state.expected_entitled is not None:
            self._decided(state, event.request_id, False, f"rejected ({event.reason})")

    def _leave_queue(self, event: TraceEvent, state: _Open, *, started: bool = True) -> None:
        """ORDER judges starts; a doomed request may be dropped whenever it is doomed (the
        guard's doom timer), whatever waits beside it."""
        rid = event.request_id
        dispatch = self.config.dispatch
        if (
            started
            and dispatch is DispatchOrder.ASSURED_FIRST
            and not state.entitled
            and self.waiting_entitled
        ):
            self.violate(
                "ORDER",
                rid,
                f"surplus request left the queue while "
                f"{len(self.waiting_entitled)} floor-entitled waited",
            )
        self.waiting_entitled.discard(rid)
        if dispatch is DispatchOrder.FIFO and started:
            self._skip_left()
            if self.fifo_head < len(self.fifo) and self.fifo[self.fifo_head] != rid:
                self.violate("ORDER", rid, "FIFO dispatch out of admission order")
        state.left_queue = True

    def _skip_left(self) -> None:
        fifo, requests = self.fifo, self.requests
        while self.fifo_head < len(fifo) and requests[fifo[self.fifo_head]].left_queue:
            self.fifo_head += 1

    def _on_dispatch(self, event: TraceEvent, state: _Open) -> None:
        self._leave_queue(event, state)
        backend = event.backend if event.backend is not None else 0
        if not 0 <= backend < len(self.in_flight):
            self.violate("SLOTS", event.request_id, f"dispatched to unknown backend {backend}")
            return
        state.backend = backend
        self.in_flight[backend] += 1
        if self.in_flight[backend] > self.config.slots[backend]:
            self.violate(
                "SLOTS",
                event.request_id,
                f"backend {backend} has {self.in_flight[backend]} in flight > C = "
                f"{self.config.slots[backend]}",
            )

    def _on_drop(self, event: TraceEvent, state: _Open) -> None:
        self._leave_queue(event, state, started=False)
        self.report.num_drops += 1
        lower = self.config.lower_envelope
        if lower is None:
            self.violate("DR", event.request_id, "dropped, but the config has no lower envelope")
        elif not event.at + lower.at(*self._sizes(state)) > state.deadline_at:
            slack = state.deadline_at - event.at - lower.at(*self._sizes(state))
            self.violate(
                "DR",
                event.request_id,
                f"dropped with t + L(ℓ) ≤ D (slack {slack * 1e3:.1f} ms): not doomed",
            )

    @staticmethod
    def _sizes(state: _Open) -> tuple[int, int]:
        """(ℓ, the prompt tokens `L` may count: the lower bound where the count was one)."""
        return state.num_output_tokens, state.prompt_tokens_lower

    def _on_requeue(self, event: TraceEvent, state: _Open) -> None:
        """Its backend was unreachable: the slot is free and the request waits again, in
        its old place (the front of its queue)."""
        self._free(state)
        state.left_queue = False
        if state.entitled:
            self.waiting_entitled.add(event.request_id)  # type: ignore[arg-type]
        if self.config.dispatch is DispatchOrder.FIFO:
            self._skip_left()
            self.fifo.insert(self.fifo_head, event.request_id)  # type: ignore[arg-type]

    def _free(self, state: _Open) -> None:
        if state.backend is not None:
            self.in_flight[state.backend] -= 1
            state.backend = None

    def _on_complete(self, event: TraceEvent, state: _Open) -> None:
        self._free(state)
        if state.entitled and event.at > state.deadline_at:
            self.report.num_sf_late += 1
            self.violate(
                "SF",
                event.request_id,
                f"floor-entitled request completed "
                f"{(event.at - state.deadline_at) * 1e3:.1f} ms after its deadline",
            )

    def _on_fail(self, event: TraceEvent, state: _Open) -> None:
        self._free(state)

    def _on_abort(self, event: TraceEvent, state: _Open) -> None:
        self._free(state)
        state.left_queue = True
        self.waiting_entitled.discard(event.request_id)


def check_trace(events: Iterable[TraceEvent], *, allow_open: bool = False) -> CheckReport:
    """Check a whole log. `allow_open` accepts requests still open at the end (a live log)."""
    report = CheckReport()
    _check_one(events, report, allow_open=allow_open, shared_floor=False)
    return report


def check_fleet(logs: Sequence[Sequence[TraceEvent]], *, allow_open: bool = False) -> CheckReport:
    """Check the logs of replicas sharing one floor; each violation names its log
    (`Violation.log`, the position in `logs`). Logs of several pools are checked pool by
    pool (each pool is a fleet of its own)."""
    pools = {e.pool for events in logs for e in events}
    if pools == {None}:
        return _check_fleet_pool(logs, allow_open)
    report = CheckReport()
    for pool in sorted(pools, key=str):
        positions = [[i for i, e in enumerate(events) if e.pool == pool] for events in logs]
        part = _check_fleet_pool(
            [[events[i] for i in at] for events, at in zip(logs, positions, strict=True)],
            allow_open,
        )
        for name in ("num_events", "num_requests", "num_entitled", "num_drops", "num_sf_late"):
            setattr(report, name, getattr(report, name) + getattr(part, name))
        for found, into in (
            (part.violations, report.violations),
            (part.conditional, report.conditional),
        ):
            into.extend(
                replace(
                    v,
                    index=positions[v.log][v.index]
                    if v.index < len(positions[v.log])
                    else len(logs[v.log]),
                )
                for v in found
            )
        report.degraded_s = [
            a + b
            for a, b in zip(
                report.degraded_s or [0.0] * len(logs),
                part.degraded_s or [0.0] * len(logs),
                strict=True,
            )
        ]
        report.fleet_peak_in_flight |= part.fleet_peak_in_flight
        report.counts.update(part.counts)
    return report


def _check_fleet_pool(logs: Sequence[Sequence[TraceEvent]], allow_open: bool) -> CheckReport:
    report = CheckReport()
    checkers = []
    for number, events in enumerate(logs):
        start = len(report.violations)
        checkers.append(_check_one(events, report, allow_open=allow_open, shared_floor=True))
        report.violations[start:] = [replace(v, log=number) for v in report.violations[start:]]
    configs = [c.config for c in checkers]
    floors = [c.floors for c in checkers]
    if not any(f.reloaded for f in floors) and any(
        f.changes[0][1] != floors[0].changes[0][1] for f in floors
    ):
        raise TraceError("the logs' configs give different floors: not one fleet")
    if configs:
        _fleet_af(logs, configs[0], floors, report)
        _fleet_slots(logs, configs, report)
        if any(c.slot_leases for c in configs):
            _fleet_order(logs, configs, report)
    return report


def _waits_and_starts(
    events: Sequence[TraceEvent], config: GuardConfig
) -> tuple[list[tuple[float, float]], list[tuple[float, str, int, bool, RequestId | None]]]:
    """One log's floor-entitled waits (admitted → started, dropped or ended; a `no_lease`
    requeue undoes a start, so the wait goes on) and its opportunistic starts per backend
    (with the same undoing), each with whether its lease was granted locally (`local`:
    the store was unreachable, so no waiting board was consulted)."""
    ids = config.backend_ids or tuple(str(i) for i in range(len(config.slots)))
    start = EventKind.LEASE if config.slot_leases else EventKind.DISPATCH
    entitled: set[RequestId] = set()
    waiting: dict[RequestId, float] = {}
    started: dict[RequestId, tuple[float, float]] = {}
    waits: list[tuple[float, float]] = []
    starts: dict[RequestId, tuple[float, str, int, bool]] = {}
    for index, e in enumerate(events):
        rid = e.request_id
        if rid is None:
            continue
        if e.kind is EventKind.ADMIT and e.entitled:
            entitled.add(rid)
            waiting[rid] = e.at
        elif e.kind is start and e.backend is not None:
            if rid in waiting:
                started[rid] = (waiting.pop(rid), e.at)
            elif rid not in entitled:
                starts[rid] = (e.at, ids[e.backend], index, e.reason == LOCAL_LEASE)
        elif e.kind is EventKind.REQUEUE:
            if rid in started:
                since, at = started.pop(rid)
                if e.reason == NO_LEASE:
                    waiting[rid] = since
                else:
                    waits.append((since, at))
                    waiting[rid] = e.at
            elif e.reason == NO_LEASE:
                starts.pop(rid, None)
        elif e.kind in TERMINAL_KINDS and rid in waiting:
            waits.append((waiting.pop(rid), e.at))
    waits += started.values()
    waits += [(since, math.inf) for since in waiting.values()]
    return waits, [(*start, rid) for rid, start in starts.items()]


def _fleet_order(
    logs: Sequence[Sequence[TraceEvent]], configs: Sequence[GuardConfig], report: CheckReport
) -> None:
    """Fleet-wide assured-first with slot leases: no opportunistic request starts on a
    backend while another replica in front of it has a floor-entitled request waiting
    (from before `t − ε` until after `t + ε`, ε = `ORDER_TOLERANCE_S`). A start on a
    lease granted locally (the store unreachable) is judged conditionally: no replica
    could consult the waiting board."""
    per_log = [_waits_and_starts(events, c) for events, c in zip(logs, configs, strict=True)]
    fronts = [set(c.backend_ids or tuple(str(i) for i in range(len(c.slots)))) for c in configs]
    eps = ORDER_TOLERANCE_S
    for number, (_, starts) in enumerate(per_log):
        for at, backend, index, local, rid in starts:
            for other, (waits, _) in enumerate(per_log):
                if other == number or backend not in fronts[other]:
                    continue
                if any(since < at - eps and until > at + eps for since, until in waits):
                    (report.conditional if local else report.violations).append(
                        Violation(
                            "ORDER",
                            index,
                            rid,
                            f"fleet: an opportunistic request started on {backend} at "
                            f"t = {at:.3f} while log {other} had a floor-entitled request "
                            "waiting for it",
                            log=number,
                        )
                    )
                    break


_RELEASES = frozenset({EventKind.COMPLETE, EventKind.FAIL, EventKind.ABORT, EventKind.REQUEUE})


_Change = tuple[float, int, str, int, int, RequestId | None]


def _slot_changes(
    number: int, events: Sequence[TraceEvent], config: GuardConfig
) -> list[_Change | None]:
    """+1 at each start (the `lease` event with fleet-wide leases, else `dispatch`), −1 at
    each end or requeue, per backend id; a dispatch the fleet gave no lease (`no_lease`
    requeue) is voided (None): it never reached the backend."""
    backend_ids = config.backend_ids
    start = EventKind.LEASE if config.slot_leases else EventKind.DISPATCH
    changes: list[_Change | None] = []
    at_backend: dict[RequestId, tuple[str, int]] = {}
    unleased: dict[RequestId, int] = {}
    for index, e in enumerate(events):
        if e.request_id is None:
            continue
        if config.slot_leases and e.kind is EventKind.DISPATCH:
            unleased[e.request_id] = index
        elif e.kind is EventKind.LEASE or (e.kind is EventKind.REQUEUE and e.reason == NO_LEASE):
            unleased.pop(e.request_id, None)
        elif e.kind in TERMINAL_KINDS and e.request_id in unleased:
            at = unleased.pop(e.request_id)
            changes.append((e.at, 0, "", number, at, e.request_id))  # reported below
        if e.kind is start and e.backend is not None:
            backend = backend_ids[e.backend]
            at_backend[e.request_id] = (backend, len(changes))
            changes.append((e.at, 1, backend, number, index, e.request_id))
        elif e.kind in _RELEASES and e.request_id in at_backend:
            backend, started = at_backend.pop(e.request_id)
            if e.kind is EventKind.REQUEUE and e.reason == NO_LEASE:
                changes[started] = None
                continue
            changes.append((e.at, -1, backend, number, index, e.request_id))
    return changes


def _fleet_slots(
    logs: Sequence[Sequence[TraceEvent]], configs: Sequence[GuardConfig], report: CheckReport
) -> None:
    """SLOTS per backend across the fleet: requests in flight at a backend (dispatched,
    not yet ended or requeued), summed over every replica's log on one time line, never
    more than the backend's own capacity as the logs record it (`backend_capacity`, keyed
    by `backend_ids`). Backends without a recorded capacity are not judged fleet-wide
    (each log's own SLOTS check still holds). The logs' clocks are the replicas': a
    release and a start at one instant count the release first."""
    capacity: dict[str, int] = {}
    for config in configs:
        for i, c in enumerate(config.backend_capacity):
            if c is not None and config.backend_ids:
                capacity[config.backend_ids[i]] = min(c, capacity.get(config.backend_ids[i], c))
    if not capacity:
        return
    changes = [
        change
        for number, (events, config) in enumerate(zip(logs, configs, strict=True))
        if config.backend_ids
        for change in _slot_changes(number, events, config)
        if change is not None
    ]
    in_flight: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    for at, delta, backend, number, index, rid in sorted(changes, key=lambda c: (c[0], c[1])):
        if delta == 0:
            report.violations.append(
                Violation(
                    "SLOTS",
                    index,
                    rid,
                    "fleet: dispatched with leased slots but no lease was logged for it",
                    log=number,
                )
            )
            continue
        in_flight[backend] += delta
        peak[backend] = max(peak[backend], in_flight[backend])
        limit = capacity.get(backend)
        if delta > 0 and limit is not None and in_flight[backend] > limit:
            report.violations.append(
                Violation(
                    "SLOTS",
                    index,
                    rid,
                    f"fleet: {backend} had {in_flight[backend]} in flight across the "
                    f"replicas at t = {at:.3f} > its capacity {limit}",
                    log=number,
                )
            )
    report.fleet_peak_in_flight = dict(peak)


@dataclass
class _FleetFloor:
    """What the fleet's logs say about each (tenant, window) of the floor."""

    granted: Counter[tuple[str, int]] = field(default_factory=Counter)
    judged: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    """The floors the replicas' decisions were judged against (the store pins one)."""
    local: set[tuple[str, int]] = field(default_factory=set)
    """Decided by some replica on its store's fallback."""
    refused: list[tuple[str, int, int, int, RequestId | None, int, int, str]] = field(
        default_factory=list
    )
    """(tenant, window, weight, the floor it was judged against, id, log, index, state)."""


def _store_event(e: TraceEvent, state: str, since: float, fleet: _FleetFloor) -> float:
    """A `store` event: a lost state marks its (tenant, window); a return to `shared` ends
    a degraded period (its seconds are returned)."""
    if e.reason == LOST_STATE:
        if e.tenant is not None and e.window is not None:
            fleet.local.add((e.tenant, e.window))
        return 0.0
    return e.at - since if state != "shared" and e.reason == "shared" else 0.0


def _scan_log(
    number: int,
    events: Sequence[TraceEvent],
    config: GuardConfig,
    floors: _Floors,
    fleet: _FleetFloor,
) -> float:
    """Add one log's floor decisions to `fleet`, each with the floor it was judged against:
    as the store pinned it, where the event says so; else the log's own, in force when
    the request arrived (the replica's clock: its window may end before the store's
    answer names the next one). Return the seconds its store was degraded."""
    tenants = floors.tenants
    weights: dict[RequestId, int] = {}
    arrived: dict[RequestId, int] = {}
    state, since, degraded_s = "shared", 0.0, 0.0
    for index, e in enumerate(events):
        if e.kind is EventKind.STORE:
            degraded_s += _store_event(e, state, since, fleet)
            if e.reason != LOST_STATE:
                if (state == "shared") != (e.reason == "shared"):
                    since = e.at
                state = e.reason or "shared"
            continue
        if e.tenant not in tenants or e.request_id is None:
            continue
        if e.kind is EventKind.ARRIVE:
            arrived[e.request_id] = config.schedule.index_at(e.at)
            weights[e.request_id] = (
                (e.num_prompt_tokens or 0) + (e.num_output_tokens or 0)
                if config.meter is MeterKind.TOKEN
                else 1
            )
            continue
        if e.window is None:
            continue
        key = (e.tenant, e.window)
        weight = weights.get(e.request_id, 1)
        own = floors.at(arrived.get(e.request_id, e.window)).get(e.tenant, 0)
        judged = e.floor if e.floor is not None else own
        if (e.kind is EventKind.ADMIT and e.entitled) or (
            e.kind is EventKind.REJECT and e.reason == "floor_lowered"
        ):
            fleet.granted[key] += weight
        elif e.kind is EventKind.DEMOTE or (
            e.kind is EventKind.REJECT and e.reason == "floor_exhausted"
        ):
            fleet.refused.append((*key, weight, judged, e.request_id, number, index, state))
        else:
            continue
        fleet.judged.setdefault(key, set()).add(judged)
        if state != "shared":
            fleet.local.add(key)
    if state != "shared" and events:
        degraded_s += events[-1].at - since
    return degraded_s


def _fleet_af(
    logs: Sequence[Sequence[TraceEvent]],
    config: GuardConfig,
    floors: Sequence[_Floors],
    report: CheckReport,
) -> None:
    """AF across replicas, per (tenant, window the store reported). A (tenant, window) in
    which some replica decided while its store was degraded (between `store` events) is
    judged conditionally: its findings go to `report.conditional`. Where a reload reached
    the replicas at different times, the store pins each window's floor at its first take:
    every replica's decisions there must be judged against that one floor (one
    configuration per window), none granted beyond it, none refused below it."""
    fleet = _FleetFloor()
    report.degraded_s = [
        _scan_log(number, events, config, floors[number], fleet)
        for number, events in enumerate(logs)
    ]
    for (tenant, window), judged in sorted(fleet.judged.items()):
        if len(judged) > 1:
            conditional = (tenant, window) in fleet.local
            (report.conditional if conditional else report.violations).append(
                Violation(
                    "AF",
                    0,
                    None,
                    f"fleet: the replicas judged {tenant}'s window {window} against "
                    f"different floors {sorted(judged)}: not one configuration",
                )
            )
        known = {f.at(w).get(tenant) for f in floors for w in (window - 1, window)}
        if not judged <= known and (tenant, window) not in fleet.local:
            report.violations.append(
                Violation(
                    "AF",
                    0,
                    None,
                    f"fleet: {tenant}'s window {window} was judged against floor(s) "
                    f"{sorted(judged - known)} that no replica's configuration gives it",
                )
            )
    for (tenant, window), total in sorted(fleet.granted.items()):
        limit = max(fleet.judged[tenant, window])
        if total > limit:
            conditional = (tenant, window) in fleet.local
            (report.conditional if conditional else report.violations).append(
                Violation(
                    "AF",
                    0,
                    None,
                    f"fleet: {tenant} was granted {total} > B = {limit} from the "
                    f"floor in window {window}"
                    + (
                        " (the store's fallback or a lost state decided there)"
                        if conditional
                        else ""
                    ),
                )
            )
    for tenant, window, weight, floor, rid, number, index, state in fleet.refused:
        if fleet.granted[tenant, window] + weight <= floor:
            conditional = (tenant, window) in fleet.local
            why = (
                f" (store {state}: the documented fallback)"
                if state != "shared"
                else " (the store's fallback or a lost state decided in that window)"
                if conditional
                else ""
            )
            (report.conditional if conditional else report.violations).append(
                Violation(
                    "AF",
                    index,
                    rid,
                    f"fleet: refused from the floor in window {window} while the fleet "
                    f"granted {fleet.granted[tenant, window]} of B = {floor}{why}",
                    log=number,
                )
            )


def _check_one(
    events: Iterable[TraceEvent], report: CheckReport, *, allow_open: bool, shared_floor: bool
) -> _Checker:
    """Check one log; a log of several pools (`models:`, events tagged with `pool`) is
    checked per pool, each against its own config events (a reload's names the window its
    floors govern from). Returns the (first pool's) checker."""
    checkers: dict[str | None, _Checker] = {}
    index = -1
    for index, event in enumerate(events):
        report.num_events += 1
        if event.kind is EventKind.CONFIG:
            if event.data is None:
                raise TraceError("config event without a configuration")
            config = config_from_dict(event.data)
            known = checkers.get(event.pool)
            if known is not None and event.window is not None:
                known.index = index
                known.reload(event, config)
            else:
                checkers[event.pool] = _Checker(config, report, shared_floor=shared_floor)
            continue
        checker = checkers.get(event.pool)
        if checker is None:
            if not checkers:
                raise TraceError(
                    "the trace must start with a config event (a rotated segment after the "
                    "first? `floorguard verify LOG --rotated` reads them all as one log)"
                )
            raise TraceError(f"event {index} of pool {event.pool!r} before its config event")
        checker.index = index
        checker.on_event(event)
    if not checkers:
        raise TraceError("the trace has no config event")
    if not allow_open:
        for checker in checkers.values():
            checker.index = index + 1
            for rid, state in checker.requests.items():
                if not state.ended:
                    checker.violate("TERMINAL", rid, "no terminal outcome by the end of the log")
    return next(iter(checkers.values()))


def format_prefix(events: Sequence[TraceEvent], violation: Violation, context: int = 8) -> str:
    """The tail of the shortest bad prefix, ending at the violating event."""
    start = max(0, violation.index - context + 1)
    lines = [
        f"  {i:>7}  {to_json(e)}"
        for i, e in enumerate(events[start : violation.index + 1], start=start)
    ]
    head = (
        f"first violation: {violation.prop} at event {violation.index} "
        f"(request {violation.request_id!r}): {violation.message}"
    )
    return "\n".join([head, f"bad prefix: events 0..{violation.index}; its last lines:", *lines])
