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
import functools
import logging
from typing import Any

from aiohttp import web

from floorguard.clock import Clock
from floorguard.core.contract import Contract, ContractClass, reload_refusals
from floorguard.core.events import TraceEvent
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
from floorguard.proxy.config.guard import BackendSpec, GuardServerConfig
from floorguard.proxy.edge.normalize import Work
from floorguard.proxy.edge.ratelimit import rate_limit_headers
from floorguard.proxy.edge.refusals import doomed, refusal
from floorguard.proxy.edge.replies import (
    Exchange,
    end_stream,
    json_error,
)
from floorguard.proxy.observe.access_log import DECISION
from floorguard.proxy.observe.tracing import client_trace_context
from floorguard.proxy.pool.build import pool_guard
from floorguard.proxy.pool.fleet import PoolFleet
from floorguard.proxy.pool.forward import (
    FailedBeforeReplyError,
    Forwarder,
    PoolHost,
    UnreachableError,
)
from floorguard.proxy.pool.health import BackendHealth
from floorguard.proxy.pool.pump import CutError, Pump
from floorguard.proxy.pool.shares import Reload, merge_backends
from floorguard.proxy.pool.status import guard_status
from floorguard.proxy.pool.upstream import Upstream

__all__ = ["Pool", "PoolHost"]

log = logging.getLogger("floorguard.proxy")


