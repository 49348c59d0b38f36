"""The checks across a fleet's logs (docs/design.md §13, `check_fleet`): fleet ORDER with slot
leases, SLOTS per backend summed over the replicas, and AF per tenant and window as the
shared store reported it."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from floorguard.analysis.report import (
    LOST_STATE,
    ORDER_TOLERANCE_S,
    CheckReport,
    Floors,
    Violation,
)
from floorguard.core.contract import (
    GuardConfig,
    MeterKind,
)
from floorguard.core.events import (
    TERMINAL_KINDS,
    EventKind,
    TraceEvent,
)
from floorguard.core.request import RequestId
from floorguard.core.surface import LOCAL_LEASE, NO_LEASE, SLOTS_LOST, SLOTS_UNREACHABLE

__all__ = ["fleet_af", "fleet_order", "fleet_slots"]


_Start = tuple[float, str, int, bool, RequestId | None]


def _waits_and_starts(
    events: Sequence[TraceEvent], config: GuardConfig
) -> tuple[list[tuple[float, float]], list[_Start]]:
    """One log's floor-entitled waits (admitted → started, dropped or ended; a `no_lease`
    requeue undoes a start, so the wait goes on) and its opportunistic starts per backend
    (with the same undoing), each with whether its lease was granted locally (`local`:
    the store was unreachable, so no waiting board was consulted). A wait its replica's
    death cut (a new life starts in the log, or the log ends with it open: a replica
    killed for good) ends with the last line of that life: its request died with it."""
    ids = config.backend_ids or tuple(str(i) for i in range(len(config.slots)))
    lives = [
        i for i, e in enumerate(events) if e.kind is EventKind.CONFIG and e.window is None and i
    ]
    waits: list[tuple[float, float]] = []
    starts: list[_Start] = []
    for lo, hi in zip([0, *lives], [*lives, len(events)], strict=True):
        life_waits, life_starts = _one_life(events, lo, hi, ids, config.slot_leases)
        waits += life_waits
        starts += life_starts
    return waits, starts


def _one_life(
    events: Sequence[TraceEvent], lo: int, hi: int, ids: Sequence[str], leased: bool
) -> tuple[list[tuple[float, float]], list[_Start]]:
    """`_waits_and_starts` for the lines `lo` to `hi` (one life of the replica)."""
    start = EventKind.LEASE if leased else EventKind.DISPATCH
    entitled: set[RequestId] = set()
    waiting: dict[RequestId, float] = {}
    started: dict[RequestId, tuple[float, float]] = {}
    waits: list[tuple[float, float]] = []
    starts: dict[RequestId, tuple[float, str, int, bool]] = {}
    for index in range(lo, hi):
        e = events[index]
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
    last = events[hi - 1].at if hi > lo else 0.0
    waits += started.values()
    waits += [(since, last) for since in waiting.values()]
    return waits, [(*start, rid) for rid, start in starts.items()]


_SLOTS = "slots-"
"""The prefix of a `store` event's reason that is the slot leases' state (`SLOTS_*`)."""


def _off_board(logs: Sequence[Sequence[TraceEvent]]) -> list[list[tuple[float, float]]]:
    """Per log, the spans in which its replica's waiting requests could not be on the
    pool's waiting board, as its own log proves: from `slots-unreachable` until its next
    `slots-*` event (it reached the store again), and from the first `slots-lost-state`
    any replica logged after this one's last until this one's own (the store lost the
    board, and this replica had not called since)."""
    changes = [
        [(e.at, e.reason) for e in events if e.kind is EventKind.STORE
         and (e.reason or "").startswith(_SLOTS)]
        for events in logs
    ]  # fmt: skip
    losses = sorted(at for log in changes for at, reason in log if reason == SLOTS_LOST)
    spans: list[list[tuple[float, float]]] = []
    for log in changes:
        mine: list[tuple[float, float]] = []
        away: float | None = None
        last_loss = -math.inf
        for at, reason in log:
            if away is not None:
                mine.append((away, at))
                away = None
            if reason == SLOTS_UNREACHABLE:
                away = at
            elif reason == SLOTS_LOST:
                first = losses[bisect.bisect_right(losses, last_loss)]
                if first < at:
                    mine.append((first, at))
                last_loss = at
        if away is not None:
            mine.append((away, math.inf))
        spans.append(mine)
    return spans


def _within(spans: Sequence[tuple[float, float]], at: float) -> bool:
    return any(since <= at < until for since, until in spans)


class _Cover:
    """Waits (since, until), asked whether one began before `a` and lasted past `b`: the
    waits sorted by their start, with the latest end of each prefix (a bisection per
    question, not a scan: a fleet run asks it for every opportunistic start)."""

    def __init__(self, waits: Sequence[tuple[float, float]]) -> None:
        ordered = sorted(waits)
        self.starts = [since for since, _ in ordered]
        self.latest = list(itertools.accumulate((until for _, until in ordered), max))

    def spans(self, a: float, b: float) -> bool:
        began = bisect.bisect_left(self.starts, a)  # the waits with since < a
        return began > 0 and self.latest[began - 1] > b


def fleet_order(
    logs: Sequence[Sequence[TraceEvent]], configs: Sequence[GuardConfig], report: CheckReport
) -> None:
    """Fleet-wide assured-first with slot leases: no opportunistic request starts on a
    backend while another replica in front of it has a floor-entitled request waiting
    (from before `t − ε` until after `t + ε`, ε = `ORDER_TOLERANCE_S`). A start on a
    lease granted locally (the store unreachable) is judged conditionally: no replica
    could consult the waiting board; so is one while the replica whose entitled request
    waits could not be on the board, as its log proves (`_off_board`: its store
    unreachable, or its state lost and this replica not yet called since)."""
    per_log = [_waits_and_starts(events, c) for events, c in zip(logs, configs, strict=True)]
    off_board = _off_board(logs)
    fronts = [set(c.backend_ids or tuple(str(i) for i in range(len(c.slots)))) for c in configs]
    covers = [_Cover(waits) for waits, _ in per_log]
    eps = ORDER_TOLERANCE_S
    for number, (_, starts) in enumerate(per_log):
        for at, backend, index, local, rid in starts:
            for other, cover in enumerate(covers):
                if other == number or backend not in fronts[other]:
                    continue
                if cover.spans(at - eps, at + eps):
                    unseen = _within(off_board[other], at)
                    why = (
                        f" (log {other}'s replica could not be on the waiting board: its "
                        "store unreachable, or its state lost)"
                        if unseen
                        else ""
                    )
                    (report.conditional if local or unseen else report.violations).append(
                        Violation(
                            "ORDER",
                            index,
                            rid,
                            f"fleet: an opportunistic request started on {backend} at "
                            f"t = {at:.3f} while log {other} had a floor-entitled request "
                            f"waiting for it{why}",
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
    each end or requeue, per backend id, and for what a replica held when it died, where
    its log starts a new life; a dispatch the fleet gave no lease (`no_lease` requeue) is
    voided (None): it never reached the backend."""
    backend_ids = config.backend_ids
    start = EventKind.LEASE if config.slot_leases else EventKind.DISPATCH
    changes: list[_Change | None] = []
    at_backend: dict[RequestId, tuple[str, int]] = {}
    unleased: dict[RequestId, int] = {}
    for index, e in enumerate(events):
        if e.kind is EventKind.CONFIG and e.window is None and index > 0:
            # a new life: the replica died with these in flight; they are counted until it
            # starts again (a backend may run them a little longer: docs/replicas.md)
            for rid, (backend, _) in at_backend.items():
                changes.append((e.at, -1, backend, number, index, rid))
            at_backend.clear()
            unleased.clear()
            continue
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


