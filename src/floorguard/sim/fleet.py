"""The datacenter in the simulator (SPEC §13): `R` guard replicas sharing one floor store,
`M` backends of `C` slots, `T` assured tenants, behind a load balancer that may be skewed.

Every replica is the shipped `Guard`; the store is the shipped `SharedFloor` policy over a
simulated Redis (`store/simulated.py`: `acquire.lua`'s semantics on the virtual clock, held
to the real script by a differential test; a configurable round trip, and an outage window
during which every call fails). Slots are either
*partitioned* — each replica owns `M/R` whole backends (C slots each) — or *leased*: every
replica dispatches into one fleet-wide pool, and a replica starts an opportunistic request
only while no other replica has a floor-entitled request waiting (the waiting board of
`store/lease.lua`, with no round trip). The decision logs of all replicas pass
`check_fleet` (AF across replicas, SLOTS per backend across replicas, and ORDER across
replicas when leased).
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from floorguard.analysis.checker import check_fleet
from floorguard.analysis.records import fold_trace
from floorguard.core.contract import (
    Contract,
    ContractClass,
    GuardConfig,
    QueueLimits,
    WindowSchedule,
)
from floorguard.core.dispatcher import SlotPool
from floorguard.core.events import EventKind, TraceEvent
from floorguard.core.guard import Guard
from floorguard.core.learner import consult
from floorguard.core.request import Request, RequestId
from floorguard.core.surface import Dispatch, Pending, StoreCall
from floorguard.experiments.figures import subplots
from floorguard.learners.adversaries import AlwaysAdmit
from floorguard.profiles import get_profile
from floorguard.sim.backend import SimBackend, create_backend
from floorguard.sim.engine import Engine, Priority
from floorguard.sim.targets import saturated_capacity
from floorguard.store.shared import SharedFloor, Unavailable
from floorguard.store.simulated import SimulatedRedis

__all__ = ["Fleet", "FleetResult", "SlotMode", "fleet_figure", "simulate_fleet"]

SlotMode = Literal["partition", "leased"]


@dataclass(frozen=True)
class Fleet:
    """One datacenter scenario. Defaults: a small fleet that runs in about a second."""

    replicas: int = 3
    backends: int = 6
    slots: int = 4
    """`C` of every backend."""
    tenants: int = 12
    """Assured tenants; each offers exactly `floor` requests per window (paced)."""
    floor: int = 1
    opportunistic_per_s: float | None = None
    """The opportunistic flood (Poisson, one tenant); None: twice the fleet's capacity."""
    skew: float = 0.0
    """The load balancer's skew: replica `r` gets a share ∝ (r + 1)^−skew (0: even)."""
    slot_mode: SlotMode = "leased"
    store_rtt_s: float = 0.0005
    """The floor store's round trip: an assured decision lands this long after arrival."""
    store_outage: tuple[float, float] | None = None
    """Redis unreachable during [start, end) seconds: replicas fall back to fail-static."""
    duration_s: float = 12.0
    deadline_ms: float = 1820.0
    tokens: int = 16
    profile: str = "v100-moe"
    queue_per_backend: int = 2
    """A replica's surplus queue limit, per slot of its fair share (`C·M/R`, in both slot
    modes): the flood is refused beyond it, not queued without end."""

    def __post_init__(self) -> None:
        if self.slot_mode == "partition" and self.backends % self.replicas:
            raise ValueError(
                f"a partition gives each replica whole backends: {self.backends} backends "
                f"do not divide among {self.replicas} replicas"
            )


@dataclass
class FleetResult:
    fleet: Fleet
    seed: int
    num_requests: int
    assured_offered: int
    floor_entitled: int
    """Floor-entitled arrivals: min(B, offered) per tenant and window, fleet-wide."""
    floor_admitted: int
    """Of them, admitted from the floor."""
    assured_late: int
    """Floor-admitted assured requests that completed after their deadline."""
    assured_p99_ms: float
    opportunistic_offered: int
    opportunistic_completed: int
    peak_in_flight: int
    """The most requests any backend held at once (≤ C)."""
    utilization: float
    """Busy slot-seconds over the fleet's slot-seconds while the arrivals last."""
    verify_ok: bool
    violations: list[str] = field(default_factory=list)
    conditional: int = 0
    checked_peak: int = 0
    """The most in flight at one backend as `check_fleet` counted it from the logs."""
    wall_s: float = 0.0

    @property
    def requests_per_wall_s(self) -> float:
        return self.num_requests / self.wall_s if self.wall_s else math.inf

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fleet"] = asdict(self.fleet)
        out["requests_per_wall_s"] = self.requests_per_wall_s
        return out


