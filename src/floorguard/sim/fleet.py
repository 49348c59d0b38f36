"""The datacenter in the simulator (docs/design.md §13): `R` guard replicas sharing one floor store,
`M` backends of `C` slots, `T` assured tenants, behind a load balancer that may be skewed.

Every replica is the shipped `Guard`; the store is the shipped `SharedFloor` policy over a
simulated Redis (`store/simulated.py`: `acquire.lua`'s and `lease.lua`'s semantics on the
virtual clock, held to the real scripts by differential tests; a configurable round trip,
and an outage window during which every call fails). Slots are either *partitioned* — each
replica owns `M/R` whole backends (C slots each) — or *leased*: every replica's guard
offers every backend's `C` slots, and each start first takes a lease through the shipped
`SlotLeases` policy (the waiting board; while the store is down, each replica keeps the
slots it held); a start the fleet has no lease for waits again (`no_lease`) and its
backend is held off, as the guard core decides for the HTTP guard. The decision logs of
all replicas pass `check_fleet` (AF across replicas, SLOTS per backend across replicas,
and ORDER across replicas when leased).
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

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
from floorguard.core.events import TraceEvent
from floorguard.core.guard import Guard
from floorguard.core.learner import consult
from floorguard.core.leasing import lease_answered, nothing_to_start, slots_changed
from floorguard.core.request import Request, RequestId
from floorguard.core.surface import Dispatch, Pending, StoreCall
from floorguard.learners.registry import create_learner
from floorguard.profiles import get_profile
from floorguard.sim.backend import create_backend
from floorguard.sim.engine import Engine, Priority
from floorguard.sim.serving import Serving
from floorguard.sim.targets import saturated_capacity
from floorguard.store.base import StoreUnavailable
from floorguard.store.leases import LeaseCall, LeaseReply, SlotLeases
from floorguard.store.plan import Plan, run_plan
from floorguard.store.shared import SharedFloor, Unavailable
from floorguard.store.simulated import SimulatedRedis

__all__ = ["Fleet", "FleetResult", "SlotMode", "simulate_fleet"]

SlotMode = Literal["partition", "leased"]
_T = TypeVar("_T")


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
    """Redis unreachable during [start, end) seconds: replicas fall back to fail-static
    (the floor) and to local leases in the slots each replica held (leased slots)."""
    lease_ttl_s: float = 2.0
    """The slot leases' expiry (`store.lease_ttl_s`); renewed every quarter of it."""
    window_s: float = 1.0
    """W: the floor's tumbling window (each tenant offers `floor` per window)."""
    learner: str = "always-admit"
    """The surplus learner, by the name `serve`'s `learner` takes (`create_learner`)."""
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
    lease_calls: int = 0
    """Runs of the lease script (acquire, release, renew) by every replica."""
    no_lease: int = 0
    """Starts the fleet had no lease for (each waited again, its backend held off)."""
    local_grants: int = 0
    """Leases granted locally (in the slots a replica held) while the store was down."""
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


