"""The HTTP guard: an OpenAI-compatible proxy that runs the same `Guard` core as the
simulator, on the wall clock, in front of OpenAI-compatible backends (vLLM first).

One request (SPEC §12):

    identity → tenant (401/403) → the whole body, size-limited (413) → normalize: the
    forwarded bytes, ℓ and the prompt's tokens (400) → admission (429, `Retry-After`) →
    the queue (503 the moment it is doomed) → forward to a healthy backend (placed again,
    once, if it cannot be reached) → relay (connect / first-byte / idle timeouts; a stream
    that fails after it started ends with an SSE error event) → complete / fail / abort.

**One owner.** `handle` owns the request from admission on; whatever happens — an
exception, a cancellation (the client went away), a timeout — its `finally` ends the
request in the guard if the guard still holds it. The guard's own state says whether it
does, so a request ends exactly once and its slot is released exactly once, on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import numpy as np
import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import generate_latest

from floorguard.clock import Clock, WallClock
from floorguard.core.events import EventKind, TraceEvent
from floorguard.core.guard import Guard
from floorguard.core.request import Request
from floorguard.core.surface import (
    AUTO_RETRY,
    WINDOW_BOUND,
    Admission,
    Answer,
    Dispatch,
    Drop,
    LearnerAsk,
    Need,
    RejectReason,
    StoreCall,
)
from floorguard.errors import ConfigError
from floorguard.learners.registry import create_learner
from floorguard.proxy.config import GuardServerConfig, StoreSpec
from floorguard.proxy.decision_log import DecisionLog
from floorguard.proxy.health import BackendHealth, reported_slots
from floorguard.proxy.identity import AuthError, create_identity, peer_address
from floorguard.proxy.learner_http import HttpLearner
from floorguard.proxy.metrics import GuardMetrics
from floorguard.proxy.normalize import (
    BadRequestError,
    EdgeLimits,
    TokenCounter,
    Work,
    load_tokenizer,
    normalize,
)
from floorguard.proxy.openai_format import error_body, sse_error
from floorguard.proxy.pump import Pump
from floorguard.proxy.status import guard_status
from floorguard.store.leases import SlotLeases
from floorguard.store.redis_store import RedisCreditStore
from floorguard.store.shared import SharedFloor

__all__ = ["SERVER", "FaultHook", "GuardRunner", "GuardServer", "create_admin_app", "create_app"]

log = logging.getLogger("floorguard.proxy")

FaultHook = Callable[[str], Awaitable[None]]

_LEASE_RETRY_S = 0.005
"""How long a backend is held off after the fleet had no lease for a start there."""
"""Called at each named await point of the request path (`parse`, `store`, `learner`,
`queue`, `connect`, `headers`, `stream`): the fault-injection tests raise or cancel there."""

_JSON = {"Content-Type": "application/json"}
_NO_RETRY = {"x-should-retry": "false"}


def _error(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    *,
    param: str | None = None,
    **extra: Any,
) -> web.Response:
    return web.Response(
        body=orjson.dumps(error_body(code, message, status=status, param=param, **extra)),
        status=status,
        headers={**_JSON, **(headers or {})},
    )


class _RefusedError(Exception):
    """Carries the 4xx response for a request refused before the guard sees it."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


class _UnreachableError(Exception):
    """The backend could not be reached before any byte was sent: place the request again."""