@functools.cache
def _mu_sat(profile: str, tokens: int, slots: int) -> float:
    """One backend's saturated throughput (requests/s), measured on the backend model."""
    return saturated_capacity(get_profile(profile), tokens, slots)[0]


class FleetSlots:
    """One pool of every backend's `C` slots, shared by the replicas' views."""

    def __init__(self, slots: Sequence[int]) -> None:
        self.capacity = tuple(slots)
        self.free = list(slots)
        self.total_free = sum(slots)
        self._by_free: list[set[int]] = [set() for _ in range(max(slots) + 1)]
        for backend, c in enumerate(slots):
            self._by_free[c].add(backend)

    def take(self) -> int:
        """The backend with the most free slots (spreads load; never past its `C`)."""
        for count in range(len(self._by_free) - 1, 0, -1):
            if self._by_free[count]:
                backend = next(iter(self._by_free[count]))
                self._move(backend, -1)
                return backend
        raise RuntimeError("take() with no free slot")

    def give(self, backend: int) -> None:
        self._move(backend, +1)

    def _move(self, backend: int, delta: int) -> None:
        self._by_free[self.free[backend]].discard(backend)
        self.free[backend] += delta
        self._by_free[self.free[backend]].add(backend)
        self.total_free += delta


class LeasedSlots(SlotPool):
    """A replica's view of the fleet's pool: free slots are the fleet's, but only for a
    floor-entitled start while another replica has an entitled request waiting (the lease
    script's rule, with no round trip: the replica's own entitled requests come first in
    its queue, so while it has one queued its next start is entitled)."""

    def __init__(
        self, fleet: FleetSlots, own_waiting: Callable[[], int], others_waiting: Callable[[], bool]
    ) -> None:
        self._fleet = fleet
        self.capacity = fleet.capacity
        self._own_waiting = own_waiting
        self._others_waiting = others_waiting

    @property
    def num_free(self) -> int:
        """The pool's attribute, computed for this view (never set)."""
        free = self._fleet.total_free
        if free and not self._own_waiting() and self._others_waiting():
            return 0
        return free

    @num_free.setter
    def num_free(self, value: int) -> None:  # pragma: no cover
        raise AttributeError("a view's free slots are the fleet's")

    def acquire(self) -> int:
        return self._fleet.take()

    def release(self, backend: int) -> None:
        self._fleet.give(backend)

    def set_available(self, backend: int, available: bool) -> None:  # pragma: no cover
        raise NotImplementedError("the fleet simulation keeps every backend up")

    def acquire_on(self, backend: int) -> None:  # pragma: no cover
        raise NotImplementedError("leased slots are taken by the pool's own choice")

    def in_flight(self, backend: int) -> int:
        return self.capacity[backend] - self._fleet.free[backend]


