"""The HTTP guard: an OpenAI-compatible proxy that runs the same `Guard` core as the
simulator, on the wall clock, in front of OpenAI-compatible backends (vLLM first).

One request: identity → tenant (401/403) → body limits (413/400) → `on_arrival` (429 with
`Retry-After` on refusal) → wait for `poll` to start it (503 if dropped as doomed) → forward
to the chosen backend, streaming chunk by chunk → `on_complete`; upstream error 502, timeout
504, client gone → `on_abort` (the upstream request is closed). Every path ends the request
in the guard exactly once, so the slot is always released.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import aiohttp
import numpy as np
import orjson
from aiohttp import web
from prometheus_client import generate_latest

from floorguard.clock import Clock, WallClock
from floorguard.core.contract import ContractClass
from floorguard.core.events import TraceEvent
from floorguard.core.guard import Dispatch, Drop, Guard, StoreCall
from floorguard.core.request import Request
from floorguard.learners.registry import create_learner
from floorguard.proxy.config import GuardServerConfig, StoreSpec
from floorguard.proxy.decision_log import DecisionLog
from floorguard.proxy.identity import AuthError, create_identity
from floorguard.proxy.learner_http import HttpLearner
from floorguard.proxy.metrics import GuardMetrics
from floorguard.proxy.openai_format import BadRequestError, error_body, parse_body
from floorguard.proxy.shared_floor import SharedFloor
from floorguard.store.base import Grant
from floorguard.store.redis_store import RedisCreditStore

__all__ = ["SERVER", "GuardServer", "create_app"]

JSON_ERRORS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    413: "Too Large",
    429: "Too Many Requests",
    502: "Bad Gateway",
    503: "Unavailable",
    504: "Timeout",
}


def _error(
    status: int, kind: str, message: str, headers: Mapping[str, str] | None = None, **extra: Any
) -> web.Response:
    return web.json_response(
        error_body(kind, message, **extra), status=status, headers=dict(headers or {})
    )


_JSON = {"Content-Type": "application/json"}


class _RefusedError(Exception):
    """Carries the 4xx response for a request refused before the guard sees it."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