class _FleetSimulation(Serving):
    def __init__(self, fleet: Fleet, seed: int) -> None:
        self.fleet = fleet
        rng = np.random.default_rng(seed)
        self.rng = rng
        profile = get_profile(fleet.profile)
        super().__init__(
            Engine(), [create_backend(profile, fleet.slots, r) for r in rng.spawn(fleet.backends)]
        )
        self.running = [0] * fleet.backends
        """Requests in flight on each backend, fleet-wide."""
        self.peak = 0
        self.schedule = WindowSchedule(fleet.window_s)
        self.redis = SimulatedRedis(outage=fleet.store_outage)
        self.logs: list[list[TraceEvent]] = [[] for _ in range(fleet.replicas)]
        per = fleet.backends // fleet.replicas
        self.owned = (
            [list(range(r * per, (r + 1) * per)) for r in range(fleet.replicas)]
            if fleet.slot_mode == "partition"
            else [list(range(fleet.backends)) for _ in range(fleet.replicas)]
        )
        self.floors: list[SharedFloor] = []
        self.guards: list[Guard] = []
        for replica in range(fleet.replicas):
            floor = SharedFloor(
                self.redis.client(f"r{replica}"),
                policy=Unavailable.FAIL_STATIC,
                replicas=fleet.replicas,
                retry_s=0.5,
                clock=lambda: self.engine.now,
                attempts=1,
                backoff_s=0.0,
                on_change=self._marker(replica),
            )
            self.floors.append(floor)
            self.guards.append(self._guard(replica, floor))
        self.leases = [self._leases(r) for r in range(fleet.replicas)]
        self.owner: dict[RequestId, int] = {}
        self.learner = create_learner(fleet.learner, rng)
        self._wake_at = [math.inf] * fleet.replicas
        self.lease_calls = 0
        self.no_lease = 0

    def _marker(self, replica: int) -> Callable[[str, float], None]:
        """The replica's log marks its store's degraded periods, as the HTTP guard's does."""
        return lambda state, now: self.guards[replica].store_changed(now, state)

    def _guard(self, replica: int, floor: SharedFloor) -> Guard:
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
        return Guard(config, learner=None, store=floor, sink=self.logs[replica].append)

    def _leases(self, replica: int) -> SlotLeases | None:
        """The shipped lease policy over the simulated Redis, on the virtual clock."""
        fleet = self.fleet
        if fleet.slot_mode != "leased":
            return None
        guard = self.guards[replica]
        return SlotLeases(
            None,  # the simulation drives the plans over the simulated Redis
            backends=[f"b{b}" for b in range(fleet.backends)],
            capacity=[fleet.slots] * fleet.backends,
            replica=f"r{replica}",
            ttl_s=fleet.lease_ttl_s,
            waiting=lambda: guard.num_waiting_entitled,
            surplus=lambda: guard.num_queued - guard.num_queued_entitled,
            on_handed=lambda backend: self.engine.schedule(
                self.engine.now, Priority.ARRIVAL, self.on_handed, (replica, backend)
            ),
            on_change=lambda state: slots_changed(guard, state, self.engine.now),
            clock=lambda: self.engine.now,
        )

    # -- arrivals -------------------------------------------------------------------------

    def offer(self) -> int:
        """Schedule every arrival (and the leases' renewals); return how many."""
        fleet, rng = self.fleet, self.rng
        weights = np.array([(r + 1.0) ** -fleet.skew for r in range(fleet.replicas)])
        weights /= weights.sum()
        arrivals: list[tuple[float, str]] = []
        for t in range(fleet.tenants):  # each assured tenant: exactly B per window, paced
            spacing = fleet.window_s / fleet.floor
            phase = rng.uniform(0, spacing)
            n = int(fleet.duration_s / fleet.window_s * fleet.floor)
            arrivals += [(phase + i * spacing, f"t{t}") for i in range(n)]
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
        for replica, leases in enumerate(self.leases):
            if leases is not None:
                self.engine.schedule(leases.ttl_s / 4, Priority.ARRIVAL, self.on_renew, replica)
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
            need.key, need.weight, need.capacity, self.schedule, need.at, floor=need.floor
        )
        self._decide(replica, self.guards[replica].continue_arrival(pending, now, grant), now)

    def _decide(self, replica: int, pending: Pending, now: float) -> None:
        guard = self.guards[replica]
        need = pending.need
        if need is not None:  # a learner ask: the surplus learner answers at once
            answer = consult(self.learner, need.request, need.cls, need.load, now)  # type: ignore[union-attr]
            pending = guard.continue_arrival(pending, now, answer)
        leases = self.leases[replica]
        admission = pending.admission
        if leases is not None and admission is not None and admission.entitled:
            self._finish_plan(leases.plan_announce())
        self._poll(replica, now)

    # -- dispatch, leases and completion ----------------------------------------------------

    def _poll(self, replica: int, now: float) -> None:
        """The replica's pump: fill its slots; with leased slots each start first takes a
        lease (the shipped `SlotLeases` plan, the script run when sent and its answer a
        store round trip later); then keep the wake-up on the guard's `next_wake_at`."""
        guard, leases = self.guards[replica], self.leases[replica]
        for decision in guard.poll(now):
            if type(decision) is not Dispatch:
                continue
            if not decision.lease:
                self._start(replica, decision, now)
                continue
            assert leases is not None  # leased slots: the replica has the fleet's leases
            request = decision.request
            plan = leases.plan_acquire(
                decision.backend, str(request.request_id), entitled=decision.entitled
            )
            try:
                call = next(plan)
            except StopIteration as handed:  # a slot handed to this replica: no call
                self._leased(replica, decision, handed.value, now)
                continue
            reply = self._lease_call(call)
            self.engine.schedule(
                now + self.fleet.store_rtt_s,
                Priority.ARRIVAL,
                self.on_lease,
                (replica, decision, plan, reply),
            )
        if leases is not None and nothing_to_start(guard) and leases.holds_handed():
            self._finish_plan(leases.plan_pass_on())  # nothing left to start on them
        self._arm(replica)

    def on_lease(self, payload: tuple[int, Dispatch, Plan[str], object], now: float) -> None:
        replica, decision, plan, reply = payload
        self._leased(replica, decision, self._finish_plan(plan, reply), now)
        self._poll(replica, now)

    def _leased(self, replica: int, decision: Dispatch, why: str, now: float) -> None:
        """The lease's answer, `why` not ('' to start), carried to the guard."""
        guard, leases = self.guards[replica], self.leases[replica]
        assert leases is not None
        if lease_answered(guard, leases, decision, why, now):
            self._start(replica, decision, now)
        else:  # on the waiting board: a slot is handed over, or the renewal looks again
            self.no_lease += 1

    def _finish_plan(self, plan: Plan[_T], reply: object = None) -> _T:
        """Send a call's reply (None: start the plan); run every further call the plan
        asks for at once (a release, a renewal, the leases restored after an outage)."""
        return run_plan(plan, self._lease_call, answer=reply)

    def _lease_call(self, call: LeaseCall) -> LeaseReply | StoreUnavailable:
        """One run of the simulated `lease.lua`; each slot it hands another replica is
        published to it, delivered half a round trip later (the caller learns its own
        from the reply)."""
        self.lease_calls += 1
        try:
            reply = self.redis.client(call.replica).lease(call)
        except StoreUnavailable as exc:
            return exc
        for to, member in reply.handed:
            if to != call.replica:
                at = self.engine.now + self.fleet.store_rtt_s / 2
                message = (int(to[1:]), call.backend, member)
                self.engine.schedule(at, Priority.ARRIVAL, self.on_message, message)
        return reply

    def on_message(self, message: tuple[int, str, str], now: float) -> None:
        """A hand-over published to a replica (`handed_channel` in the HTTP guard)."""
        replica, backend, member = message
        leases = self.leases[replica]
        assert leases is not None
        leases.on_message(backend, member)

    def on_handed(self, handed: tuple[int, int], now: float) -> None:
        """A slot handed to the replica: it offers the backend again and starts there."""
        replica, backend = handed
        guard, leases = self.guards[replica], self.leases[replica]
        assert leases is not None
        guard.lease_handed(backend, now)
        self._poll(replica, now)  # hands it on if nothing is left to start

    def _arm(self, replica: int) -> None:
        """One wake-up per replica at its guard's `next_wake_at` (a held-off backend)."""
        at = self.guards[replica].next_wake_at()
        if at is None or at >= self._wake_at[replica]:
            return
        self._wake_at[replica] = at
        self.engine.schedule(max(at, self.engine.now), Priority.ARRIVAL, self.on_wake, replica)

    def on_wake(self, replica: int, now: float) -> None:
        if now < self._wake_at[replica]:
            return  # superseded by an earlier one that already ran
        self._wake_at[replica] = math.inf
        self._poll(replica, now)

    def on_renew(self, replica: int, now: float) -> None:
        leases = self.leases[replica]
        assert leases is not None
        self._finish_plan(leases.plan_renew())
        guard = self.guards[replica]
        if now < self.fleet.duration_s or guard.num_in_flight or guard.num_queued:
            self.engine.schedule(now + leases.ttl_s / 4, Priority.ARRIVAL, self.on_renew, replica)

    def _start(self, replica: int, decision: Dispatch, now: float) -> None:
        backend = self.owned[replica][decision.backend]
        self.backends[backend].join(decision.request, now)
        self.running[backend] += 1
        self.peak = max(self.peak, self.running[backend])
        self.reschedule(backend)

    def on_completion(self, backend: int, done: list[RequestId], now: float) -> None:
        owners = []
        for request_id in done:
            replica = self.owner.pop(request_id)
            self.running[backend] -= 1
            leases = self.leases[replica]
            if leases is not None:  # the release carries the count as of the end
                local = self.owned[replica].index(backend)
                self._finish_plan(leases.plan_release(local, str(request_id), leases.waiting()))
            self.guards[replica].finish(request_id, now, "complete")
            owners.append(replica)
        self.reschedule(backend)
        for replica in dict.fromkeys(owners):
            self._poll(replica, now)


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
        sim.lease_calls,
        sim.no_lease,
        sum(leases.local_grants for leases in sim.leases if leases is not None),
        wall_s,
    )