class Pool:
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
        self.fleet = PoolFleet(self)
        """Its shared floor, slot leases and membership, and what its backends report."""
        self.shared_floor, self.leases = self.fleet.floor, self.fleet.leases  # set once, there
        self.guard = pool_guard(
            config,
            shares=self.fleet.shares,
            floor=self.fleet.floor,
            asks_over_http=edge.http_learner is not None,  # the callout answers (`_answer`)
            sink=edge.on_event if self.name is None else self._on_event,  # one call less
            seed=seed,
            now=self.clock.now(),
        )
        self.fleet.serve(self.guard)
        self.pump = Pump(self.guard, self.clock, settle=self.fleet.settle)
        """The wall-clock driver of the guard: dispatch decisions to waiting requests, and
        the doom timer."""
        self.health = BackendHealth(
            config.backends,
            self.guard,
            timeout_s=config.health_timeout_s,
            failures_to_down=config.health_failures_to_down,
            on_change=self.pump.pump,
        )
        self.contracts: dict[str, Contract] = {c.tenant: c for c in self.guard.config.contracts}
        """Every tenant this pool has had a contract for, its latest (a reload adds, never
        removes: the guard core decides whom it serves; this names classes)."""
        self.backends: list[BackendSpec] = list(config.backends)
        """By position: a reload appends new backends and keeps removed ones (draining)."""
        self.removed: frozenset[int] = frozenset()
        """Positions a reload removed: they get no new request."""
        self.forwarder = Forwarder(self)
        """The backend half of the request path (forward.py)."""

    @property
    def label(self) -> str:
        """Its metric label value: the model, or `default` for the one pool."""
        return self.name if self.name is not None else "default"

    # -- plumbing -------------------------------------------------------------------------

    def _on_event(self, event: TraceEvent) -> None:
        self.edge.on_event(event if self.name is None else event._replace(pool=self.name))

    @property
    def where(self) -> str:
        """For log lines: ` (model <name>)` of a named pool."""
        return f" (model {self.name})" if self.name is not None else ""

    async def start(self, upstream: Upstream) -> list[asyncio.Task[None]]:
        """Probe the backends, check the partition and the store; the pool's background
        tasks."""
        await self.health.probe_all(upstream)
        fleet = await self.fleet.start(upstream)  # may refuse to start (ConfigError)
        probing = self.health.probe_every(upstream, self.config.health_interval_s, self.clock)
        return [asyncio.create_task(probing), *fleet]

    async def stop(self) -> None:
        self.pump.close()
        await self.fleet.stop()

    # -- reload (design §14) -----------------------------------------------------------------

    def plan_reload(self, config: GuardServerConfig) -> Reload:
        """This pool under `config`, validated; nothing changes (`ConfigError` names what a
        reload cannot change)."""
        backends, removed = merge_backends(self.backends, config.backends)
        guard_config = dataclasses.replace(
            config.guard_config(),
            slots=self.fleet.shares(backends, removed, self.fleet.replicas, config),
            backend_ids=tuple(b.url.rstrip("/") for b in backends),
            backend_capacity=self.fleet.capacities(backends),
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
        self.fleet.reloaded(plan.guard_config.contracts)
        self.edge.metrics.backends_changed(self.label, [b.url.rstrip("/") for b in plan.backends])
        self.pump.pump()
        return window

    async def _admit(self, offered: Request) -> Pending:
        """The guard's arrival, its needs answered here: the shared floor and the learner
        service awaited, anything local at once; the decided arrival (its `admission`). If
        the client leaves (or the guard fails) while a need is outstanding, the arrival
        ends as aborted (one terminal outcome)."""
        guard, now = self.guard, offered.arrival_at
        pending = guard.begin_arrival(offered, now)
        try:
            while (need := pending.need) is not None:
                if self._asks_out(need):
                    answer = await self._answer(need)
                    now = self.clock.now()
                else:  # answered here, at the same instant
                    answer = guard.answer(need, now)
                pending = guard.continue_arrival(pending, now, answer)
        except asyncio.CancelledError:
            guard.abandon_arrival(pending, self.clock.now(), "client_disconnected")
            raise
        except Exception:
            guard.abandon_arrival(pending, self.clock.now(), "internal_error")
            raise
        assert pending.admission is not None
        return pending

    def _asks_out(self, need: Need) -> bool:
        """Whether `need` is answered by a call out of the process (the shared floor's
        store, the learner service), which `_answer` awaits; else the guard answers it."""
        if type(need) is StoreCall:
            return self.shared_floor is not None
        return self.edge.http_learner is not None

    async def _answer(self, need: Need) -> Answer:
        """The answer to a need that calls out of the process (`_asks_out`)."""
        if type(need) is StoreCall:
            assert self.shared_floor is not None
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
            if self.edge.fault_hook is not None:
                await self.edge.fault_hook("store")
            return await asyncio.shield(charge)
        assert type(need) is LearnerAsk and self.edge.http_learner is not None
        if self.edge.fault_hook is not None:
            await self.edge.fault_hook("learner")
        return await self.edge.http_learner.ask(self.edge.session, need)

    # -- one request ----------------------------------------------------------------------

    async def handle(
        self, request: web.Request, path: str, work: Work, *, tenant: str, rid: str, request_id: str
    ) -> web.StreamResponse:
        """One request in this pool, traced (tracing.py): the client's trace context goes
        on to the backend, or with `tracing:` the request's span does."""
        tracing, exchange = self.edge.tracing, Exchange()
        if tracing is None:
            exchange.trace = client_trace_context(request.headers)
            return await self._handle(
                request, path, work, exchange, tenant=tenant, rid=rid, request_id=request_id
            )
        span = exchange.span = tracing.start(
            request.headers,
            {"floorguard.tenant": tenant, "floorguard.model": self.label, "floorguard.id": rid},
        )
        exchange.trace = span.upstream_context()
        response: web.StreamResponse | None = None
        try:
            response = await self._handle(
                request, path, work, exchange, tenant=tenant, rid=rid, request_id=request_id
            )
            return response
        finally:
            said = response.headers if response is not None else {}
            for name in ("decision", "class", "window"):
                if f"x-floorguard-{name}" in said:
                    span.set(f"floorguard.{name}", said[f"x-floorguard-{name}"])
            span.end(response.status if response is not None else 499)  # 499: the client left

    async def _handle(
        self,
        request: web.Request,
        path: str,
        work: Work,
        exchange: Exchange,
        *,
        tenant: str,
        rid: str,
        request_id: str,
    ) -> web.StreamResponse:
        offered = Request(
            rid,
            tenant,
            self.clock.now(),
            work.num_output_tokens,
            work.num_prompt_tokens,
            work.min_prompt_tokens,
        )
        try:
            pending = await self._admit(offered)
            admission = pending.admission
            assert admission is not None
            now = self.clock.now()
            config = self.guard.config
            limits = rate_limit_headers(pending, config.meter, config.schedule, now)
            if not admission.admitted:
                return refusal(admission, now, limits)
            self.fleet.admitted(entitled=admission.entitled)
            return await self._serve(
                request,
                path,
                work,
                admission,
                limits,
                exchange=exchange,
                request_id=request_id,
                admitted_at=now,
            )
        except asyncio.CancelledError:
            self.end(rid, "abort", "drain_deadline" if self.edge.cutting else "client_disconnected")
            raise
        except Exception:
            log.exception("request %s failed inside the guard", rid)
            self.end(rid, "fail", "internal_error")
            if exchange.response is not None:  # the stream started: end it, never a 2nd reply
                await end_stream(exchange.response, "internal_error", "the guard failed")
                return exchange.response
            return json_error(500, "internal_error", "the guard failed on this request")
        finally:
            self.end(rid, "abort", "abandoned")  # a no-op when the request has ended

    def end(self, rid: str, kind: str, reason: str = "") -> None:
        """End the request in the guard if it still holds it (exactly once: the guard's
        state says whether it ended), and hand its slot on. `kind`: `complete`, `fail` or
        `abort`; a request still queued can only abort."""
        self.fleet.release(rid)
        guard = self.guard
        if not guard.holds(rid):  # ended already (every exit calls this), or never admitted
            return
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
        admitted_at: float,
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
        unreachable, hook = 0, self.edge.fault_hook
        queue_point = None if hook is None else functools.partial(hook, "queue")
        while True:
            try:
                decision = await self.pump.turn(rid, queue_point)
            except CutError:  # the drain deadline, still queued: an answer, not a dropped line
                self.end(rid, "abort", "drain_deadline")
                return json_error(
                    503,
                    "draining",
                    "this guard is shutting down; retry",
                    {**headers, "Connection": "close", "Retry-After": "1"},
                )
            if (span := exchange.span) is not None:
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
            if not await self.fleet.leased_slot(rid, decision):
                continue  # requeued: the fleet had no slot for it on that backend yet
            # a backend that fails before the first byte of its reply: the request goes to
            # another healthy one, once (it was admitted: no second charge to the floor)
            retry = unreachable == 0 and sum(self.health.healthy) > 1
            try:
                return await self.forwarder.forward(
                    request, path, work, decision, headers=headers, exchange=exchange, retry=retry
                )
            except (UnreachableError, FailedBeforeReplyError):
                self.health.unreachable(decision.backend)
                self.fleet.release(rid)
                unreachable += 1
                if unreachable == 2 or not self.health.any_up():
                    self.end(rid, "fail", "upstream_unreachable")
                    return json_error(
                        502, "upstream_unreachable", "no backend could be reached", headers
                    )
                self.guard.requeue(rid, self.clock.now())

    # -- the backend ----------------------------------------------------------------------

    def class_of(self, rid: str) -> ContractClass:
        request = self.guard.in_flight_request(rid)
        return (
            self.contracts[request.tenant].cls
            if request is not None
            else ContractClass.OPPORTUNISTIC
        )

    # -- status ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The pool's window, queues, monitors, §6 report, and the store."""
        return guard_status(
            self.guard,
            self.clock.now(),
            backends_healthy=self.health.healthy,
            store=self.fleet.status(),
        )


def _retrieve(done: asyncio.Future[Any]) -> None:
    """Observe a background call's outcome (its caller may have gone)."""
    if not done.cancelled():
        done.exception()