class GuardServer:
    def __init__(
        self,
        config: GuardServerConfig,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.clock = clock or WallClock()
        self.identity = create_identity(config.identity, environ)
        self._mtls = config.identity.mode == "mtls"
        self._log = DecisionLog(config.decision_log) if config.decision_log else None
        self._background: list[asyncio.Task[None]] = []
        self.draining = False
        """Set on shutdown (SIGTERM): new requests get 503, in-flight ones finish."""
        self.backend_healthy = [False] * len(config.backends)
        """Whether each backend answered its last health probe (for `/readyz`)."""
        guard_config = config.guard_config()
        self._metrics: GuardMetrics | None = None  # built below, once the guard exists
        self.http_learner = (
            HttpLearner(config.learner_http.url, config.learner_http.timeout_ms / 1e3)
            if config.learner_http
            else None
        )
        learner = self.http_learner or create_learner(
            config.learner, np.random.default_rng(seed), config.learner_config()
        )
        self.shared_floor = _shared_floor(config.store, self.clock) if config.store else None
        self._replica = config.replica or f"{socket.gethostname()}-{os.getpid()}"
        self.guard = Guard(
            guard_config,
            learner=learner,
            store=self.shared_floor,
            sink=self._on_event,
            started_at=self.clock.now(),
        )
        self._metrics = GuardMetrics(
            self.guard,
            self.clock.now,
            self.http_learner.outcomes if self.http_learner is not None else None,
            self.shared_floor,
        )
        self._waiters: dict[str, asyncio.Future[Dispatch | Drop]] = {}
        self._ids = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self._contracts = {c.tenant: c for c in guard_config.contracts}

    @property
    def metrics(self) -> GuardMetrics:
        assert self._metrics is not None
        return self._metrics

    # -- plumbing -------------------------------------------------------------------------

    def _on_event(self, event: TraceEvent) -> None:
        if self._log is not None:
            self._log.append(event)
        if self._metrics is not None:
            self._metrics.on_event(event)

    def _pump(self) -> None:
        """Hand freed slots to waiting requests (the guard decides who)."""
        for decision in self.guard.poll(self.clock.now()):
            waiter = self._waiters.pop(str(decision.request.request_id), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(decision)

    async def start(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.config.upstream_timeout_s)
        )
        await self._probe_backends()
        self._background.append(asyncio.create_task(self._probe_every()))
        if self._log is not None:
            self._background.append(asyncio.create_task(self._flush_every(self._log)))

    async def _probe_backends(self) -> None:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=min(1.0, self.config.health_interval_s))

        async def probe(url: str) -> bool:
            assert self._session is not None
            try:
                async with self._session.get(url, timeout=timeout) as response:
                    return response.status < 300
            except (aiohttp.ClientError, TimeoutError):
                return False

        self.backend_healthy = list(
            await asyncio.gather(
                *(probe(b.url.rstrip("/") + b.health_path) for b in self.config.backends)
            )
        )

    async def _probe_every(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await self._probe_backends()

    async def _flush_every(self, log: DecisionLog) -> None:
        while True:
            await asyncio.sleep(self.config.decision_log_flush_s)
            log.flush()

    def flush_log(self) -> None:
        """Write every pending decision-log line now (the timer does it every
        `decision_log_flush_s`; shutdown does it too)."""
        if self._log is not None:
            self._log.flush()

    async def stop(self, _: web.Application) -> None:
        for task in self._background:
            task.cancel()
        if self._session is not None:
            await self._session.close()
        if self.shared_floor is not None:
            await self.shared_floor.store.aclose()
        if self._log is not None:
            self._log.close()

    # -- one request ----------------------------------------------------------------------

    async def _parse(self, request: web.Request) -> tuple[str, bytes, dict[str, Any], int]:
        try:
            peercert = (
                request.transport.get_extra_info("peercert")
                if self._mtls and request.transport is not None
                else None
            )
            tenant = self.identity.tenant_of(request.headers, peercert)
        except AuthError as exc:
            raise _RefusedError(_error(exc.status, exc.kind, str(exc))) from exc
        if tenant not in self._contracts:
            raise _RefusedError(_error(403, "unknown_tenant", f"tenant {tenant!r} has no contract"))
        limit = self.config.limits.max_body_bytes
        if (request.content_length or 0) > limit:
            raise _RefusedError(_error(413, "body_too_large", f"the body exceeds {limit} bytes"))
        raw = await request.content.read(limit + 1)
        if len(raw) > limit:
            raise _RefusedError(_error(413, "body_too_large", f"the body exceeds {limit} bytes"))
        try:
            body, max_tokens = parse_body(
                raw,
                max_tokens_cap=self.config.limits.max_tokens,
                default_max_tokens=self.config.limits.default_max_tokens,
            )
        except BadRequestError as exc:
            raise _RefusedError(_error(exc.status, exc.kind, str(exc))) from exc
        return tenant, raw, body, max_tokens

    async def _charge_shared_floor(self, offered: Request, call: StoreCall) -> Grant:
        """The shared floor's grant for an arriving assured request. A client that leaves
        meanwhile does not lose the credit's trace: once the grant is in, the request is
        offered to the guard and aborted at once (one terminal outcome)."""
        assert self.shared_floor is not None
        schedule = self.guard.config.schedule
        charge = asyncio.ensure_future(
            self.shared_floor.acquire_call(call, schedule, self.clock.now())
        )
        try:
            return await asyncio.shield(charge)
        except asyncio.CancelledError:

            def arrive_and_abort(done: asyncio.Future[Grant]) -> None:
                now = self.clock.now()
                admission = self.guard.on_arrival(offered, now, grant=done.result())
                if admission.admitted:
                    self.guard.on_abort(offered.request_id, now, "client_disconnected")

            charge.add_done_callback(arrive_and_abort)
            raise

    def _refusal(self, reason: str | None, now: float) -> web.Response:
        schedule = self.guard.config.schedule
        retry = max(1, math.ceil(schedule.start_of(schedule.index_at(now) + 1) - now))
        return _error(
            429,
            reason or "rejected",
            f"refused: {reason}",
            {"Retry-After": str(retry), "x-floorguard-decision": "rejected"},
        )

    async def drain(self, _: web.Application) -> None:
        self.draining = True

    async def handle(self, request: web.Request, path: str) -> web.StreamResponse:
        if self.draining:
            return _error(
                503, "draining", "this guard is shutting down; retry", {"Connection": "close"}
            )
        try:
            tenant, raw, body, max_tokens = await self._parse(request)
        except _RefusedError as refused:
            return refused.response
        arrived_at = now = self.clock.now()
        rid = f"{self._replica}-{next(self._ids)}"
        offered = Request(rid, tenant, arrived_at, max_tokens)
        grant = None
        if self.shared_floor is not None:
            call = self.guard.store_call(offered, now)
            if call is not None:
                grant = await self._charge_shared_floor(offered, call)
                now = self.clock.now()
        if self.http_learner is not None and self.guard.consults_learner(offered, now, grant):
            assert self._session is not None
            cls = self._contracts[tenant].cls
            await self.http_learner.fetch(self._session, offered, cls, self.guard.load())
            now = self.clock.now()
        admission = self.guard.on_arrival(offered, now, grant=grant)
        if self.http_learner is not None:
            self.http_learner.forget(rid)
        if not admission.admitted:
            return self._refusal(admission.reason, now)
        headers = {
            "x-floorguard-decision": "entitled" if admission.entitled else "surplus",
            "x-floorguard-class": str(admission.cls),
            "x-floorguard-window": str(
                admission.window_index if admission.window_index is not None else ""
            ),
        }
        waiter: asyncio.Future[Dispatch | Drop] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = waiter
        self._pump()
        try:
            decision = await waiter
        except asyncio.CancelledError:
            self._waiters.pop(rid, None)
            self.guard.on_abort(rid, self.clock.now(), "client_disconnected")
            self._pump()
            raise
        if isinstance(decision, Drop):
            return _error(
                503,
                "doomed",
                "dropped: it could not finish by its deadline",
                {"x-floorguard-decision": "dropped"},
            )
        if self.config.forward_priority:  # else the client's bytes go upstream unchanged
            priority = 0 if self._contracts[tenant].cls is ContractClass.ASSURED else 1
            raw = orjson.dumps({**body, "priority": priority})
        stream = body.get("stream") is True
        return await self._forward(
            request, rid, path, decision, payload=raw, stream=stream, headers=headers
        )

    async def _forward(
        self,
        request: web.Request,
        rid: str,
        path: str,
        decision: Dispatch,
        *,
        payload: bytes,
        stream: bool,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        backend = self.config.backends[decision.backend]
        assert self._session is not None
        ended = False

        def end(kind: str, reason: str = "") -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            now = self.clock.now()
            if kind == "complete":
                done = self.guard.on_complete(rid, now)
                tenant = decision.request.tenant
                self.metrics.on_complete(
                    tenant, self._contracts[tenant].cls, done.service_s, done.late
                )
            elif kind == "fail":
                self.guard.on_fail(rid, now, reason)
            else:
                self.guard.on_abort(rid, now, reason)
            self._pump()

        try:
            async with self._session.post(
                backend.url.rstrip("/") + path, data=payload, headers=_JSON
            ) as upstream:
                if upstream.status >= 400:
                    detail = (await upstream.read())[:500].decode(errors="replace")
                    end("fail", f"upstream_{upstream.status}")
                    return _error(
                        502,
                        "upstream_error",
                        f"backend answered {upstream.status}",
                        headers,
                        upstream_status=upstream.status,
                        detail=detail,
                    )
                if not stream:
                    data = await upstream.read()
                    end("complete")
                    return web.Response(
                        body=data, status=200, headers=headers, content_type="application/json"
                    )
                return await self._relay(request, rid, upstream, headers, end)
        except TimeoutError:
            end("fail", "upstream_timeout")
            return _error(504, "upstream_timeout", "the backend did not answer in time", headers)
        except aiohttp.ClientError as exc:
            end("fail", f"upstream_unreachable: {type(exc).__name__}")
            return _error(502, "upstream_unreachable", f"backend unreachable: {exc}", headers)
        except (asyncio.CancelledError, ConnectionResetError):
            end("abort", "client_disconnected")
            raise
        finally:
            if not ended:
                end("fail", "internal_error")

    async def _relay(
        self,
        request: web.Request,
        rid: str,
        upstream: aiohttp.ClientResponse,
        headers: dict[str, str],
        end: Any,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200,
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        await response.prepare(request)
        first = True
        try:
            async for chunk in upstream.content.iter_any():
                if first:
                    self.guard.on_first_token(rid, self.clock.now())
                    first = False
                if request.transport is None or request.transport.is_closing():
                    raise ConnectionResetError("the client went away mid-stream")
                await response.write(chunk)
        except aiohttp.ClientError as exc:
            end("fail", "upstream_broke_mid_stream")
            error = error_body("upstream_broke_mid_stream", f"the backend stream broke: {exc}")
            with contextlib.suppress(ConnectionResetError):  # tell the client, if still there
                await response.write(b"data: " + orjson.dumps(error) + b"\n\n")
                await response.write_eof()
            return response
        end("complete")
        await response.write_eof()
        return response

    # -- status ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = self.clock.now()
        guard = self.guard
        schedule = guard.config.schedule
        return {
            "now": now,
            "window": {
                "index": schedule.index_at(now),
                "window_s": schedule.window_s,
                "origin_at": schedule.origin_at,
                "credits_left": {
                    c.tenant: guard.credits_left(c.tenant, now)
                    for c in guard.config.contracts
                    if c.assured
                },
            },
            "queues": {
                "queued": guard.num_queued,
                "queued_entitled": guard.num_queued_entitled,
                "in_flight": [guard.in_flight_on(b) for b in range(len(guard.config.slots))],
                "slots": list(guard.config.slots),
            },
            "monitors": {
                "max_service_s": guard.envelope.max_service_s,
                "above_ceiling": guard.envelope.num_above_upper,
                "below_lower": guard.envelope.num_below_lower,
                "max_assured_backlog": guard.backlog.max_backlog,
                "capacity_per_s": guard.capacity.estimate_per_s,
                "capacity_alarms": guard.capacity.num_alarms,
                "learner_faults": guard.stats.learner_faults,
            },
            "assumptions": asdict(guard.assumptions()),
            **({"store": self.store_status()} if self.shared_floor is not None else {}),
        }

    def store_status(self) -> dict[str, Any]:
        """The shared floor's state: `shared`, or degraded under its fallback policy."""
        floor = self.shared_floor
        assert floor is not None
        return {
            "url": floor.store.url,
            "state": floor.policy.value if floor.degraded else "shared",
            "degraded_since": floor.degraded_since,
            "replicas": floor.replicas,
            "calls": dict(floor.calls),
        }


def _shared_floor(spec: StoreSpec, clock: Clock) -> SharedFloor:
    store = RedisCreditStore(spec.url, prefix=spec.prefix, timeout_s=spec.timeout_ms / 1e3)
    return SharedFloor(
        store,
        policy=spec.on_unavailable,
        replicas=spec.replicas,
        retry_s=spec.retry_s,
        clock=clock.now,
    )


SERVER: web.AppKey[GuardServer] = web.AppKey("floorguard.server", GuardServer)
"""The app's `GuardServer` (its guard, metrics and status)."""


def create_app(
    config: GuardServerConfig,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Clock | None = None,
) -> web.Application:
    """Everything is built here: no module-level state (STYLE §12). Run it with
    `handler_cancellation=True` (`web.run_app` / `web.AppRunner`): a client that disconnects
    then cancels its handler at once, so the guard aborts the request, frees its slot and
    closes the upstream request."""
    server = GuardServer(config, environ=environ, clock=clock)
    app = web.Application(client_max_size=config.limits.max_body_bytes + 1024)
    app[SERVER] = server

    async def models(_: web.Request) -> web.Response:
        assert server._session is not None
        url = config.backends[0].url.rstrip("/") + "/v1/models"
        try:
            async with server._session.get(url) as upstream:
                return web.Response(
                    body=await upstream.read(),
                    status=upstream.status,
                    content_type="application/json",
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _error(502, "upstream_unreachable", f"backend unreachable: {exc}")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        backends = [
            {"url": b.url, "healthy": healthy}
            for b, healthy in zip(config.backends, server.backend_healthy, strict=True)
        ]
        up = server._session is not None and not server._session.closed
        ready = up and any(server.backend_healthy) and not server.draining
        body: dict[str, Any] = {"ready": ready, "backends": backends}
        if server.shared_floor is not None:
            body["store"] = server.store_status()
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(server.metrics.registry), content_type="text/plain"
        )

    async def admin_status(_: web.Request) -> web.Response:
        return web.json_response(server.status())

    async def completions(request: web.Request) -> web.StreamResponse:
        return await server.handle(request, "/v1/completions")

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await server.handle(request, "/v1/chat/completions")

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/status", admin_status)
    app.on_startup.append(server.start)
    app.on_shutdown.append(server.drain)
    app.on_cleanup.append(server.stop)
    return app
