"""One pool of the HTTP guard: the backends that serve one model (or every model, without
`models:`), guarded by its own `Guard` core — its queue, its slots, its contracts' floors
— and the request path from admission on (docs/design.md §12):

    admission (429, `Retry-After`) → the queue (503 the moment it is doomed) → forward to a
    healthy backend (placed again, once, if it cannot be reached) → relay (connect /
    first-byte / idle timeouts; a stream that fails after it started ends with an SSE error
    event) → complete / fail / abort.

**One owner.** `handle` owns the request from admission on; whatever happens — an
exception, a cancellation (the client went away), a timeout — its `finally` ends the
request in the guard if the guard still holds it. The guard's own state says whether it
does, so a request ends exactly once and its slot is released exactly once, on every path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from floorguard.clock import Clock
from floorguard.core.contract import Contract, ContractClass, reload_refusals
from floorguard.core.events import TraceEvent
from floorguard.core.guard import Guard
from floorguard.core.request import Request
from floorguard.core.surface import (
    Admission,
    Answer,
    Dispatch,
    Drop,
    LearnerAsk,
    Need,
    Pending,
    StoreCall,
)
from floorguard.errors import ConfigError
from floorguard.learners.registry import create_learner
from floorguard.proxy.config.guard import BackendSpec, GuardServerConfig, StoreSpec
from floorguard.proxy.edge.normalize import Work
from floorguard.proxy.edge.ratelimit import rate_limit_headers
from floorguard.proxy.edge.refusals import doomed, refusal
from floorguard.proxy.edge.replies import (
    Exchange,
    end_stream,
    json_error,
)
from floorguard.proxy.observe.access_log import DECISION
from floorguard.proxy.observe.tracing import SPAN, TRACE_CONTEXT, client_trace_context
from floorguard.proxy.pool.forward import Forwarding, PoolHost, UnreachableError
from floorguard.proxy.pool.health import BackendHealth, backend_report
from floorguard.proxy.pool.pump import CutError, Pump
from floorguard.proxy.pool.shares import Reload, capacities, merge_backends, slot_shares
from floorguard.proxy.pool.status import guard_status
from floorguard.store.base import StoreUnavailable
from floorguard.store.leases import SlotLeases, redis_lease_script
from floorguard.store.members import Membership
from floorguard.store.redis_store import RedisCreditStore
from floorguard.store.shared import SharedFloor

__all__ = ["Pool", "PoolHost"]

log = logging.getLogger("floorguard.proxy")


class Pool(Forwarding):
    """One pool's guard and request path; the edge (a `PoolHost`) owns identity, bodies,
    the decision log, metrics and the upstream session, and hands each request here."""

    def __init__(
        self,
        edge: PoolHost,
        name: str | None,
        config: GuardServerConfig,
        *,
        seed: int = 0,
    ) -> None:
        self.edge = edge
        self.name = name
        """The model this pool serves (None: the one pool, any model)."""
        self.config = config
        self.clock: Clock = edge.clock
        self.reported: dict[str, int] = {}
        """Each backend's own slot count as it reported it at start (by URL)."""
        guard_config = config.guard_config()
        guard_config = dataclasses.replace(
            guard_config,
            slots=self._shares(config.backends, frozenset(), self._replicas_configured),
        )
        learner = (
            None  # the callout answers every learner ask (`_answer`)
            if edge.http_learner is not None
            else create_learner(
                config.learner, np.random.default_rng(seed), config.learner_config()
            )
        )
        self.redis = _redis(config.store) if config.store else None
        """The pool's Redis (the floor, the leases and the membership share it)."""
        self.shared_floor = (
            SharedFloor(
                self.redis,
                policy=config.store.on_unavailable,
                replicas=config.store.replicas,
                retry_s=config.store.retry_s,
                clock=self.clock.now,
                attempts=config.store.attempts,
                on_change=self._on_store_change,
                on_lost_state=self._on_lost_state,
            )
            if config.store and self.redis
            else None
        )
        self._leased: dict[str, tuple[int, asyncio.Future[str] | None]] = {}
        """Requests holding (or taking) a lease → its backend, and the call still taking
        it if the request ended meanwhile."""
        self._background_tasks: set[asyncio.Task[None]] = set()
        self.guard = Guard(
            guard_config,
            learner=learner,
            store=self.shared_floor,
            sink=edge.on_event if self.name is None else self._on_event,  # one call less
            started_at=self.clock.now(),
        )
        self.leases = self._create_leases(config.store)
        """Fleet-wide slot leases (`store.slots: leased`); None: slots are this replica's."""
        self.membership = self._create_membership(config.store)
        """The live fleet sharing this pool's store (docs/design.md §14); None without a store."""
        self.pump = Pump(self.guard, self.clock)
        """The wall-clock driver of the guard: dispatch decisions to waiting requests, and
        the doom timer."""
        self.health = BackendHealth(
            config.backends,
            self.guard,
            timeout_s=config.health_timeout_s,
            failures_to_down=config.health_failures_to_down,
            on_change=self.pump.pump,
        )
        self.contracts: dict[str, Contract] = {c.tenant: c for c in guard_config.contracts}
        """Every tenant this pool has had a contract for, its latest (a reload adds, never
        removes: the guard core decides whom it serves; this names classes)."""
        self.backends: list[BackendSpec] = list(config.backends)
        """By position: a reload appends new backends and keeps removed ones (draining)."""
        self.removed: frozenset[int] = frozenset()
        """Positions a reload removed: they get no new request."""
        self._warned_usage = False
        """A backend finished a reply without usage: said once (forward.py)."""

    def _create_leases(self, store: StoreSpec | None) -> SlotLeases | None:
        if store is None or store.slots != "leased":
            return None
        assert self.redis is not None
        return SlotLeases(
            redis_lease_script(self.redis),
            backends=[b.url.rstrip("/") for b in self.config.backends],
            capacity=[b.slots for b in self.config.backends],
            replica=self.edge.replica,
            ttl_s=store.lease_ttl_s,
            waiting=lambda: self.guard.num_waiting_entitled,
            first_seq=int(self.clock.now() * 1e6),  # above any former self's under this name
        )

    def _create_membership(self, store: StoreSpec | None) -> Membership | None:
        if store is None:
            return None
        assert self.redis is not None
        return Membership(
            self.redis,
            replica=self.edge.replica,
            group="members" if self.name is None else f"members:{self.name}",
            ttl_s=store.membership_ttl_s,
            configured=store.replicas,
            explicit="replicas" in store.model_fields_set,
            on_count=self._follow_fleet,
            settled=self._settled,
            on_return=self._store_returned,
            clock=self.clock,
        )

    def _store_returned(self) -> None:
        """Redis answers this replica's beats again after it could not: the others may still
        grant from their fail-static shares (`SharedFloor.outage_seen`)."""
        if self.shared_floor is not None:
            self.shared_floor.outage_seen(self.clock.now())

    @property
    def label(self) -> str:
        """Its metric label value: the model, or `default` for the one pool."""
        return self.name if self.name is not None else "default"

    # -- plumbing -------------------------------------------------------------------------

    def _on_event(self, event: TraceEvent) -> None:
        self.edge.on_event(event if self.name is None else event._replace(pool=self.name))

    def _on_store_change(self, state: str, now: float) -> None:
        """The decision log marks the shared floor's degraded periods (`verify` judges AF
        in them as conditional on the store); a Redis answering again is checked again."""
        self.guard.store_changed(now, state)
        log.warning("shared floor%s: %s", self._of(), state)
        if state == "shared":
            self._in_background(self._check_eviction(at_start=False))

    async def _check_eviction(self, *, at_start: bool) -> None:
        """The store's eviction policy (`RedisCreditStore.eviction_risk`): at start a risk
        refuses to serve unless `store.eviction: warn`; later it is an error in the log."""
        store = self.config.store
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
        log.log(level, "shared floor%s: Redis %s (docs/deploy.md, Redis)", self._of(), risk)

    def _on_lost_state(self, tenant: str, window: int, now: float) -> None:
        """Redis lost `tenant`'s count in `window` (it restarted empty): the window is
        closed to fresh takes fleet-wide; the log says so (AF there is conditional)."""
        self.guard.store_changed(now, "lost-state", tenant, window)
        log.warning(
            "shared floor%s: Redis lost %s's count in window %d", self._of(), tenant, window
        )

    def _of(self) -> str:
        return f" (model {self.name})" if self.name is not None else ""

    async def start(self, session: aiohttp.ClientSession) -> list[asyncio.Task[None]]:
        """Probe the backends, check the partition and the store; the pool's background
        tasks."""
        await self.health.probe_all(session)
        await self._check_partition(session)
        await self._check_eviction(at_start=True)
        tasks = [
            asyncio.create_task(
                self.health.probe_every(session, self.config.health_interval_s, self.clock)
            )
        ]
        if self.membership is not None:
            self._follow_fleet(self.membership.count)  # the capacities reported just now
            await self.membership.join()
            tasks.append(asyncio.create_task(self.membership.beat_every()))
        if self.leases is not None:
            tasks.append(asyncio.create_task(self.leases.renew_every(self.clock)))
        return tasks

    async def stop(self) -> None:
        self.pump.close()
        if self.membership is not None:
            await self.membership.leave()
        if self.redis is not None:
            await self.redis.aclose()

    # -- membership (design §14) -------------------------------------------------------------

    @property
    def _replicas_configured(self) -> int:
        return self.config.store.replicas if self.config.store is not None else 1

    @property
    def replicas(self) -> int:
        """The replica count this pool's shares follow: the live fleet's, once heard."""
        return self.membership.count if self.membership is not None else 1

    def _shares(
        self, backends: Sequence[BackendSpec], removed: frozenset[int], count: int
    ) -> tuple[int, ...]:
        store = self.config.store
        return slot_shares(
            backends,
            removed,
            count,
            partitioned=store is not None and store.slots == "partition",
            capacity_of=self._capacity,
            where=self._of(),
        )

    def _capacity(self, backend: BackendSpec) -> int | None:
        """The backend's own slot count: declared, else as it reported it at start."""
        return backend.capacity or self.reported.get(backend.url.rstrip("/"))

    def _capacities(self, backends: Sequence[BackendSpec]) -> tuple[int | None, ...]:
        """Each backend's capacity as the decision log records it (for `verify`'s SLOTS
        across replicas); () when none is known."""
        return capacities(backends, self._capacity)

    def _follow_fleet(self, count: int) -> None:
        """The live replica count changed: fail-static's share follows at once, and so do
        partitioned slots, logged as a `config` event (reason `membership`: a shrunk
        backend gets nothing new until enough of it ends); leased slots need no share."""
        if self.shared_floor is not None:
            self.shared_floor.replicas = count
        if self.leases is not None:
            return
        latest = self.guard.latest_config
        slots = self._shares(self.backends, self.removed, count)
        capacity = self._capacities(self.backends)
        if (slots, capacity) != (latest.slots, latest.backend_capacity):
            following = dataclasses.replace(latest, slots=slots, backend_capacity=capacity)
            self.guard.reconfigure(following, self.clock.now(), reason="membership")
            self.pump.pump()

    def _settled(self) -> bool:
        """What this replica has in flight fits its shares on every backend."""
        guard = self.guard
        return all(guard.in_flight_on(b) <= c for b, c in enumerate(guard.config.slots))

    # -- reload (design §14) -----------------------------------------------------------------

    def plan_reload(self, config: GuardServerConfig) -> Reload:
        """This pool under `config`, validated; nothing changes (`ConfigError` names what a
        reload cannot change)."""
        backends, removed = merge_backends(self.backends, config.backends)
        guard_config = dataclasses.replace(
            config.guard_config(),
            slots=self._shares(backends, removed, self.replicas),
            backend_ids=tuple(b.url.rstrip("/") for b in backends),
            backend_capacity=self._capacities(backends),
        )
        refusals = reload_refusals(self.guard.config, guard_config)
        if refusals:
            where = "reload" if self.name is None else f"reload of models.{self.name}"
            raise ConfigError(where, "the new configuration", "; ".join(refusals))
        return Reload(config, backends, removed, guard_config)

    def apply_reload(self, plan: Reload, now: float) -> int:
        """Take a planned reload: contracts from the window it returns, backends and limits
        at once (a removed backend drains: it gets nothing new, what runs there ends)."""
        window = self.guard.reconfigure(plan.guard_config, now)
        self.config = plan.config
        self.backends, self.removed = plan.backends, plan.removed
        self.health.reconfigure(plan.backends, plan.removed)
        self.contracts |= {c.tenant: c for c in plan.guard_config.contracts}
        self.edge.metrics.backends_changed(self.label, [b.url.rstrip("/") for b in plan.backends])
        self.pump.pump()
        return window

    async def _check_partition(self, session: aiohttp.ClientSession) -> None:
        """Each backend's capacity against what it reports as its own slot count (the gauge
        `floorguard_backend_slots` on its /metrics; vLLM does not report `--max-num-seqs`):
        a declared capacity must agree, and `slots` must fit; a mismatch refuses to start.
        What a backend reports is kept: partitioned shares follow it (`_shares`)."""
        partitioned = self.config.store is not None and self.config.store.slots == "partition"
        for i, backend in enumerate(self.config.backends):
            report = await backend_report(session, backend.url)
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
            if partitioned and declared is None and reported is None:
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
        if block != self.config.kv_block_tokens:
            raise ConfigError(
                "kv_block_tokens",
                self.config.kv_block_tokens,
                f"{backend.url} reports {block}-token KV blocks: reservations would be "
                "counted in the wrong blocks",
            )

    def _key(self, i: int) -> str:
        return f"backends[{i}]" if self.name is None else f"models.{self.name}.backends[{i}]"

    async def _admit(self, offered: Request) -> Pending:
        """The guard's arrival, its needs answered here: the shared floor and the learner
        service awaited, anything local at once; the decided arrival (its `admission`). If
        the client leaves (or the guard fails) while a need is outstanding, the arrival
        ends as aborted (one terminal outcome)."""
        guard = self.guard
        pending = guard.begin_arrival(offered, self.clock.now())
        try:
            while (need := pending.need) is not None:
                answer = await self._answer(need)
                pending = guard.continue_arrival(pending, self.clock.now(), answer)
        except asyncio.CancelledError:
            guard.abandon_arrival(pending, self.clock.now(), "client_disconnected")
            raise
        except Exception:
            guard.abandon_arrival(pending, self.clock.now(), "internal_error")
            raise
        assert pending.admission is not None
        return pending

    async def _answer(self, need: Need) -> Answer:
        if type(need) is StoreCall:
            if self.shared_floor is None:
                return self.guard.answer(need, self.clock.now())
            # Sent at once and shielded: a client that leaves (or a failure here) does not
            # cut a Redis call in half, and the call is made whatever happens next, so the
            # credit an arrival within B takes is always taken — what the decision log's
            # checker assumes of an arrival that ends before its decision.
            charge = asyncio.ensure_future(
                self.shared_floor.acquire_async(
                    need.key,
                    need.weight,
                    need.capacity,
                    self.guard.config.schedule,
                    need.at,
                    floor=need.floor,
                )
            )
            charge.add_done_callback(_retrieve)
            await self.edge.checkpoint("store")
            return await asyncio.shield(charge)
        assert type(need) is LearnerAsk
        if self.edge.http_learner is None:
            return self.guard.answer(need, self.clock.now())
        await self.edge.checkpoint("learner")
        return await self.edge.http_learner.ask(self.edge.session, need)

    # -- one request ----------------------------------------------------------------------

    async def handle(
        self, request: web.Request, path: str, work: Work, *, tenant: str, rid: str, request_id: str
    ) -> web.StreamResponse:
        """One request in this pool, traced (tracing.py): the client's trace context goes
        on to the backend, or with `tracing:` the request's span does."""
        tracing = self.edge.tracing
        if tracing is None:
            request[TRACE_CONTEXT] = client_trace_context(request.headers)
            return await self._handle(
                request, path, work, tenant=tenant, rid=rid, request_id=request_id
            )
        span = request[SPAN] = tracing.start(
            request.headers,
            {"floorguard.tenant": tenant, "floorguard.model": self.label, "floorguard.id": rid},
        )
        request[TRACE_CONTEXT] = span.upstream_context()
        response: web.StreamResponse | None = None
        try:
            response = await self._handle(
                request, path, work, tenant=tenant, rid=rid, request_id=request_id
            )
            return response
        finally:
            said = response.headers if response is not None else {}
            for name in ("decision", "class", "window"):
                if f"x-floorguard-{name}" in said:
                    span.set(f"floorguard.{name}", said[f"x-floorguard-{name}"])
            span.end(response.status if response is not None else 499)  # 499: the client left

    async def _handle(
        self, request: web.Request, path: str, work: Work, *, tenant: str, rid: str, request_id: str
    ) -> web.StreamResponse:
        offered = Request(
            rid,
            tenant,
            self.clock.now(),
            work.num_output_tokens,
            work.num_prompt_tokens,
            work.min_prompt_tokens,
        )
        exchange = Exchange()
        try:
            pending = await self._admit(offered)
            admission = pending.admission
            assert admission is not None
            now = self.clock.now()
            config = self.guard.config
            limits = rate_limit_headers(pending, config.meter, config.schedule, now)
            if not admission.admitted:
                return refusal(admission, now, limits)
            if admission.entitled and self.leases is not None:
                self._in_background(self.leases.announce_async())
            return await self._serve(
                request, path, work, admission, limits, exchange=exchange, request_id=request_id
            )
        except asyncio.CancelledError:
            self._end(
                rid, "abort", "drain_deadline" if self.edge.cutting else "client_disconnected"
            )
            raise
        except Exception:
            log.exception("request %s failed inside the guard", rid)
            self._end(rid, "fail", "internal_error")
            if exchange.response is not None:  # the stream started: end it, never a 2nd reply
                await end_stream(exchange.response, "internal_error", "the guard failed")
                return exchange.response
            return json_error(500, "internal_error", "the guard failed on this request")
        finally:
            self._end(rid, "abort", "abandoned")  # a no-op when the request has ended

    def _end(self, rid: str, kind: str, reason: str = "") -> None:
        """End the request in the guard if it still holds it (exactly once: the guard's
        state says whether it ended), and hand its slot on. `kind`: `complete`, `fail` or
        `abort`; a request still queued can only abort."""
        self._release_lease(rid)
        guard = self.guard
        outcome = kind if guard.in_flight_request(rid) is not None else "abort"
        if not guard.finish(rid, self.clock.now(), outcome, reason):
            return
        if reason == "drain_deadline":
            self.edge.num_cut_at_deadline += 1
        self.pump.pump()

    async def _serve(
        self,
        request: web.Request,
        path: str,
        work: Work,
        admission: Admission,
        limits: dict[str, str],
        *,
        exchange: Exchange,
        request_id: str,
    ) -> web.StreamResponse:
        rid = str(admission.request_id)
        admitted = "entitled" if admission.entitled else "surplus"
        request[DECISION] = admitted  # for the access log, whatever becomes of the response
        headers = {
            "x-request-id": request_id,
            "x-floorguard-decision": admitted,
            "x-floorguard-class": str(admission.cls),
            **limits,
        }
        unreachable, admitted_at = 0, self.clock.now()
        while True:
            try:
                decision = await self.pump.turn(rid, lambda: self.edge.checkpoint("queue"))
            except CutError:  # the drain deadline, still queued: an answer, not a dropped line
                self._end(rid, "abort", "drain_deadline")
                return json_error(
                    503,
                    "draining",
                    "this guard is shutting down; retry",
                    {**headers, "Connection": "close", "Retry-After": "1"},
                )
            if (span := request.get(SPAN)) is not None:
                span.set("floorguard.queue_s", decision.at - admitted_at)
                if isinstance(decision, Dispatch):
                    span.set("floorguard.backend", self.backends[decision.backend].url)
            if isinstance(decision, Drop):
                return doomed(
                    decision,
                    self.contracts[decision.request.tenant],
                    self.guard.config.lower_envelope,
                    headers,
                    entitled=admission.entitled,
                )
            if not await self._leased_slot(rid, decision, admission.entitled):
                continue  # requeued: the fleet had no slot for it on that backend yet
            try:
                return await self._forward(
                    request, path, work, decision, headers=headers, exchange=exchange
                )
            except UnreachableError:
                self.health.unreachable(decision.backend)
                self._release_lease(rid)
                unreachable += 1
                if unreachable == 2 or not self.health.any_up():
                    self._end(rid, "fail", "upstream_unreachable")
                    return json_error(
                        502, "upstream_unreachable", "no backend could be reached", headers
                    )
                self.guard.requeue(rid, self.clock.now())

    async def _leased_slot(self, rid: str, decision: Dispatch, entitled: bool) -> bool:
        """With fleet-wide leases, take one for the slot the guard chose; without one the
        guard puts the request back (`no_lease`) and holds the backend off, so the pump
        does not spin on it. True when the request may start."""
        if not decision.lease:
            return True
        leases = self.leases
        assert leases is not None  # the guard leases slots only when the pool has leases
        taking = asyncio.ensure_future(
            leases.acquire_async(decision.backend, rid, entitled=entitled)
        )
        try:
            why = await asyncio.shield(taking)
        except asyncio.CancelledError:  # the client went away: give back what it may get
            self._leased[rid] = (decision.backend, taking)
            raise
        now = self.clock.now()
        if not why:
            self._leased[rid] = (decision.backend, None)
            self.guard.lease_granted(rid, now, local=leases.is_local(decision.backend, rid))
            return True
        self.guard.lease_denied(rid, now)  # its next turn's pump arms the hold-off's end
        return False

    def _release_lease(self, rid: str) -> None:
        """Give a request's lease back (it ended, or its backend was unreachable); the
        pump runs once the lease is free, so the next start can take it."""
        held = self._leased.pop(rid, None)
        if held is None or self.leases is None:
            return
        backend, taking = held
        leases = self.leases
        waiting = leases.waiting()  # before this end lets the queue move on

        async def release() -> None:
            if taking is not None:
                await asyncio.wait([taking])  # the lease it was taking, if granted
            await leases.release_async(backend, rid, waiting)
            self.pump.pump()

        self._in_background(release())

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` beside the request path (a lease call whose answer nobody awaits)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background_tasks.add(task)
        task.add_done_callback(self._background_tasks.discard)

    # -- the backend ----------------------------------------------------------------------

    def _class_of(self, rid: str) -> ContractClass:
        request = self.guard.in_flight_request(rid)
        return (
            self.contracts[request.tenant].cls
            if request is not None
            else ContractClass.OPPORTUNISTIC
        )

    # -- status ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The pool's window, queues, monitors, §6 report, and the store."""
        floor, fleet = self.shared_floor, self.membership
        store = None
        if floor is not None:
            store = floor.status() | ({"membership": fleet.status()} if fleet else {})
        return guard_status(
            self.guard, self.clock.now(), backends_healthy=self.health.healthy, store=store
        )

    def store_status(self) -> dict[str, Any]:
        """The shared floor's state: `shared`, or degraded under its fallback policy."""
        assert self.shared_floor is not None
        return self.shared_floor.status()


def _retrieve(done: asyncio.Future[Any]) -> None:
    """Observe a background call's outcome (its caller may have gone)."""
    if not done.cancelled():
        done.exception()


def _redis(spec: StoreSpec) -> RedisCreditStore:
    return RedisCreditStore(
        spec.url,
        prefix=spec.prefix,
        timeout_s=spec.timeout_ms / 1e3,
        connect_timeout_s=spec.connect_timeout_ms / 1e3,
        max_connections=spec.max_connections,
        pool_timeout_s=spec.pool_timeout_ms / 1e3,
    )