def fleet_slots(
    logs: Sequence[Sequence[TraceEvent]], configs: Sequence[GuardConfig], report: CheckReport
) -> None:
    """SLOTS per backend across the fleet: requests in flight at a backend (dispatched,
    not yet ended or requeued), summed over every replica's log on one time line, never
    more than the backend's own capacity as the logs record it (`backend_capacity`, keyed
    by `backend_ids`). Backends without a recorded capacity are not judged fleet-wide
    (each log's own SLOTS check still holds), but their peaks are counted. The logs'
    clocks are the replicas': a release and a start at one instant count the release
    first."""
    capacity: dict[str, int] = {}
    for config in configs:
        for i, c in enumerate(config.backend_capacity):
            if c is not None and config.backend_ids:
                capacity[config.backend_ids[i]] = min(c, capacity.get(config.backend_ids[i], c))
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
    dark: set[int] = field(default_factory=set)
    """Windows in which a replica died: its last decisions there may never have reached
    its log (written in batches), so the fleet's grants there are not all known."""
    refused: list[tuple[str, int, int, int, RequestId | None, int, int, str]] = field(
        default_factory=list
    )
    """(tenant, window, weight, the floor it was judged against, id, log, index, state)."""


def _floor_state(e: TraceEvent, state: str, since: float) -> tuple[str, float]:
    """The shared floor's state after a `store` event, and since when it is degraded (a
    lost state, or the slot leases' state, leaves both alone)."""
    if e.reason == LOST_STATE or (e.reason or "").startswith(_SLOTS):
        return state, since
    if (state == "shared") != (e.reason == "shared"):
        since = e.at
    return e.reason or "shared", since