class _FleetSimulation:
    def __init__(self, fleet: Fleet, seed: int) -> None:
        self.fleet = fleet
        self.engine = Engine()
        rng = np.random.default_rng(seed)
        self.rng = rng
        profile = get_profile(fleet.profile)
        self.backends: list[SimBackend] = [
            create_backend(profile, fleet.slots, r) for r in rng.spawn(fleet.backends)
        ]
        self._versions = [0] * fleet.backends
        self.busy_s = 0.0
        self.peak = 0
        self.schedule = WindowSchedule(1.0)
        redis_ = SimulatedRedis(outage=fleet.store_outage)
        self.logs: list[list[TraceEvent]] = [[] for _ in range(fleet.replicas)]
        self.floors = [
            SharedFloor(
                redis_.client(f"r{replica}"),  # type: ignore[arg-type]  # the script, simulated
                policy=Unavailable.FAIL_STATIC,
                replicas=fleet.replicas,
                retry_s=0.5,
                clock=lambda: self.engine.now,
                attempts=1,
                backoff_s=0.0,
                on_change=self._marker(replica),
            )
            for replica in range(fleet.replicas)
        ]
        self.pool = FleetSlots([fleet.slots] * fleet.backends)
        per = fleet.backends // fleet.replicas
        self.owned = (
            [list(range(r * per, (r + 1) * per)) for r in range(fleet.replicas)]
            if fleet.slot_mode == "partition"
            else [list(range(fleet.backends)) for _ in range(fleet.replicas)]
        )
        self.guards = [self._guard(r) for r in range(fleet.replicas)]
        self._classes = {c.tenant: c.cls for c in self.guards[0].config.contracts}
        self.owner: dict[RequestId, int] = {}
        self.learner = AlwaysAdmit()
        self._others_waiting = False
        """While one replica polls: whether another has a floor-entitled request waiting
        (their queues do not change during its poll)."""
        self._entitled_at: set[int] = set()
        """Replicas with a floor-entitled request queued (kept by the driver, which sees
        every admission and start)."""
        self._turn = 0

    def _marker(self, replica: int) -> Callable[[str, float], None]:
        """The replica's log marks its store's degraded periods, as the HTTP guard's does."""
        return lambda state, now: self.logs[replica].append(
            TraceEvent(now, EventKind.STORE, reason=state)
        )

    def _guard(self, replica: int) -> Guard:
        fleet = self.fleet
        mine = self.owned[replica]
        contracts = [
            Contract(f"t{t}", ContractClass.ASSURED, fleet.deadline_ms / 1e3, fleet.floor)
            for t in range(fleet.tenants)
        ]
        contracts.append(Contract("flood", ContractClass.OPPORTUNISTIC, fleet.deadline_ms / 1e3))
        config = GuardConfig(
            contracts=tuple(contracts),
            schedule=self.schedule,
            slots=tuple(fleet.slots for _ in mine),
            queue_limits=QueueLimits(
                opportunistic=fleet.queue_per_backend
                * fleet.slots
                * fleet.backends
                // fleet.replicas
            ),
            backend_ids=tuple(f"b{b}" for b in mine),
            backend_capacity=tuple(fleet.slots for _ in mine),
            slot_leases=fleet.slot_mode == "leased",
        )
        pool = None
        if fleet.slot_mode == "leased":
            pool = LeasedSlots(
                self.pool,
                lambda: self.guards[replica].num_queued_entitled,
                lambda: self._others_waiting,
            )
        return Guard(
            config,
            learner=None,
            store=self.floors[replica],
            sink=self.logs[replica].append,
            slot_pool=pool,
        )

    # -- arrivals -------------------------------------------------------------------------

    def offer(self) -> int:
        """Schedule every arrival; return how many."""
        fleet, rng = self.fleet, self.rng
        weights = np.array([(r + 1.0) ** -fleet.skew for r in range(fleet.replicas)])
        weights /= weights.sum()
        arrivals: list[tuple[float, str]] = []
        for t in range(fleet.tenants):  # each assured tenant: exactly B per window, paced
            phase = rng.uniform(0, 1.0 / fleet.floor)
            n = int(fleet.duration_s * fleet.floor)
            arrivals += [(phase + i / fleet.floor, f"t{t}") for i in range(n)]
        capacity = fleet.backends * _mu_sat(fleet.profile, fleet.tokens, fleet.slots)
        rate = fleet.opportunistic_per_s if fleet.opportunistic_per_s is not None else 2 * capacity
        at = 0.0
        while rate > 0:
            at += rng.exponential(1 / rate)
            if at >= fleet.duration_s:
                break
            arrivals.append((at, "flood"))
        arrivals.sort()
        replicas = rng.choice(fleet.replicas, size=len(arrivals), p=weights)
        self.engine.preload(
            Priority.ARRIVAL,
            self.on_arrival,
            [at for at, _ in arrivals],
            [
                (int(r), Request(f"r{r}-{n}", tenant, at, fleet.tokens))
                for n, ((at, tenant), r) in enumerate(zip(arrivals, replicas, strict=True))
            ],
        )
        return len(arrivals)

    def on_arrival(self, payload: tuple[int, Request], now: float) -> None:
        replica, request = payload
        self.owner[request.request_id] = replica
        pending = self.guards[replica].begin_arrival(request, now, scheduled_at=request.arrival_at)
        if type(pending.need) is StoreCall:
            self.engine.schedule(
                now + self.fleet.store_rtt_s, Priority.ARRIVAL, self.on_store, (replica, pending)
            )
        else:
            self._decide(replica, pending, now)

    def on_store(self, payload: tuple[int, Pending], now: float) -> None:
        replica, pending = payload
        need = pending.need
        assert type(need) is StoreCall
        grant = self.floors[replica].acquire(
            need.key, need.weight, need.capacity, self.schedule, now
        )
        self._decide(replica, self.guards[replica].continue_arrival(pending, now, grant), now)

    def _decide(self, replica: int, pending: Pending, now: float) -> None:
        guard = self.guards[replica]
        need = pending.need
        if need is not None:  # a learner ask: the surplus learner answers at once
            answer = consult(self.learner, need.request, need.cls, need.load, now)  # type: ignore[union-attr]
            guard.continue_arrival(pending, now, answer)
        if guard.num_queued_entitled:
            self._entitled_at.add(replica)
        self._dispatch([replica], now)

    # -- dispatch and completion ----------------------------------------------------------

    def _dispatch(self, replicas: Sequence[int], now: float) -> None:
        """Hand free slots out. Partition: poll the given replicas (each owns its slots).
        Leased: replicas with a floor-entitled request waiting first (the order the waiting
        board gives freed slots), then the others in turn, until the fleet has none free."""
        if self.fleet.slot_mode == "partition":
            for replica in replicas:
                self._poll(replica, now)
            return
        if not self.pool.total_free:
            return  # every slot of the fleet busy: arrivals queue, nothing to start
        for replica in sorted(self._entitled_at):
            self._others_waiting = len(self._entitled_at) > 1
            self._poll(replica, now)
            if not self.pool.total_free:
                return
        self._others_waiting = bool(self._entitled_at)
        count = len(self.guards)
        for step in range(count):
            if not self.pool.total_free or self._others_waiting:
                break
            replica = (self._turn + step) % count
            self._poll(replica, now)
        self._turn = (self._turn + 1) % count

    def _poll(self, replica: int, now: float) -> None:
        guard = self.guards[replica]
        touched: set[int] = set()
        leased = self.fleet.slot_mode == "leased"
        for decision in guard.poll(now):
            if type(decision) is Dispatch:
                backend = self.owned[replica][decision.backend]
                self.backends[backend].join(decision.request, now)
                touched.add(backend)
                if leased:  # the pool's slot is its lease (no round trip here)
                    request = decision.request
                    self.logs[replica].append(
                        TraceEvent(
                            now,
                            EventKind.LEASE,
                            request.request_id,
                            request.tenant,
                            self._classes[request.tenant],
                            backend=decision.backend,
                            entitled=decision.entitled,
                        )
                    )
        if not guard.num_queued_entitled:
            self._entitled_at.discard(replica)
        for backend in touched:
            self.peak = max(self.peak, self.fleet.slots - self._free(backend))
            self._reschedule(backend)

    def _free(self, backend: int) -> int:
        if self.fleet.slot_mode == "leased":
            return self.pool.free[backend]
        replica = backend // (self.fleet.backends // self.fleet.replicas)
        local = self.owned[replica].index(backend)
        return self.fleet.slots - self.guards[replica].in_flight_on(local)

    def _reschedule(self, backend: int) -> None:
        self._versions[backend] += 1
        at = self.backends[backend].next_completion_at()
        if at is not None:
            self.engine.schedule(
                at, Priority.COMPLETION, self.on_completion, (backend, self._versions[backend])
            )

    def on_completion(self, payload: tuple[int, int], now: float) -> None:
        backend, version = payload
        if version != self._versions[backend]:
            return
        owners = []
        for request_id in self.backends[backend].complete_due(now):
            replica = self.owner.pop(request_id)
            self.guards[replica].on_complete(request_id, now)
            owners.append(replica)
        self._reschedule(backend)
        self._dispatch(owners, now)


