"""The datacenter in the simulator (docs/design.md §13): `R` guard replicas sharing one floor store,
`M` backends of `C` slots, `T` assured tenants, behind a load balancer that may be skewed.

Every replica is what `serve` builds from its configuration: `Fleet.config` writes each
replica's `GuardServerConfig` (W, the contracts, the backends, the store's section, the
learner, the queue limits), and the replica's guard is `pool_guard`'s (the pool's guard
builder: the configuration's core, its slot shares, its learner) over the shipped
`SharedFloor` policy with the store section's settings. The store is a simulated Redis
(`store/simulated.py`: `acquire.lua`'s and `lease.lua`'s semantics on the virtual clock,
held to the real scripts by differential tests; a configurable round trip, and an outage
window during which every call fails). Slots are either *partitioned* — each replica's
configuration lists its own `M/R` whole backends — or *leased*: every replica lists every
backend, and what follows each start is the pool's `LeaseFlow` (a lease taken through the
shipped `SlotLeases` policy and its waiting board, hand-overs, hand-ons, releases), its plans
carried here over the simulated script as the HTTP guard carries them over Redis. The
decision logs of all replicas pass `check_fleet` (AF across replicas, SLOTS per backend
across replicas where a backend's capacity is declared, ORDER across replicas when leased).

It sits above `proxy/` in the layer list: it builds replicas from the HTTP guard's own
configuration objects and builder, on `sim/`'s engine and backend model.
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

from floorguard.analysis.checker import check_fleet
from floorguard.analysis.records import fold_trace
from floorguard.core.contract import ContractClass
from floorguard.core.events import TraceEvent
from floorguard.core.guard import Guard
from floorguard.core.leasing import LeaseFlow
from floorguard.core.request import Request, RequestId
from floorguard.core.surface import PAST_DOOM_S, Dispatch, LearnerAsk, Pending, StoreCall
from floorguard.profiles import get_profile
from floorguard.proxy.config.guard import BackendSpec, GuardServerConfig
from floorguard.proxy.pool.build import pool_floor, pool_guard
from floorguard.proxy.pool.shares import slot_shares
from floorguard.sim.backend import create_backend
from floorguard.sim.engine import Engine, Priority
from floorguard.sim.serving import Serving
from floorguard.sim.targets import saturated_capacity
from floorguard.store.base import StoreUnavailable
from floorguard.store.leases import LeaseCall, LeaseReply, pool_tag
from floorguard.store.plan import Plan, run_plan
from floorguard.store.shared import SharedFloor
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

    def owned(self, replica: int) -> list[int]:
        """The backends `replica` lists: its `M/R` whole ones (partition), or every one."""
        if self.slot_mode == "leased":
            return list(range(self.backends))
        per = self.backends // self.replicas
        return list(range(replica * per, (replica + 1) * per))

    def config(self, replica: int) -> GuardServerConfig:
        """Replica `replica`'s configuration, as `serve` reads it from YAML: the assured
        tenants and the flood, its backends (a partition lists its own and declares no
        capacity, so its share of each is the whole `C`; leased replicas declare it), the
        store's section (the configured replica count, the slot mode, the lease TTL; the
        rest `serve`'s defaults), W, the learner, the profile and the surplus queue."""
        leased = self.slot_mode == "leased"
        contracts: list[dict[str, Any]] = [
            {"tenant": f"t{t}", "class": "assured", "deadline_ms": self.deadline_ms,
             "floor": self.floor}
            for t in range(self.tenants)
        ]  # fmt: skip
        contracts.append(
            {"tenant": "flood", "class": "opportunistic", "deadline_ms": self.deadline_ms}
        )
        return GuardServerConfig.model_validate(
            {
                "window_s": self.window_s,
                "contracts": contracts,
                "backends": [
                    {"url": f"http://b{b}", "slots": self.slots}
                    | ({"capacity": self.slots} if leased else {})
                    for b in self.owned(replica)
                ],
                "identity": {"mode": "header", "header": "x-tenant",
                             "trusted_upstreams": ["10.0.0.1/32"]},
                "store": {"url": "redis://simulated", "replicas": self.replicas,
                          "slots": self.slot_mode, "lease_ttl_s": self.lease_ttl_s},
                "replica": f"r{replica}",
                "learner": self.learner,
                "profile": self.profile,
                "limits": {"default_max_tokens": self.tokens},
                "queue": {"max_opportunistic": self.queue_per_backend * self.slots
                          * self.backends // self.replicas},
            }
        )  # fmt: skip


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


def _no_wait(_seconds: float) -> None:
    """A retry's backoff on the virtual clock: the next attempt is sent at once."""


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
        self.redis = SimulatedRedis(outage=fleet.store_outage)
        self.logs: list[list[TraceEvent]] = [[] for _ in range(fleet.replicas)]
        self.owned = [fleet.owned(r) for r in range(fleet.replicas)]
        self.configs = [fleet.config(r) for r in range(fleet.replicas)]
        self.floors: list[SharedFloor] = []
        self.guards: list[Guard] = []
        self.flows: list[LeaseFlow | None] = []
        for replica, config in enumerate(self.configs):
            self._build(replica, config, int(rng.integers(2**32)))
        self.owner: dict[RequestId, int] = {}
        self._wake_at = [math.inf] * fleet.replicas
        self.lease_calls = 0
        self.no_lease = 0

    def _build(self, replica: int, config: GuardServerConfig, seed: int) -> None:
        """One replica as `serve` builds its pool: the shared floor, the guard core (its
        shares, its learner), and the leased starts' flow."""
        store = config.store
        assert store is not None
        now = self.engine.now
        floor = pool_floor(
            store,
            self.redis.client(f"r{replica}"),
            clock=lambda: self.engine.now,
            on_change=lambda state, at: self.guards[replica].store_changed(at, state),
            on_lost_state=lambda tenant, window, at: self.guards[replica].store_changed(
                at, "lost-state", tenant, window
            ),
        )
        partitioned = store.slots == "partition"

        def shares(
            backends: Sequence[BackendSpec], removed: frozenset[int], count: int
        ) -> tuple[int, ...]:
            return config.capped(  # as `PoolFleet.shares`: the TPOT's width cap too
                slot_shares(
                    backends, removed, count, partitioned=partitioned, capacity_of=_declared
                )
            )

        guard = pool_guard(
            config,
            shares=shares,
            floor=floor,
            asks_over_http=False,
            sink=self.logs[replica].append,
            seed=seed,
            now=now,
        )
        flow = None
        if not partitioned:
            flow = LeaseFlow(
                None,  # the simulation carries the plans over the simulated Redis
                lambda: self.engine.now,
                backends=[b.url.rstrip("/") for b in config.backends],
                capacity=[b.slots for b in config.backends],
                replica=f"r{replica}",
                ttl_s=store.lease_ttl_s,
                on_handed=lambda backend: self.engine.schedule(
                    self.engine.now, Priority.ARRIVAL, self.on_handed, (replica, backend)
                ),
                script_clock=lambda: self.engine.now,
                pool=pool_tag(None),
            )
            flow.serve(guard)
        self.floors.append(floor)
        self.guards.append(guard)
        self.flows.append(flow)

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
        for replica, flow in enumerate(self.flows):
            if flow is not None:
                at = flow.leases.ttl_s / 4
                self.engine.schedule(at, Priority.ARRIVAL, self.on_renew, replica)
        return len(arrivals)

    def on_arrival(self, payload: tuple[int, Request], now: float) -> None:
        replica, request = payload
        self.owner[request.request_id] = replica
        pending = self.guards[replica].begin_arrival(request, now, scheduled_at=request.arrival_at)
        self._admit(replica, pending, now)

    def _admit(self, replica: int, pending: Pending, now: float) -> None:
        """The arrival's needs answered as the pool answers them: the shared floor a store
        round trip later, the learner (the replica's own, `pool_guard`'s) at once."""
        guard = self.guards[replica]
        while (need := pending.need) is not None:
            if type(need) is StoreCall:
                at = now + self.fleet.store_rtt_s
                self.engine.schedule(at, Priority.ARRIVAL, self.on_store, (replica, pending))
                return
            assert type(need) is LearnerAsk
            pending = guard.continue_arrival(pending, now, guard.answer(need, now))
        admission = pending.admission
        flow = self.flows[replica]
        if flow is not None and admission is not None and admission.admitted:
            self._carry(flow.plan_admitted(entitled=admission.entitled))
        self._poll(replica, now)

    def on_store(self, payload: tuple[int, Pending], now: float) -> None:
        replica, pending = payload
        need = pending.need
        assert type(need) is StoreCall
        guard = self.guards[replica]
        grant = self.floors[replica].acquire(
            need.key,
            need.weight,
            need.capacity,
            guard.config.schedule,
            need.at,
            floor=need.floor,
            sleep=_no_wait,
        )
        self._admit(replica, guard.continue_arrival(pending, now, grant), now)

    # -- dispatch, leases and completion ----------------------------------------------------

    def _poll(self, replica: int, now: float) -> None:
        """The replica's pump: fill its slots; a leased start carries the flow's plan (the
        script run when the call is sent, its answer a store round trip later); after it,
        the flow settles the slots handed here; the wake-up follows `next_wake_at`."""
        guard, flow = self.guards[replica], self.flows[replica]
        for decision in guard.poll(now):
            if type(decision) is not Dispatch:
                continue
            if flow is None or not decision.lease:
                self._start(replica, decision, now)
                continue
            plan = flow.plan_start(decision)
            try:
                call = next(plan)
            except StopIteration as taken:  # a slot handed to this replica: no call
                self._answered(replica, decision, taken.value)
                continue
            reply = self._lease_call(call)
            self.engine.schedule(
                now + self.fleet.store_rtt_s,
                Priority.ARRIVAL,
                self.on_lease,
                (replica, decision, plan, reply),
            )
        if flow is not None and flow.needs_settling():
            self._carry(flow.plan_settle())
        self._arm(replica)

    def on_lease(self, payload: tuple[int, Dispatch, Plan[str], object], now: float) -> None:
        replica, decision, plan, reply = payload
        self._answered(replica, decision, self._carry(plan, reply))
        self._poll(replica, now)

    def _answered(self, replica: int, decision: Dispatch, why: str) -> None:
        flow = self.flows[replica]
        assert flow is not None
        now = self.engine.now
        if flow.answered(decision, why, now):
            self._start(replica, decision, now)
        else:  # on the waiting board: a slot is handed over, or the renewal looks again
            self.no_lease += 1

    def _carry(self, plan: Plan[_T], reply: object = None) -> _T:
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
        flow = self.flows[replica]
        assert flow is not None
        flow.leases.on_message(backend, member)

    def on_handed(self, handed: tuple[int, int], now: float) -> None:
        """A slot handed to the replica: it offers the backend again and starts there."""
        replica, backend = handed
        flow = self.flows[replica]
        assert flow is not None
        flow.handed(backend, now)
        self._poll(replica, now)  # settles it (hands it on) if nothing is left to start

    def _arm(self, replica: int) -> None:
        """One wake-up per replica at its guard's `next_wake_at` (a doom instant, or a
        held-off backend's end), as the HTTP guard's pump keeps its timer."""
        at = self.guards[replica].next_wake_at()
        if at is None:
            return
        at = max(at + PAST_DOOM_S, self.engine.now)
        if at >= self._wake_at[replica]:
            return
        self._wake_at[replica] = at
        self.engine.schedule(at, Priority.ARRIVAL, self.on_wake, replica)

    def on_wake(self, replica: int, now: float) -> None:
        if now < self._wake_at[replica]:
            return  # superseded by an earlier one that already ran
        self._wake_at[replica] = math.inf
        self.guards[replica].expire(now)
        self._poll(replica, now)

    def on_renew(self, replica: int, now: float) -> None:
        flow = self.flows[replica]
        assert flow is not None
        self._carry(flow.leases.plan_renew())
        guard = self.guards[replica]
        if now < self.fleet.duration_s or guard.num_in_flight or guard.num_queued:
            at = now + flow.leases.ttl_s / 4
            self.engine.schedule(at, Priority.ARRIVAL, self.on_renew, replica)

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
            flow = self.flows[replica]
            if flow is not None:  # the release carries the count as of the end
                local = self.owned[replica].index(backend)
                self._carry(flow.plan_end(local, str(request_id), flow.leases.waiting()))
            self.guards[replica].finish(request_id, now, "complete")
            owners.append(replica)
        self.reschedule(backend)
        for replica in dict.fromkeys(owners):
            self._poll(replica, now)


def _declared(backend: BackendSpec) -> int | None:
    """A simulated backend reports nothing: its capacity is what its configuration declares."""
    return backend.capacity


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
    schedule = sim.guards[0].config.schedule
    offered: Counter[tuple[str, int]] = Counter()
    for r in assured:
        offered[r.tenant, schedule.index_at(r.arrival_at)] += 1
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
        sum(flow.leases.local_grants for flow in sim.flows if flow is not None),
        wall_s,
    )