def _store_event(e: TraceEvent, state: str, since: float, fleet: _FleetFloor) -> float:
    """A `store` event: a lost state marks its (tenant, window); a return to `shared` ends
    a degraded period (its seconds are returned); the slot leases' state is not the
    floor's (`fleet_order` reads it)."""
    if (e.reason or "").startswith(_SLOTS):
        return 0.0
    if e.reason == LOST_STATE:
        if e.tenant is not None and e.window is not None:
            fleet.local.add((e.tenant, e.window))
        return 0.0
    return e.at - since if state != "shared" and e.reason == "shared" else 0.0


def _dark_windows(events: Sequence[TraceEvent], config: GuardConfig) -> set[int]:
    """The windows between a dead life's last line and the config line of the new life
    that follows it: the dead one's unwritten decisions fall there."""
    dark: set[int] = set()
    for before, e in itertools.pairwise(events):
        if e.kind is EventKind.CONFIG and e.window is None:
            first, last = (config.schedule.index_at(t) for t in (before.at, e.at))
            dark.update(range(first, last + 1))
    return dark


def _scan_log(
    number: int,
    events: Sequence[TraceEvent],
    config: GuardConfig,
    floors: Floors,
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
    fleet.dark.update(_dark_windows(events, config))
    for index, e in enumerate(events):
        if e.kind is EventKind.STORE:
            degraded_s += _store_event(e, state, since, fleet)
            state, since = _floor_state(e, state, since)
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


def fleet_af(
    logs: Sequence[Sequence[TraceEvent]],
    config: GuardConfig,
    floors: Sequence[Floors],
    report: CheckReport,
) -> None:
    """AF across replicas, per (tenant, window the store reported). More than `B` granted
    from a window's floor is a violation whatever the store did (a fault is not a
    condition). A refusal inside the floor, or floors that disagree, in a (tenant, window)
    in which some replica decided while its store was degraded (between `store` events) or
    lost its state is judged conditionally: its findings go to `report.conditional`. Where
    a reload reached the replicas at different times, the store pins each window's floor at
    its first take:
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
        if total > limit:  # a fault is not a condition: past B is a violation, whatever
            report.violations.append(  # the store did
                Violation(
                    "AF",
                    0,
                    None,
                    f"fleet: {tenant} was granted {total} > B = {limit} from the "
                    f"floor in window {window}"
                    + (
                        " (the store's fallback or a lost state decided there)"
                        if (tenant, window) in fleet.local
                        else ""
                    ),
                )
            )
    for tenant, window, weight, floor, rid, number, index, state in fleet.refused:
        if fleet.granted[tenant, window] + weight <= floor:
            dark = window in fleet.dark
            conditional = (tenant, window) in fleet.local or dark
            why = (
                f" (store {state}: the documented fallback)"
                if state != "shared"
                else " (a replica died in that window: its last grants never reached its log)"
                if dark
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