def simulate_fleet(fleet: Fleet, *, seed: int = 0, verify: bool = True) -> FleetResult:
    """One seeded run of `fleet`: every request ends in one terminal outcome; the replicas'
    logs are checked with `check_fleet`."""
    started = time.perf_counter()
    sim = _FleetSimulation(fleet, seed)
    num_requests = sim.offer()
    sim.engine.run()
    if any(g.num_in_flight or g.num_queued for g in sim.guards):
        raise RuntimeError("the fleet simulation ended with work left")
    wall_s = time.perf_counter() - started
    records = [r for log in sim.logs for r in fold_trace(log).records]
    assured = [r for r in records if r.cls is ContractClass.ASSURED]
    offered: Counter[tuple[str, int]] = Counter()
    for r in assured:
        offered[r.tenant, math.floor(r.arrival_at)] += 1
    entitled_total = sum(min(fleet.floor, n) for n in offered.values())
    floor_admitted = [r for r in assured if r.entitled]
    sojourns = [r.sojourn_s for r in floor_admitted if r.outcome == "completed"]
    flood = [r for r in records if r.cls is ContractClass.OPPORTUNISTIC]
    busy = sum(  # slot-seconds busy while the arrivals last (not the drain after)
        max(0.0, min(r.ended_at, fleet.duration_s) - r.dispatched_at)
        for r in records
        if r.outcome == "completed"
    )
    report = check_fleet(sim.logs) if verify else None
    return FleetResult(
        fleet,
        seed,
        num_requests,
        len(assured),
        entitled_total,
        len(floor_admitted),
        sum(r.late for r in floor_admitted),
        float(np.percentile(sojourns, 99) * 1e3) if sojourns else math.nan,
        len(flood),
        sum(r.outcome == "completed" for r in flood),
        sim.peak,
        busy / (fleet.backends * fleet.slots * fleet.duration_s),
        report.ok() if report is not None else True,
        [f"{v.prop}: {v.message}" for v in report.failed()[:5]] if report is not None else [],
        len(report.conditional) if report is not None else 0,
        max(report.fleet_peak_in_flight.values(), default=0) if report is not None else 0,
        wall_s,
    )