class GuardServer:
    def __init__(
        self,
        config: GuardServerConfig,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        seed: int = 0,
        fault_hook: FaultHook | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        self.config = config
        self.clock = clock or WallClock()
        self.identity = create_identity(config.identity, environ)
        self._mtls = config.identity.mode == "mtls"
        self._log = DecisionLog(config.decision_log) if config.decision_log else None
        self._background: list[asyncio.Task[None]] = []
        self._fault_hook = fault_hook
        self.draining = False
        """Set on shutdown (SIGTERM): new requests get 503, in-flight ones finish."""
        guard_config = config.guard_config()
        self._metrics: GuardMetrics | None = None  # built below, once the guard exists
        self.http_learner = (
            HttpLearner(config.learner_http.url, config.learner_http.timeout_ms / 1e3)
            if config.learner_http
            else None
        )
        learner = (
            None  # the callout answers every learner ask (`_answer`)
            if self.http_learner is not None
            else create_learner(
                config.learner, np.random.default_rng(seed), config.learner_config()
            )
        )
        self.shared_floor = (
            _shared_floor(config.store, self.clock, self._on_store_change, self._on_lost_state)
            if config.store
            else None
        )
        self._replica = config.replica or f"{socket.gethostname()}-{os.getpid()}"
        self.leases: SlotLeases | None = None
        """Fleet-wide slot leases (`store.slots: leased`); None: slots are this replica's."""
        self._leased: dict[str, tuple[int, asyncio.Future[str] | None]] = {}
        """Requests holding (or taking) a lease → its backend, and the call still taking
        it if the request ended meanwhile."""
        self._background_tasks: set[asyncio.Task[None]] = set()
        self.guard = Guard(
            guard_config,
            learner=learner,
            store=self.shared_floor,
            sink=self._on_event,
            started_at=self.clock.now(),
        )
        if config.store is not None and config.store.slots == "leased":
            assert self.shared_floor is not None
            self.leases = SlotLeases(
                self.shared_floor.store,
                backends=[b.url.rstrip("/") for b in config.backends],
                capacity=[b.slots for b in config.backends],
                replica=self._replica,
                replicas=config.store.replicas,
                ttl_s=config.store.lease_ttl_s,
                waiting=lambda: self.guard.num_queued_entitled,
            )
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
        self._metrics = GuardMetrics(
            self.guard,
            self.clock.now,
            self.http_learner.outcomes if self.http_learner is not None else None,
            self.shared_floor,
        )
        limits = config.limits
        self.limits = limits.edge_limits()
        self.tokenizer: TokenCounter | None = (
            load_tokenizer(str(limits.tokenizer)) if limits.tokenizer else None
        )
        self.admin_token = config.admin.token
        if config.admin.token_env is not None:
            self.admin_token = environ.get(config.admin.token_env) or None
            if self.admin_token is None or len(self.admin_token) < 16:
                raise ConfigError(
                    "admin.token_env",
                    config.admin.token_env,
                    "names an environment variable that must hold a token of ≥ 16 characters",
                )
        self._ids = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self._contracts = {c.tenant: c for c in guard_config.contracts}

    @property
    def metrics(self) -> GuardMetrics:
        assert self._metrics is not None
        return self._metrics

    @property
    def upstream_open(self) -> bool:
        """Whether the upstream HTTP session is open (between startup and cleanup)."""
        return self._session is not None and not self._session.closed

    @property
    def session(self) -> aiohttp.ClientSession:
        """The upstream HTTP session (open between startup and cleanup)."""
        if self._session is None:
            raise RuntimeError("the guard server has not started")
        return self._session

    # -- plumbing -------------------------------------------------------------------------

    def _on_store_change(self, state: str, now: float) -> None:
        """The decision log marks the shared floor's degraded periods (`verify` judges AF
        in them as conditional on the store)."""
        self._on_event(TraceEvent(now, EventKind.STORE, reason=state))
        log.warning("shared floor: %s", state)

    def _on_lost_state(self, tenant: str, window: int, now: float) -> None:
        """Redis lost `tenant`'s count in `window` (it restarted empty): the window is
        closed to fresh takes fleet-wide; the log says so (AF there is conditional)."""
        self._on_event(
            TraceEvent(now, EventKind.STORE, tenant=tenant, window=window, reason="lost-state")
        )
        log.warning("shared floor: Redis lost %s's count in window %d", tenant, window)

    def _on_event(self, event: TraceEvent) -> None:
        if self._log is not None:
            self._log.append(event)
        if self._metrics is not None:
            self._metrics.on_event(event)

    async def _checkpoint(self, point: str) -> None:
        if self._fault_hook is not None:
            await self._fault_hook(point)

    async def start(self, _: web.Application) -> None:
        upstream = self.config.upstream
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=upstream.connect_timeout_s,
                sock_connect=upstream.connect_timeout_s,
            ),
            connector=aiohttp.TCPConnector(limit=self.guard.config.total_slots + 32),
        )
        await self.health.probe_all(self._session)
        await self._check_partition(self._session)
        interval_s = self.config.health_interval_s
        self._background.append(
            asyncio.create_task(self.health.probe_every(self._session, interval_s))
        )
        if self._log is not None:
            self._background.append(asyncio.create_task(self._flush_every(self._log)))
        if self.leases is not None:
            self._background.append(asyncio.create_task(self.leases.renew_every()))

    async def _check_partition(self, session: aiohttp.ClientSession) -> None:
        """Each backend's slots against what it reports as its own slot count (the gauge
        `floorguard_backend_slots` on its /metrics; vLLM does not report `--max-num-seqs`):
        a replica's partition must fit. A mismatch refuses to start."""
        replicas = self.config.store.replicas if self.config.store is not None else 1
        if self.leases is not None:
            replicas = 1  # the whole backend's slots, leased fleet-wide
        for i, backend in enumerate(self.config.backends):
            reported = await reported_slots(session, backend.url)
            declared = backend.capacity
            if reported is not None and declared is not None and reported != declared:
                raise ConfigError(
                    f"backends[{i}].capacity",
                    declared,
                    f"{backend.url} reports {reported} slots of its own",
                )
            capacity = declared if declared is not None else reported
            if capacity is not None and backend.slots * replicas > capacity:
                raise ConfigError(
                    f"backends[{i}].slots",
                    backend.slots,
                    f"{replicas} replica(s) × {backend.slots} = {backend.slots * replicas} > "
                    f"the {capacity} slots {backend.url} reports: each replica's slots must "
                    "be its share (docs/replicas.md)",
                )
            if capacity is None and replicas > 1:
                log.warning(
                    "backends[%d] (%s): %d replicas share it, but neither its capacity nor a "
                    "reported slot count bounds the partition (set backends[].capacity)",
                    i,
                    backend.url,
                    replicas,
                )

    async def _flush_every(self, log: DecisionLog) -> None:
        while True:
            await asyncio.sleep(self.config.decision_log_flush_s)
            log.flush()

    def flush_log(self) -> None:
        """Write every pending decision-log line now (the timer does it every
        `decision_log_flush_s`; shutdown does it too)."""
        if self._log is not None:
            self._log.flush()

    async def drain(self, _: web.Application) -> None:
        self.draining = True

    async def stop(self, _: web.Application) -> None:
        for task in self._background:
            task.cancel()
        self.pump.close()
        if self._session is not None:
            await self._session.close()
        if self.shared_floor is not None:
            await self.shared_floor.store.aclose()
        if self._log is not None:
            self._log.close()

    # -- before admission -----------------------------------------------------------------

    def _tenant(self, request: web.Request) -> str:
        try:
            peercert = (
                request.transport.get_extra_info("peercert")
                if self._mtls and request.transport is not None
                else None
            )
            tenant = self.identity.tenant_of(request.headers, peercert, request.remote)
        except AuthError as exc:
            raise _RefusedError(_error(exc.status, exc.kind, str(exc))) from exc
        if tenant not in self._contracts:
            raise _RefusedError(
                _error(403, "unknown_tenant", f"tenant {tenant[:80]!r} has no contract")
            )
        return tenant

    async def _read_body(self, request: web.Request) -> bytes:
        """The whole body, until EOF, with the size limit applied as it streams in."""
        limit = self.config.limits.max_body_bytes
        if (request.content_length or 0) > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.header_timeout_s  # for the whole body
        try:
            while chunk := await _next_chunk(request.content, deadline - loop.time()):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
        except TimeoutError:
            raise _RefusedError(
                _error(408, "body_timeout", "the body did not arrive in time", _NO_RETRY)
            ) from None
        return b"".join(chunks)

    async def _normalize(self, raw: bytes, chat: bool, tenant: str) -> Work:
        priority = None
        if self.config.forward_priority:
            priority = self._contracts[tenant].cls.backend_priority
        run = _bind_normalize(raw, chat, self.limits, priority, self.tokenizer)
        try:
            if self.tokenizer is not None and len(raw) > 65_536:
                return await asyncio.to_thread(run)  # a long prompt: off the event loop
            return run()
        except BadRequestError as exc:
            raise _RefusedError(
                _error(exc.status, exc.kind, str(exc), _NO_RETRY, param=exc.param)
            ) from exc

    # -- admission ------------------------------------------------------------------------

    async def _admit(self, offered: Request) -> Admission:
        """The guard's arrival, its needs answered here: the shared floor and the learner
        service awaited, anything local at once. If the client leaves (or the guard fails)
        while a need is outstanding, the arrival ends as aborted (one terminal outcome)."""
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
        return pending.admission

    async def _answer(self, need: Need) -> Answer:
        if type(need) is StoreCall:
            if self.shared_floor is None:
                return self.guard.answer(need, self.clock.now())
            # Sent at once and shielded: a client that leaves (or a failure here) does not
            # cut a Redis call in half, and the call is made whatever happens next, so the
            # credit an arrival within B takes is always taken — what the decision log's
            # checker assumes of an arrival that ends before its decision.
            charge = asyncio.ensure_future(
                self.shared_floor.acquire_async(*need, self.guard.config.schedule, self.clock.now())
            )
            charge.add_done_callback(_retrieve)
            await self._checkpoint("store")
            return await asyncio.shield(charge)
        assert type(need) is LearnerAsk
        if self.http_learner is None:
            return self.guard.answer(need, self.clock.now())
        await self._checkpoint("learner")
        return await self.http_learner.ask(self.session, need)

    def _refusal(self, admission: Admission, now: float) -> web.Response:
        reason = admission.reason or "rejected"
        retry_s = 1
        if admission.retry_at is not None:
            retry_s = max(1, math.ceil(admission.retry_at - now))
        headers = {"x-floorguard-decision": "rejected", "Retry-After": str(retry_s)}
        if reason not in AUTO_RETRY:  # a retry is a new offer, not a fix
            headers |= _NO_RETRY
        if reason in WINDOW_BOUND:
            message = f"refused: {reason}; the next window starts in {retry_s} s"
        elif reason == RejectReason.QUEUE_FULL:
            message = "refused: the guard's queue for this class or tenant is full"
        else:
            message = f"refused: {reason}"
        return _error(429, reason, message, headers)

    # -- one request ----------------------------------------------------------------------

    async def _prepare(self, request: web.Request, path: str) -> tuple[str, Work]:
        """Everything before admission: the tenant, the whole body, the normalized work."""
        if self.draining:
            raise _RefusedError(
                _error(
                    503,
                    "draining",
                    "this guard is shutting down; retry",
                    {"Connection": "close", "Retry-After": "1"},
                )
            )
        tenant = self._tenant(request)
        raw = await self._read_body(request)
        await self._checkpoint("parse")
        work = await self._normalize(raw, path.endswith("/chat/completions"), tenant)
        if not self.health.any_up():
            retry = str(max(1, math.ceil(self.config.health_interval_s)))
            raise _RefusedError(
                _error(
                    503,
                    "no_healthy_backend",
                    "no backend is answering its health probe",
                    {"Retry-After": retry},
                )
            )
        return tenant, work

    async def handle(self, request: web.Request, path: str) -> web.StreamResponse:
        try:
            tenant, work = await self._prepare(request, path)
        except _RefusedError as refused:
            return refused.response
        rid = f"{self._replica}-{next(self._ids)}"
        offered = Request(
            rid,
            tenant,
            self.clock.now(),
            work.num_output_tokens,
            work.num_prompt_tokens,
            work.min_prompt_tokens,
        )
        exchange = _Exchange()
        try:
            admission = await self._admit(offered)
            if not admission.admitted:
                return self._refusal(admission, self.clock.now())
            return await self._serve(request, path, work, admission, exchange)
        except asyncio.CancelledError:
            self._end(rid, "abort", "client_disconnected")
            raise
        except Exception:
            log.exception("request %s failed inside the guard", rid)
            self._end(rid, "fail", "internal_error")
            if exchange.response is not None:  # the stream started: end it, never a 2nd reply
                await _end_stream(exchange.response, "internal_error", "the guard failed")
                return exchange.response
            return _error(500, "internal_error", "the guard failed on this request")
        finally:
            self._end(rid, "abort", "abandoned")  # a no-op when the request has ended

    def _end(self, rid: str, kind: str, reason: str = "") -> None:
        """End the request in the guard if it still holds it (exactly once: the guard's
        state says whether it ended), and hand its slot on."""
        self._release_lease(rid)
        guard = self.guard
        if not guard.holds(rid):
            return
        now = self.clock.now()
        if kind == "fail" and guard.in_flight_request(rid) is not None:
            guard.on_fail(rid, now, reason)
        else:
            guard.on_abort(rid, now, reason)
        self.pump.pump()

    async def _serve(
        self,
        request: web.Request,
        path: str,
        work: Work,
        admission: Admission,
        exchange: _Exchange,
    ) -> web.StreamResponse:
        rid = str(admission.request_id)
        headers = {
            "x-floorguard-decision": "entitled" if admission.entitled else "surplus",
            "x-floorguard-class": str(admission.cls),
            "x-floorguard-window": str(
                admission.window_index if admission.window_index is not None else ""
            ),
        }
        unreachable = 0
        while True:
            decision = await self.pump.turn(rid, lambda: self._checkpoint("queue"))
            if isinstance(decision, Drop):
                return self._doomed(decision)
            if not await self._leased_slot(rid, decision, admission.entitled):
                continue  # requeued: the fleet had no slot for it on that backend yet
            try:
                return await self._forward(
                    request, path, work, decision, headers=headers, exchange=exchange
                )
            except _UnreachableError:
                self.health.unreachable(decision.backend)
                self._release_lease(rid)
                unreachable += 1
                if unreachable == 2 or not self.health.any_up():
                    self._end(rid, "fail", "upstream_unreachable")
                    return _error(
                        502, "upstream_unreachable", "no backend could be reached", headers
                    )
                self.guard.requeue(rid, self.clock.now())

    async def _leased_slot(self, rid: str, decision: Dispatch, entitled: bool) -> bool:
        """With fleet-wide leases, take one for the slot the guard chose; without one the
        request waits again (`no_lease`) and the backend is held off for `_LEASE_RETRY_S`,
        so the pump does not spin on it. True when the request may start."""
        if self.leases is None:
            return True
        taking = asyncio.ensure_future(
            self.leases.acquire(decision.backend, rid, entitled=entitled)
        )
        try:
            why = await asyncio.shield(taking)
        except asyncio.CancelledError:  # the client went away: give back what it may get
            self._leased[rid] = (decision.backend, taking)
            raise
        if not why:
            self._leased[rid] = (decision.backend, None)
            request = decision.request
            self._on_event(
                TraceEvent(
                    self.clock.now(),
                    EventKind.LEASE,
                    rid,
                    request.tenant,
                    self._contracts[request.tenant].cls,
                    backend=decision.backend,
                    entitled=entitled,
                )
            )
            return True
        self.guard.requeue(rid, self.clock.now(), "no_lease")
        self._hold_off(decision.backend)
        return False

    def _hold_off(self, backend: int) -> None:
        self.guard.set_backend_available(backend, False)

        def lift() -> None:
            if self.health.healthy[backend]:
                self.guard.set_backend_available(backend, True)
            self.pump.pump()

        asyncio.get_running_loop().call_later(_LEASE_RETRY_S, lift)

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
            await leases.release(backend, rid, waiting)
            self.pump.pump()

        task = asyncio.get_running_loop().create_task(release())
        self._background_tasks.add(task)
        task.add_done_callback(self._background_tasks.discard)

    def _doomed(self, drop: Drop) -> web.Response:
        request = drop.request
        lower = self.guard.config.lower_envelope
        contract = self._contracts[request.tenant]
        deadline_at = request.arrival_at + contract.deadline_budget_s
        fit = (
            lower.max_output_tokens(deadline_at - drop.at, request.prompt_tokens_lower)
            if lower is not None
            else 0
        )
        return _error(
            503,
            "doomed",
            f"dropped: it could not finish by its deadline; at most max_tokens = {fit} "
            f"would have fit when it was dropped",
            {"x-floorguard-decision": "dropped", "Retry-After": "1", **_NO_RETRY},
            param="max_tokens",
            max_tokens_that_fit=fit,
        )

    # -- the backend ----------------------------------------------------------------------

    async def _forward(
        self,
        request: web.Request,
        path: str,
        work: Work,
        decision: Dispatch,
        *,
        headers: dict[str, str],
        exchange: _Exchange,
    ) -> web.StreamResponse:
        rid = str(decision.request.request_id)
        backend = self.config.backends[decision.backend]
        upstream_config = self.config.upstream
        await self._checkpoint("connect")
        try:
            async with asyncio.timeout(upstream_config.first_byte_timeout_s):
                upstream = await self.session.post(
                    backend.url.rstrip("/") + path,
                    data=work.body,
                    headers=_JSON,
                    allow_redirects=False,
                )
        except aiohttp.ClientConnectorError as exc:
            raise _UnreachableError from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            return self._upstream_failed(rid, exc, headers)
        async with upstream:
            await self._checkpoint("headers")
            if upstream.status >= 300:
                self._end(rid, "fail", f"upstream_{upstream.status}")
                return _error(
                    502,
                    "upstream_error",
                    f"the backend answered {upstream.status}",
                    headers,
                    upstream_status=upstream.status,
                )
            if work.stream:
                return await self._relay(request, rid, upstream, headers, exchange)
            return await self._reply(rid, upstream, headers)

    def _upstream_failed(
        self, rid: str, exc: BaseException, headers: dict[str, str]
    ) -> web.Response:
        """Before the response started: end the request as failed and answer 504 (the backend
        timed out) or 502 (its connection failed) — never with its text or address."""
        if isinstance(exc, TimeoutError):
            self._end(rid, "fail", "upstream_timeout")
            return _error(504, "upstream_timeout", "the backend did not answer in time", headers)
        self._end(rid, "fail", "upstream_error")
        return _error(502, "upstream_error", "the backend connection failed", headers)

    async def _read_chunk(self, upstream: aiohttp.ClientResponse, timeout_s: float) -> bytes:
        return await _next_chunk(upstream.content, timeout_s)

    async def _reply(
        self, rid: str, upstream: aiohttp.ClientResponse, headers: dict[str, str]
    ) -> web.Response:
        """A non-streamed reply, read whole up to `limits.max_response_bytes`."""
        cap, idle = self.config.limits.max_response_bytes, self.config.upstream.idle_timeout_s
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := await self._read_chunk(upstream, idle):
                await self._checkpoint("stream")
                size += len(chunk)
                if size > cap:
                    self._end(rid, "fail", "upstream_reply_too_large")
                    return _error(
                        502, "upstream_reply_too_large", f"the reply exceeds {cap} bytes", headers
                    )
                chunks.append(chunk)
        except (TimeoutError, aiohttp.ClientError) as exc:
            return self._upstream_failed(rid, exc, headers)
        self._complete(rid)
        return web.Response(body=b"".join(chunks), status=200, headers={**headers, **_JSON})

    async def _relay(
        self,
        request: web.Request,
        rid: str,
        upstream: aiohttp.ClientResponse,
        headers: dict[str, str],
        exchange: _Exchange,
    ) -> web.StreamResponse:
        """Relay an SSE stream. Before its first byte a failure is still a JSON error; after
        it, the stream ends with an SSE error event (never a second response)."""
        timeouts = self.config.upstream
        try:
            first = await self._read_chunk(upstream, timeouts.first_byte_timeout_s)
        except (TimeoutError, aiohttp.ClientError) as exc:
            return self._upstream_failed(rid, exc, headers)
        response = web.StreamResponse(
            status=200,
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        exchange.response = response
        await response.prepare(request)
        self.guard.on_first_token(rid, self.clock.now())
        chunk = first
        try:
            while chunk:
                await self._checkpoint("stream")
                if request.transport is None or request.transport.is_closing():
                    raise ConnectionResetError("the client went away mid-stream")
                await response.write(chunk)
                chunk = await self._read_chunk(upstream, timeouts.idle_timeout_s)
        except (TimeoutError, aiohttp.ClientError) as exc:
            reason = (
                "upstream_timeout" if isinstance(exc, TimeoutError) else "upstream_broke_mid_stream"
            )
            self._end(rid, "fail", reason)
            await _end_stream(response, reason, "the backend stream failed mid-way")
            return response
        except ConnectionResetError:
            self._end(rid, "abort", "client_disconnected")
            return response
        self._complete(rid)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    def _complete(self, rid: str) -> None:
        self._release_lease(rid)
        guard = self.guard
        request = guard.in_flight_request(rid)
        if request is None:
            return
        tenant = request.tenant
        done = guard.on_complete(rid, self.clock.now())
        self.metrics.on_complete(tenant, self._contracts[tenant].cls, done.service_s, done.late)
        self.pump.pump()

    # -- status ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """`/admin/status`: the guard's window, queues, monitors, §6 report, and the store."""
        floor = self.shared_floor
        return guard_status(
            self.guard,
            self.clock.now(),
            backends_healthy=self.health.healthy,
            store=floor.status() if floor is not None else None,
        )

    def store_status(self) -> dict[str, Any]:
        """The shared floor's state: `shared`, or degraded under its fallback policy."""
        assert self.shared_floor is not None
        return self.shared_floor.status()


def _retrieve(done: asyncio.Future[Any]) -> None:
    """Observe a background call's outcome (its caller may have gone)."""
    if not done.cancelled():
        done.exception()


def _too_large(limit: int) -> _RefusedError:
    return _RefusedError(
        _error(413, "body_too_large", f"the body exceeds {limit} bytes", _NO_RETRY)
    )


async def _next_chunk(stream: aiohttp.StreamReader, timeout_s: float) -> bytes:
    """The next piece of `stream` (b"" at its end): what is buffered at once, else the next
    to arrive within `timeout_s` (TimeoutError). No timer is armed for buffered data: most
    bodies and replies are in the buffer by the time they are read (the hot path)."""
    chunk = stream.read_nowait()
    if chunk or stream.at_eof():
        return chunk
    if timeout_s <= 0:
        raise TimeoutError
    async with asyncio.timeout(timeout_s):
        return await stream.readany()


class _Exchange:
    """What the request has sent its client so far (a started stream cannot be undone)."""

    __slots__ = ("response",)

    def __init__(self) -> None:
        self.response: web.StreamResponse | None = None


async def _end_stream(response: web.StreamResponse, code: str, message: str) -> None:
    with contextlib.suppress(ConnectionResetError, RuntimeError):
        await response.write(sse_error(code, message))
        await response.write_eof()


def _bind_normalize(
    raw: bytes, chat: bool, limits: EdgeLimits, priority: int | None, tokenizer: Any
) -> Callable[[], Work]:
    return lambda: normalize(raw, chat=chat, limits=limits, priority=priority, tokenizer=tokenizer)


def _shared_floor(
    spec: StoreSpec,
    clock: Clock,
    on_change: Callable[[str, float], None],
    on_lost_state: Callable[[str, int, float], None],
) -> SharedFloor:
    store = RedisCreditStore(
        spec.url,
        prefix=spec.prefix,
        timeout_s=spec.timeout_ms / 1e3,
        connect_timeout_s=spec.connect_timeout_ms / 1e3,
        max_connections=spec.max_connections,
        pool_timeout_s=spec.pool_timeout_ms / 1e3,
    )
    return SharedFloor(
        store,
        policy=spec.on_unavailable,
        replicas=spec.replicas,
        retry_s=spec.retry_s,
        clock=clock.now,
        attempts=spec.attempts,
        on_change=on_change,
        on_lost_state=on_lost_state,
    )


SERVER: web.AppKey[GuardServer] = web.AppKey("floorguard.server", GuardServer)
"""The app's `GuardServer` (its guard, metrics and status)."""

_STATUS_TEXT = {
    404: ("not_found", "no such path"),
    405: ("method_not_allowed", "method not allowed on this path"),
    413: ("body_too_large", "the body is too large"),
}


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own refusals (404, 405, …) in the OpenAI error shape, not text/plain; so is
    anything a handler failed to catch."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        code, message = _STATUS_TEXT.get(exc.status, ("http_error", exc.reason))
        return _error(exc.status, code, message)
    except Exception:  # a bug before any request was admitted: still JSON, logged
        log.exception("%s %s failed inside the guard", request.method, request.path)
        return _error(500, "internal_error", "the guard failed on this request")


class _JsonErrorHandler(RequestHandler):
    """The HTTP parser's refusals (a malformed request line or header) in JSON."""

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if already sent
        code = "bad_http" if status < 500 else "internal_error"
        text = "the request is not valid HTTP" if status < 500 else "the guard failed"
        response = _error(status, code, text)
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class GuardRunner(web.AppRunner):
    """An `AppRunner` whose connections answer HTTP parser errors in JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same object, one method more specific
        return server


def _admin_routes(server: GuardServer, app: web.Application, *, loopback_only: bool) -> None:
    """`/metrics` and `/admin/status`: behind `admin.token` when one is configured; on the
    main listener without one, only for loopback clients."""

    def allowed(request: web.Request) -> web.Response | None:
        token = server.admin_token
        if token is not None:
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), token.encode()):
                return _error(401, "admin_token_required", "this path needs the admin token")
            return None
        if loopback_only and not _is_loopback(request.remote):
            return _error(403, "admin_loopback_only", "admin paths answer loopback clients only")
        return None

    async def metrics(request: web.Request) -> web.Response:
        refused = allowed(request)
        if refused is not None:
            return refused
        return web.Response(
            body=generate_latest(server.metrics.registry), content_type="text/plain"
        )

    async def admin_status(request: web.Request) -> web.Response:
        refused = allowed(request)
        if refused is not None:
            return refused
        return web.json_response(server.status())

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/status", admin_status)


def _is_loopback(remote: str | None) -> bool:
    address = peer_address(remote)
    return address is not None and address.is_loopback


def create_app(
    config: GuardServerConfig,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    fault_hook: FaultHook | None = None,
) -> web.Application:
    """Everything is built here: no module-level state (STYLE §12). Run it with
    `GuardRunner(app, handler_cancellation=True)`: a client that disconnects then cancels
    its handler at once, so the guard aborts the request, frees its slot and closes the
    upstream request. With `admin.port` the admin paths are served by `create_admin_app`
    on a listener of their own, not here."""
    server = GuardServer(config, environ=environ, clock=clock, fault_hook=fault_hook)
    app = web.Application(middlewares=[_json_errors])
    app[SERVER] = server

    async def models(_: web.Request) -> web.Response:
        healthy = [b for b, up in zip(config.backends, server.health.healthy, strict=True) if up]
        url = (healthy or config.backends)[0].url.rstrip("/") + "/v1/models"
        try:
            async with asyncio.timeout(config.upstream.first_byte_timeout_s):
                async with server.session.get(url, allow_redirects=False) as upstream:
                    if upstream.status != 200:
                        return _error(502, "upstream_error", f"backend answered {upstream.status}")
                    body = await upstream.content.read(config.limits.max_response_bytes)
                    return web.Response(body=body, status=200, content_type="application/json")
        except (aiohttp.ClientError, TimeoutError):
            return _error(502, "upstream_unreachable", "the backend could not be reached")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        backends = [
            {"backend": n, "healthy": healthy} for n, healthy in enumerate(server.health.healthy)
        ]
        up = server.upstream_open
        ready = up and server.health.any_up() and not server.draining
        body: dict[str, Any] = {"ready": ready, "backends": backends}
        if server.shared_floor is not None:
            body["store"] = server.store_status()["state"]
        return web.json_response(body, status=200 if ready else 503)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await server.handle(request, "/v1/completions")

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await server.handle(request, "/v1/chat/completions")

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if config.admin.port is None:
        _admin_routes(server, app, loopback_only=True)
    app.on_startup.append(server.start)
    app.on_shutdown.append(server.drain)
    app.on_cleanup.append(server.stop)
    return app


def create_admin_app(server: GuardServer) -> web.Application:
    """The admin listener's app (`admin.port`): `/metrics` and `/admin/status` of `server`."""
    app = web.Application(middlewares=[_json_errors])
    _admin_routes(server, app, loopback_only=False)
    return app
