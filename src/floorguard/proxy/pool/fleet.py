"""A pool among the replicas that share its store, and before the backends it serves: the
shared floor and its events, fleet-wide slot leases, the live membership and the slot shares
that follow it, and what each backend reports of itself at start (docs/replicas.md).

`Pool` owns the request path; this is the part of it that talks to the fleet. Everything
here runs beside a request (a lease is taken and given back around a dispatch) or on the
store's and the membership's own events."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from floorguard.core.contract import Contract
from floorguard.core.guard import Guard
from floorguard.core.leasing import LeaseFlow
from floorguard.core.surface import Dispatch
from floorguard.errors import ConfigError
from floorguard.proxy.config.guard import BackendSpec, GuardServerConfig, StoreSpec
from floorguard.proxy.pool.build import pool_floor
from floorguard.proxy.pool.health import backend_report
from floorguard.proxy.pool.shares import capacities, slot_shares
from floorguard.proxy.pool.upstream import Upstream
from floorguard.store.base import StoreUnavailable
from floorguard.store.leases import SlotLeases, handed_channel, pool_tag, redis_lease_script
from floorguard.store.members import Membership
from floorguard.store.plan import Plan, run_plan_async
from floorguard.store.redis_store import RedisCreditStore

if TYPE_CHECKING:
    from floorguard.proxy.pool.pool import Pool

__all__ = ["PoolFleet"]

log = logging.getLogger("floorguard.proxy")
_T = TypeVar("_T")


class PoolFleet:
    """The fleet side of one pool: built before its guard (the guard takes its floor from
    `floor`), it reads the pool's guard, pump and backends only once requests flow."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        store = pool.config.store
        self.reported: dict[str, int] = {}
        """Each backend's own slot count as it reported it at start (by URL)."""
        self.redis = _redis(store) if store is not None else None
        """The pool's Redis (the floor, the leases and the membership share it)."""
        self.floor = (
            pool_floor(
                store,
                self.redis,
                clock=pool.clock.now,
                on_change=self._on_store_change,
                on_lost_state=self._on_lost_state,
            )
            if store is not None and self.redis is not None
            else None
        )
        self.flow = self._create_flow(store)
        """What follows a leased start (`store.slots: leased`), the leases with it; None:
        slots are this replica's."""
        self.leases: SlotLeases | None = self.flow.leases if self.flow is not None else None
        self.membership = self._create_membership(store)
        """The live fleet sharing this pool's store (docs/design.md §14); None without one."""
        self._leased: dict[str, tuple[int, asyncio.Future[str] | None]] = {}
        """Requests holding (or taking) a lease → its backend, and the call still taking
        it if the request ended meanwhile."""
        self._background: set[asyncio.Task[None]] = set()

    @property
    def partitioned(self) -> bool:
        store = self.pool.config.store
        return store is not None and store.slots == "partition"

    def _create_flow(self, store: StoreSpec | None) -> LeaseFlow | None:
        if store is None or store.slots != "leased":
            return None
        assert self.redis is not None
        pool = self.pool
        return LeaseFlow(
            redis_lease_script(self.redis),
            pool.clock.now,
            backends=[b.url.rstrip("/") for b in pool.config.backends],
            capacity=[b.slots for b in pool.config.backends],
            replica=pool.edge.replica,
            ttl_s=store.lease_ttl_s,
            on_handed=self._handed,
            first_seq=int(pool.clock.now() * 1e6),  # above any former self's under this name
            pool=pool_tag(pool.name),
        )

    def serve(self, guard: Guard) -> None:
        """The pool's guard, built on this fleet's floor: the leased starts serve it."""
        if self.flow is not None:
            self.flow.serve(guard)

    def _create_membership(self, store: StoreSpec | None) -> Membership | None:
        if store is None:
            return None
        assert self.redis is not None
        pool = self.pool
        return Membership(
            self.redis,
            replica=pool.edge.replica,
            group="members" if pool.name is None else f"members:{pool.name}",
            ttl_s=store.membership_ttl_s,
            configured=store.replicas,
            explicit="replicas" in store.model_fields_set,
            on_count=self.follow,
            settled=self._settled,
            on_return=self._store_returned,
            clock=pool.clock,
        )

    # -- the store's events -----------------------------------------------------------------

    def _store_returned(self) -> None:
        """Redis answers this replica's beats again after it could not: the others may still
        grant from their fail-static shares (`SharedFloor.outage_seen`)."""
        if self.floor is not None:
            self.floor.outage_seen(self.pool.clock.now())

    def _on_store_change(self, state: str, now: float) -> None:
        """The decision log marks the shared floor's degraded periods (`verify` judges AF
        in them as conditional on the store); a Redis answering again is checked again."""
        self.pool.guard.store_changed(now, state)
        log.warning("shared floor%s: %s", self.pool.where, state)
        if state == "shared":
            self.in_background(self.check_eviction(at_start=False))

    def _on_lost_state(self, tenant: str, window: int, now: float) -> None:
        """Redis lost `tenant`'s count in `window` (it restarted empty): the window is
        closed to fresh takes fleet-wide; the log says so (AF there is conditional)."""
        self.pool.guard.store_changed(now, "lost-state", tenant, window)
        log.warning(
            "shared floor%s: Redis lost %s's count in window %d", self.pool.where, tenant, window
        )

    async def check_eviction(self, *, at_start: bool) -> None:
        """The store's eviction policy (`RedisCreditStore.eviction_risk`): at start a risk
        refuses to serve unless `store.eviction: warn`; later it is an error in the log."""
        store = self.pool.config.store
        if self.redis is None or store is None:
            return
        try:
            risk = await self.redis.eviction_risk()
        except StoreUnavailable:
            return  # unreachable: checked again when it answers
        if risk is None:
            return
        known = not risk.startswith("unknown")
        if at_start and known and store.eviction == "refuse":
            raise ConfigError(
                "store.eviction",
                store.eviction,
                f"{store.url.split('@')[-1]} has {risk}; set maxmemory-policy noeviction "
                "there (docs/deploy.md, Redis) or store.eviction: warn",
            )
        level = logging.ERROR if known else logging.WARNING
        log.log(level, "shared floor%s: Redis %s (docs/deploy.md, Redis)", self.pool.where, risk)

    async def check_persistence(self) -> None:
        """At start: what a restart of the store's Redis would cost the floor
        (`RedisCreditStore.restart_risk`), a warning in the log."""
        if self.redis is None:
            return
        try:
            risk = await self.redis.restart_risk()
        except StoreUnavailable:
            return
        if risk is not None:
            log.warning("shared floor%s: Redis %s (docs/deploy.md, Redis)", self.pool.where, risk)

    async def check_former_leases(self) -> None:
        """A leased replica does not lease beside replicas of an earlier floorguard, which
        keep a backend's leases under the former keys (`<prefix>:slots:{<backend>}`, before
        the pool's one waiting board): the two would count apart and fill a backend past
        its `C`. Such a key goes within `lease_ttl_s` (+1 s) of the former replicas' last
        call; one still there after that refuses the start (docs/deploy.md, "Stopping and
        rolling")."""
        if self.leases is None or self.redis is None:
            return
        redis, clock = self.redis, self.pool.clock
        former = [f"{redis.prefix}:slots:{{{backend}}}" for backend in self.leases.backends]
        deadline = clock.now() + self.leases.ttl_s + 2.0
        while True:
            try:
                held = await redis.existing(former)
            except StoreUnavailable:
                return  # unreachable: the leases' fallback holds nothing to overfill
            if not held:
                return
            if clock.now() >= deadline:
                raise ConfigError(
                    "store.slots",
                    "leased",
                    f"replicas of an earlier floorguard still lease under {held[0]} (the "
                    "former key layout): the two would fill the backend past its capacity; "
                    "stop them before starting this one (docs/deploy.md, Stopping and "
                    "rolling)",
                )
            await clock.sleep(0.1)

    # -- start and stop ---------------------------------------------------------------------

    async def start(self, upstream: Upstream) -> list[asyncio.Task[None]]:
        """Check the backends' reports and the store; join the fleet; its background tasks."""
        await self.check_backends(upstream)
        await self.check_eviction(at_start=True)
        await self.check_persistence()
        await self.check_former_leases()
        await self.learn(self.pool.guard.config.contracts)
        tasks = []
        if self.membership is not None:
            self.follow(self.membership.count)  # the capacities reported just now
            await self.membership.join()
            tasks.append(asyncio.create_task(self.membership.beat_every()))
        if self.leases is not None:
            tasks.append(asyncio.create_task(self.leases.renew_every(self.pool.clock)))
            assert self.redis is not None  # leases are the store's
            channel = handed_channel(self.redis, self.leases.replica)
            listening = self.redis.subscribe(channel, self._hand_over, self.pool.clock.sleep)
            tasks.append(asyncio.create_task(listening))
        return tasks

    async def learn(self, contracts: Iterable[Contract]) -> None:
        """Learn the generation of every tenant with a floor before serving it
        (`SharedFloor.learn_async`): a Redis that loses its state is then found at this
        replica's first call for a tenant too, not only at calls after one."""
        if self.floor is None:
            return
        tenants = [c.tenant for c in contracts if c.floor > 0]
        schedule = self.pool.guard.config.schedule
        unknown = await self.floor.learn_async(tenants, schedule, self.pool.clock.now())
        if unknown:
            log.warning(
                "shared floor%s: Redis did not answer for %d of %d tenants' generations; "
                "a state it loses before their first call cannot be told from a new tenant",
                self.pool.where,
                unknown,
                len(tenants),
            )

    def reloaded(self, contracts: Iterable[Contract]) -> None:
        """A reload's contracts: their tenants' generations are learned beside the request
        path (a new contract holds from the next window)."""
        if self.floor is not None:
            self.in_background(self.learn(contracts))

    async def stop(self) -> None:
        if self.membership is not None:
            await self.membership.leave()
        if self.redis is not None:
            await self.redis.aclose()

    # -- membership (design §14) ------------------------------------------------------------

    @property
    def replicas(self) -> int:
        """The replica count this pool's shares follow: the live fleet's, once heard."""
        return self.membership.count if self.membership is not None else 1

    def shares(
        self,
        backends: Sequence[BackendSpec],
        removed: frozenset[int],
        count: int,
        config: GuardServerConfig | None = None,
    ) -> tuple[int, ...]:
        """This replica's slots per backend (`slot_shares`), capped for the tightest TPOT of
        `config` (the pool's running one by default; docs/design.md §19)."""
        shares = slot_shares(
            backends,
            removed,
            count,
            partitioned=self.partitioned,
            capacity_of=self._capacity,
            where=self.pool.where,
        )
        return (config or self.pool.config).capped(shares)

    def _capacity(self, backend: BackendSpec) -> int | None:
        """The backend's own slot count: declared, else as it reported it at start."""
        return backend.capacity or self.reported.get(backend.url.rstrip("/"))

    def capacities(self, backends: Sequence[BackendSpec]) -> tuple[int | None, ...]:
        """Each backend's capacity as the decision log records it (for `verify`'s SLOTS
        across replicas); () when none is known."""
        return capacities(backends, self._capacity)

    def follow(self, count: int) -> None:
        """The live replica count changed: fail-static's share follows at once, and so do
        partitioned slots, logged as a `config` event (reason `membership`: a shrunk
        backend gets nothing new until enough of it ends); leased slots need no share."""
        if self.floor is not None:
            self.floor.replicas = count
        if self.leases is not None:
            return
        pool = self.pool
        latest = pool.guard.latest_config
        slots = self.shares(pool.backends, pool.removed, count)
        capacity = self.capacities(pool.backends)
        if (slots, capacity) != (latest.slots, latest.backend_capacity):
            following = dataclasses.replace(latest, slots=slots, backend_capacity=capacity)
            pool.guard.reconfigure(following, pool.clock.now(), reason="membership")
            pool.pump.pump()

    def _settled(self) -> bool:
        """What this replica has in flight fits its shares on every backend."""
        guard = self.pool.guard
        return all(guard.in_flight_on(b) <= c for b, c in enumerate(guard.config.slots))

    # -- fleet-wide slot leases -------------------------------------------------------------

    def _run(self, plan: Plan[_T]) -> Coroutine[Any, Any, _T]:
        """One of the flow's plans, run through the lease script."""
        assert self.leases is not None and self.leases.script is not None
        return run_plan_async(plan, self.leases.script)

    def admitted(self, *, entitled: bool) -> None:
        """An admission: an entitled one goes on the pool's waiting board at once."""
        if self.flow is not None and entitled:
            self.in_background(self._run(self.flow.plan_admitted(entitled=entitled)))

    async def leased_slot(self, rid: str, decision: Dispatch) -> bool:
        """With fleet-wide leases, take one for the slot the guard chose; without one the
        guard puts the request back (`no_lease`) and holds the backend off, so the pump
        does not spin on it. True when the request may start."""
        if not decision.lease:
            return True
        assert self.flow is not None  # the guard leases slots only when the pool has leases
        taking = asyncio.ensure_future(self._run(self.flow.plan_start(decision)))
        try:
            why = await asyncio.shield(taking)
        except asyncio.CancelledError:  # the client went away: give back what it may get
            self._leased[rid] = (decision.backend, taking)
            raise
        if self.flow.answered(decision, why, self.pool.clock.now()):
            self._leased[rid] = (decision.backend, None)
            return True
        if not why:  # granted to a request that ended meanwhile: the lease goes back
            self._leased[rid] = (decision.backend, None)
            self.release(rid)
        return False  # denied: requeued, this handler waits for its turn again

    def settle(self) -> None:
        """After each pump: slots handed here that nothing is left to start on go on."""
        if self.flow is not None and self.flow.needs_settling():
            self.in_background(self._run(self.flow.plan_settle()))

    def _hand_over(self, message: str) -> None:
        """A slot handed to this replica, as published: `<backend> <member>`."""
        backend, _, member = message.partition(" ")
        assert self.leases is not None
        self.leases.on_message(backend, member)

    def _handed(self, backend: int) -> None:
        """A slot on `backend` was handed to this replica: the next start there takes it
        (the pump's settling hands it on if nothing is left to start)."""
        assert self.flow is not None
        self.flow.handed(backend, self.pool.clock.now())
        self.pool.pump.pump()

    def release(self, rid: str) -> None:
        """Give a request's lease back (it ended, or its backend was unreachable); the
        pump runs once the lease is free, so the next start can take it."""
        held = self._leased.pop(rid, None)
        if held is None or self.flow is None:
            return
        backend, taking = held
        flow, pump = self.flow, self.pool.pump
        ending = flow.plan_end(backend, rid, flow.leases.waiting())  # before the queue moves

        async def release() -> None:
            if taking is not None:
                await asyncio.wait([taking])  # the lease it was taking, if granted
            await self._run(ending)
            pump.pump()

        self.in_background(release())

    def in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` beside the request path (a store call whose answer nobody awaits)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- what the backends report -----------------------------------------------------------

    async def check_backends(self, upstream: Upstream) -> None:
        """Each backend's capacity against what it reports as its own slot count (the gauge
        `floorguard_backend_slots` on its /metrics; vLLM does not report `--max-num-seqs`):
        a declared capacity must agree, and `slots` must fit; a mismatch refuses to start.
        What a backend reports is kept: partitioned shares follow it (`shares`)."""
        for i, backend in enumerate(self.pool.config.backends):
            report = await backend_report(upstream, backend.url)
            self._check_kv(i, backend, report.kv_tokens, report.block_tokens)
            reported = report.slots
            declared = backend.capacity
            if reported is not None and declared is not None and reported != declared:
                raise ConfigError(
                    f"{self._key(i)}.capacity",
                    declared,
                    f"{backend.url} reports {reported} slots of its own",
                )
            if reported is not None:
                self.reported[backend.url.rstrip("/")] = reported
            if reported is not None and backend.slots > reported:
                raise ConfigError(
                    f"{self._key(i)}.slots",
                    backend.slots,
                    f"> the {reported} slots {backend.url} reports: a guard may not have "
                    "more in flight than the backend runs (docs/replicas.md)",
                )
            if self.partitioned and declared is None and reported is None:
                log.warning(
                    "%s (%s): neither its capacity nor a reported slot count is known, so "
                    "this replica's share cannot follow the live fleet: `slots` is taken as "
                    "its share (set backends[].capacity)",
                    self._key(i),
                    backend.url,
                )

    def _check_kv(
        self, i: int, backend: BackendSpec, reported: int | None, block: int | None
    ) -> None:
        """A declared KV budget against the KV cache the backend reports (vLLM's
        `cache_config_info`): more than it has, or other blocks, refuses to start; none
        declared, the figure is said (design §16: budgeting it keeps vLLM from preempting)."""
        if reported is None:
            return
        declared = backend.kv_tokens
        if declared is None:
            log.info(
                "%s (%s) reports a KV cache of %d tokens (%d-token blocks): set "
                "kv_tokens: %d there to budget it (docs/http.md, The KV cache)",
                self._key(i), backend.url, reported, block, reported,
            )  # fmt: skip
            return
        if declared > reported:
            raise ConfigError(
                f"{self._key(i)}.kv_tokens",
                declared,
                f"> the {reported} KV tokens {backend.url} reports: the guard would start "
                "requests its cache cannot hold",
            )
        block_tokens = self.pool.config.kv_block_tokens
        if block != block_tokens:
            raise ConfigError(
                "kv_block_tokens",
                block_tokens,
                f"{backend.url} reports {block}-token KV blocks: reservations would be "
                "counted in the wrong blocks",
            )

    def _key(self, i: int) -> str:
        name = self.pool.name
        return f"backends[{i}]" if name is None else f"models.{name}.backends[{i}]"

    def status(self) -> dict[str, Any] | None:
        """The shared floor's state, the membership and the slot leases, or None without a
        store."""
        if self.floor is None:
            return None
        fleet, leases = self.membership, self.leases
        return (
            self.floor.status()
            | ({"membership": fleet.status()} if fleet else {})
            | ({"leases": leases.status()} if leases else {})
        )


def _redis(spec: StoreSpec) -> RedisCreditStore:
    return RedisCreditStore(
        spec.url,
        prefix=spec.prefix,
        timeout_s=spec.timeout_ms / 1e3,
        connect_timeout_s=spec.connect_timeout_ms / 1e3,
        max_connections=spec.max_connections,
        pool_timeout_s=spec.pool_timeout_ms / 1e3,
    )