def fleet_figure(results: Sequence[FleetResult], path: Path) -> Path:
    """Partitioned against leased slots across the load balancer's skew: the fleet's slot
    utilization and opportunistic goodput (left), the assured p99 sojourn (right)."""
    fig, (left, right) = subplots(1, 2, figsize=(11, 4.2))
    for mode, color in (("partition", "tab:orange"), ("leased", "tab:blue")):
        runs = sorted((r for r in results if r.fleet.slot_mode == mode), key=lambda r: r.fleet.skew)
        if not runs:
            continue
        skews = [r.fleet.skew for r in runs]
        left.plot(skews, [r.utilization for r in runs], marker="o", color=color, label=mode)
        right.plot(skews, [r.assured_p99_ms for r in runs], marker="o", color=color, label=mode)
    f = results[0].fleet
    left.set(
        xlabel="load-balancer skew s (replica r's share ∝ (r+1)^−s)",
        ylabel="busy slot-seconds / fleet slot-seconds",
        ylim=(0, 1.05),
        title="Slot utilization",
    )
    right.set(
        xlabel="load-balancer skew s",
        ylabel="floor-admitted assured p99 sojourn (ms)",
        title=f"Assured p99 (deadline {f.deadline_ms:.0f} ms)",
    )
    right.axhline(f.deadline_ms, color="gray", ls=":", lw=1)
    for ax in (left, right):
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{f.replicas} replicas × {f.backends} backends (C = {f.slots}) × {f.tenants} assured "
        f"tenants, flood at 2× capacity",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
