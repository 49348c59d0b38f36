"""The HTTP guard: an OpenAI-compatible proxy that runs the same `Guard` core as the
simulator, on the wall clock, in front of OpenAI-compatible backends (vLLM first).

The edge of one request (docs/design.md §12), here:

    identity → tenant (401/403) → the whole body, size-limited (413) → normalize: the
    forwarded bytes, ℓ, the prompt's tokens and the model (400; 404 for a model no pool
    serves) → the pool of that model (`pool.Pool`: admission, queue, backends).

Without `models:` there is one pool and the body's `model` is forwarded as it is.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import re
import secrets
import socket
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from aiohttp.web_urldispatcher import _default_expect_handler

from floorguard.clock import Clock, WallClock
from floorguard.core.events import TraceEvent
from floorguard.core.guard import Guard
from floorguard.errors import ConfigError
from floorguard.proxy.config.guard import GuardServerConfig, load_config, reload_refusals
from floorguard.proxy.edge.identity import AuthError, UnknownKidError, create_identity
from floorguard.proxy.edge.normalize import (
    BadRequestError,
    TokenCounter,
    Work,
    edge_limits,
    load_tokenizer,
    normalize,
)
from floorguard.proxy.edge.replies import NO_RETRY, RefusedError, json_error, next_chunk
from floorguard.proxy.observe.access_log import access_line, error_code
from floorguard.proxy.observe.decision_log import DecisionLog, LineLog
from floorguard.proxy.observe.metrics import GuardMetrics
from floorguard.proxy.observe.tracing import Tracing
from floorguard.proxy.pool.forward import FaultHook
from floorguard.proxy.pool.health import BackendHealth
from floorguard.proxy.pool.learner_http import HttpLearner
from floorguard.proxy.pool.pool import Pool
from floorguard.proxy.pool.pump import Pump
from floorguard.proxy.pool.relay import HeldReplies
from floorguard.proxy.pool.upstream import HttpUpstream, Upstream
from floorguard.proxy.process.admin import admin_routes, admin_token
from floorguard.proxy.process.http_server import (
    GuardRunner,
    close_after_response,
    json_errors,
)
from floorguard.store.leases import SlotLeases
from floorguard.store.shared import SharedFloor

__all__ = ["SERVER", "FaultHook", "GuardRunner", "GuardServer", "create_admin_app", "create_app"]

log = logging.getLogger("floorguard.proxy")

_HISTORY_S = 300
"""Seconds of per-second history the status page charts."""

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
"""A client's `x-request-id` that is kept (anything else is replaced by a fresh one)."""


class GuardServer:
    """The edge and its pools: identity, bodies, the decision log, metrics, the upstream
    session; one `Pool` per model (`models:`), or one for every model."""

    _upstream: Upstream | None = None
    """The backends' transport (`HttpUpstream` over `_session`), from startup."""

    loop: asyncio.AbstractEventLoop
    """The loop it serves on, from startup (asked once: CPython 3.11's `get_running_loop`
    makes a `getpid` system call each time; `edge/deadline.py`)."""

    served_models: frozenset[str] | None = None
    """One pool (`backends:`): the model names its backends list at `/v1/models`, as last
    heard (refreshed every `_MODELS_TTL_S`); another name is refused before admission.
    None until one answers (then every name goes through)."""

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
        self._environ = environ
        self.config = config
        self.config_path: str | None = None  # the file `serve` read: a reload reads it,
        self.worker: int | None = None  # as it applies to this worker of `workers: N`
        self.reloads: list[dict[str, Any]] = []
        """Each reload's summary, oldest first (`/admin/status`)."""
        self.clock = clock or WallClock()
        self.identity = create_identity(config.identity, environ, clock=self.clock)
        self._identity_mode = config.identity.mode
        rotate = config.decision_log_rotate  # both logs rotate alike
        rotation: dict[str, Any] = {
            "max_bytes": int(rotate.max_mb * 2**20) if rotate and rotate.max_mb else None,
            "max_age_s": rotate.max_age_s if rotate else None,
            "clock": self.clock,
        }
        self._log = DecisionLog(config.decision_log, **rotation) if config.decision_log else None
        self._access = LineLog(config.access_log, **rotation) if config.access_log else None
        self.served: defaultdict[str, int] = defaultdict(int)  # not a Counter: metrics.py
        """Requests answered, by status class (`2xx`, `4xx`, …): said at shutdown."""
        self._background: list[asyncio.Task[None]] = []
        self.fault_hook = fault_hook
        self.draining = False
        """Set on shutdown (SIGTERM): new requests get 503, in-flight ones finish."""
        self.cutting = False
        """Set at the drain deadline: what is still running is cut (`drain_deadline`)."""
        self.num_cut_at_deadline = 0
        callout = config.learner_http
        self.http_learner = HttpLearner(callout.url, callout.timeout_ms / 1e3) if callout else None
        self.replica = config.replica or f"{socket.gethostname()}-{os.getpid()}"
        self.tracing = Tracing(config.tracing, replica=self.replica) if config.tracing else None
        self._metrics: GuardMetrics | None = None  # built below, once the pools exist
        self.pools: dict[str | None, Pool] = {
            name: Pool(self, name, pool_config, seed=seed)
            for name, pool_config in config.pools().items()
        }
        """By model (`models:`); `{None: pool}` without them."""
        self._metrics = GuardMetrics(
            {pool.label: (pool.guard, pool.shared_floor) for pool in self.pools.values()},
            self.clock.now,
            self.http_learner.outcomes if self.http_learner is not None else None,
            backend_ids={
                pool.label: [b.url.rstrip("/") for b in pool.config.backends]
                for pool in self.pools.values()
            },
        )
        self._metrics.backends_up = {p.label: p.health.states for p in self.pools.values()}
        if self._access is not None:
            self._metrics.ended = {}
        limits = config.limits
        self.limits = edge_limits(limits)
        self.tokenizer: TokenCounter | None = (
            load_tokenizer(str(limits.tokenizer)) if limits.tokenizer else None
        )
        self.admin_token = admin_token(config, environ)
        self._ids = itertools.count()
        self.history: deque[dict[str, float]] = deque(maxlen=_HISTORY_S)
        """Per second, the last `_HISTORY_S`: admissions, refusals, drops, lateness (the
        status page's charts)."""
        self._session: aiohttp.ClientSession | None = None
        self._large_bodies: dict[str, asyncio.Semaphore] = {}
        self._side_session: aiohttp.ClientSession | None = None
        """For calls beside admitted work (`/v1/models`): never the dispatch connector."""
        self._models: tuple[float, bytes] | None = None
        self._models_fetch: asyncio.Future[bytes | None] | None = None
        self.replies = HeldReplies(limits.max_held_reply_bytes)
        """Reply bytes held for clients, bounded (relay.py)."""
        self._tenants = {t for pool in self.pools.values() for t in pool.contracts}

    @property
    def metrics(self) -> GuardMetrics:
        assert self._metrics is not None
        return self._metrics

    @property
    def pool(self) -> Pool:
        """The one pool (without `models:`); with several, use `pools[model]`."""
        if len(self.pools) != 1:
            raise RuntimeError(f"{len(self.pools)} pools: use .pools[model]")
        return next(iter(self.pools.values()))

    @property
    def guard(self) -> Guard:
        return self.pool.guard

    @property
    def pump(self) -> Pump:
        return self.pool.pump

    @property
    def health(self) -> BackendHealth:
        return self.pool.health

    @property
    def shared_floor(self) -> SharedFloor | None:
        return self.pool.shared_floor

    @property
    def leases(self) -> SlotLeases | None:
        return self.pool.leases

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

    @property
    def upstream(self) -> Upstream:
        """The backends' transport, over that session."""
        if self._upstream is None:
            raise RuntimeError("the guard server has not started")
        return self._upstream

    def any_up(self) -> bool:
        return any(pool.health.any_up() for pool in self.pools.values())

    # -- plumbing -------------------------------------------------------------------------

    def on_event(self, event: TraceEvent) -> None:
        """Every pool's events: the decision log and the metrics."""
        if self._log is not None:
            self._log.append(event)
        if self._metrics is not None:
            self._metrics.on_event(event)

    async def start(self, _: web.Application) -> None:
        self.loop = asyncio.get_running_loop()
        upstream = self.config.upstream
        slots = sum(pool.guard.config.total_slots for pool in self.pools.values())
        # No cookie jar: the sessions are every tenant's, so a cookie one tenant's reply set
        # would go upstream with the next tenant's request (test_attacks.py).
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=upstream.connect_timeout_s,
                sock_connect=upstream.connect_timeout_s,
            ),
            connector=aiohttp.TCPConnector(limit=slots + 32),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._upstream = HttpUpstream(self._session, self.loop)
        self._side_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=2), cookie_jar=aiohttp.DummyCookieJar()
        )
        try:
            jwks = self.identity.jwks
            if jwks is not None:  # one that cannot be fetched refuses the start
                jwks.session = self._side_session
                await jwks.fetch()
            for pool in self.pools.values():
                self._background += await pool.start(self._upstream)
        except BaseException:  # refused at start (a ConfigError): nothing left open
            await self._close_sessions()
            raise
        self._background.append(asyncio.create_task(self._refresh_jwks_every()))
        if self._log is not None or self._access is not None:
            self._background.append(asyncio.create_task(self._flush_every()))
        self._background.append(asyncio.create_task(self._sample_every()))
        if None in self.pools:
            self._background.append(asyncio.create_task(self._learn_models_every()))

    async def _refresh_jwks_every(self) -> None:
        """Fetch the identity's JWKS again every `jwks_refresh_s` (whichever set a reload
        put in place; none: nothing to fetch)."""
        while True:
            jwks = self.identity.jwks
            await self.clock.sleep(jwks.refresh_s if jwks is not None else 60.0)
            if self.identity.jwks is not None:
                await self.identity.jwks.refresh()

    async def model_list(self) -> web.Response:
        """`/v1/models`: the backend's (`_model_listing`)."""
        listing = await self._model_listing()
        if listing is None:
            return json_error(502, "upstream_unreachable", "the backend could not be reached")
        return web.Response(body=listing, status=200, content_type="application/json")

    async def _model_listing(self) -> bytes | None:
        """The backend's `/v1/models`, from a copy at most `_MODELS_TTL_S` old: one fetch at
        a time, on a connection pool of its own, so no number of (unauthenticated) calls
        shares what admitted work needs; None if it did not answer."""
        now = self.clock.now()
        if self._models is None or now - self._models[0] > _MODELS_TTL_S:
            if self._models_fetch is None or self._models_fetch.done():
                self._models_fetch = asyncio.ensure_future(self._fetch_models())
            answer = await asyncio.shield(self._models_fetch)
            if answer is None:
                return None
            self._models = (now, answer)
        return self._models[1]

    async def _learn_models_every(self) -> None:
        """One pool: the names its backend lists, every `_MODELS_TTL_S` (the listing
        clients get, one fetch for both): a mistyped model is then refused before it takes
        a floor credit or a backend's round trip (`_route`). A listing that names none (a
        backend that serves any name) checks nothing."""
        while True:
            listing = await self._model_listing()
            names = _model_ids(listing) if listing is not None else None
            self.served_models = names or None
            await self.clock.sleep(_MODELS_TTL_S if names is not None else 0.5)

    async def _fetch_models(self) -> bytes | None:
        pool = self.pool
        up = [b for b, ok in zip(pool.backends, pool.health.healthy, strict=True) if ok]
        url = (up or pool.config.backends)[0].url.rstrip("/") + "/v1/models"
        assert self._side_session is not None
        try:
            async with asyncio.timeout(self.config.upstream.first_byte_timeout_s):
                async with self._side_session.get(url, allow_redirects=False) as upstream:
                    if upstream.status != 200:
                        return None
                    return await upstream.content.read(self.config.limits.max_response_bytes)
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def _sample_every(self) -> None:
        """Once a second, what happened in it (from the metrics' cumulative counts)."""
        last = self.metrics.totals()
        while True:
            await self.clock.sleep(1.0)
            now = self.metrics.totals()
            sample: dict[str, float] = {"t": round(self.clock.now(), 3)}
            for key in _SAMPLED:
                sample[key] = now.get(key, 0) - last.get(key, 0)
            self.history.append(sample)
            last = now

    async def _flush_every(self) -> None:
        while True:
            await self.clock.sleep(self.config.decision_log_flush_s)
            self.flush_log()

    def flush_log(self) -> None:
        """Write every pending decision-log (and access-log) line now (the timer does it
        every `decision_log_flush_s`; shutdown does it too)."""
        for lines in (self._log, self._access):
            if lines is not None:
                lines.flush()

    def num_working(self) -> int:
        """Requests in flight or queued, and replies still being written to clients."""
        held = len(self.replies)
        return held + sum(p.guard.num_in_flight + p.guard.num_queued for p in self.pools.values())

    async def drain(self, _: web.Application | None = None) -> None:
        """Start draining (SIGTERM): still listening, new requests get 503 `draining` with
        `Connection: close`, `/readyz` 503; in-flight and queued work may finish."""
        if self.draining:
            return
        self.draining = True
        in_flight = sum(p.guard.num_in_flight for p in self.pools.values())
        queued = sum(p.guard.num_queued for p in self.pools.values())
        log.info(
            "draining: new requests get 503; %d in flight and %d queued may finish within %g s",
            in_flight,
            queued,
            self.config.drain_timeout_s,
        )

    async def drained(self, timeout_s: float) -> None:
        """Wait until nothing is working or `timeout_s` has passed; then cut what is left
        (`drain_deadline`): a queued request is answered 503 `draining`, a stream ends with
        the SSE error event, a whole reply is a 503 — and wait (up to `_CUT_WAIT_S`) for
        their handlers to write those answers before anything closes."""
        clock = self.clock
        deadline = clock.now() + timeout_s
        while self.num_working() and clock.now() < deadline:
            await clock.sleep(0.02)
        if not self.num_working():
            return
        self.cutting = True
        for pool in self.pools.values():
            pool.pump.cut_waiting()
        self.replies.stop_all("drain_deadline", "the guard is shutting down; retry")
        deadline = clock.now() + _CUT_WAIT_S
        while self.num_working() and clock.now() < deadline:
            await clock.sleep(0.01)
        if self.num_working():
            log.warning(
                "%d request(s) still working %g s after the drain deadline's cut: closed",
                self.num_working(),
                _CUT_WAIT_S,
            )

    async def _close_sessions(self) -> None:
        for session in (self._session, self._side_session):
            if session is not None:
                await session.close()

    async def stop(self, _: web.Application) -> None:
        for task in self._background:
            task.cancel()
        for pool in self.pools.values():
            await pool.stop()
        await self._close_sessions()
        for lines in (self._log, self._access):
            if lines is not None:
                lines.close()
        if self.tracing is not None:  # export what is batched, off the loop
            await asyncio.to_thread(self.tracing.shutdown)
        log.info(
            "stopped: answered %s; %d request(s) cut at the drain deadline; decision log %s",
            dict(sorted(self.served.items())) or "none",
            self.num_cut_at_deadline,
            f"written to {self.config.decision_log}" if self._log is not None else "off",
        )

    # -- reload (design §14) -----------------------------------------------------------------

    def reload_file(self) -> dict[str, Any]:
        """Read the configuration file again and `reload` it (SIGHUP, `POST /admin/reload`)."""
        if self.config_path is None:
            raise ConfigError("reload", None, "this guard was not started from a file")
        config = load_config(self.config_path, self._environ)
        return self.reload(config if self.worker is None else config.for_worker(self.worker))

    def reload(self, config: GuardServerConfig) -> dict[str, Any]:
        """Take `config` without a restart: contracts and floors govern from each pool's
        next window (an open window keeps what it granted), backends, identity keys and
        secrets, limits and queue limits at once; a removed tenant's and a removed
        backend's requests finish. Everything is validated before anything changes: a
        `ConfigError` leaves the running configuration as it is. Returns what changed."""
        if self.draining:
            raise ConfigError("reload", None, "the guard is draining: nothing is reloaded")
        refusals = reload_refusals(self.config, config)
        if refusals:
            raise ConfigError("reload", self.config_path, "; ".join(refusals))
        identity = create_identity(
            config.identity, self._environ, clock=self.clock, jwks=self.identity.jwks
        )
        if identity.jwks is not None and identity.jwks is not self.identity.jwks:
            identity.jwks.session = self._side_session  # another URL: fetched now, and its
            self._background.append(asyncio.ensure_future(identity.jwks.refresh()))  # first
        limits = config.limits
        tokenizer = load_tokenizer(str(limits.tokenizer)) if limits.tokenizer else None
        wanted = config.pools()
        plans = {name: pool.plan_reload(wanted[name]) for name, pool in self.pools.items()}
        changes = {
            pool.label: plans[name].changes(pool.guard.config, pool.backends, pool.removed)
            for name, pool in self.pools.items()
        }
        now = self.clock.now()
        windows = {pool.label: pool.apply_reload(plans[n], now) for n, pool in self.pools.items()}
        self.identity, self._identity_mode = identity, config.identity.mode
        self.limits, self.tokenizer = edge_limits(limits), tokenizer
        self.replies.limit_bytes = limits.max_held_reply_bytes
        self._tenants |= {t for pool in self.pools.values() for t in pool.contracts}
        self.config = config
        summary = {"at": now, "contracts_from_window": windows, "changes": changes}
        self.reloads.append(summary)
        for label, window in windows.items():
            log.info(
                "reloaded%s: %s; contracts govern from window %d, backends and limits now",
                f" (model {label})" if len(windows) > 1 else "",
                "; ".join(f"{k} {v}" for k, v in changes[label].items()) or "nothing changed",
                window,
            )
        return summary

    # -- before admission -----------------------------------------------------------------

    def _tenant(self, request: web.Request) -> str:
        try:
            mode = self._identity_mode
            transport = request.transport if mode == "mtls" else None
            peercert = transport.get_extra_info("peercert") if transport is not None else None
            tenant = self.identity.tenant_of(
                request.headers,
                peercert,
                request.remote if mode == "header" else None,  # only header mode reads it
                request.query if "?" in request.raw_path else None,  # a query's parse: rare
            )
        except AuthError as exc:
            if isinstance(exc, UnknownKidError) and self.identity.jwks is not None:
                raise  # the caller fetches the JWKS again and asks once more
            raise RefusedError(json_error(exc.status, exc.kind, str(exc))) from exc
        if tenant not in self._tenants:
            raise RefusedError(
                json_error(403, "unknown_tenant", f"tenant {tenant[:80]!r} has no contract")
            )
        return tenant

    async def _read_body(self, request: web.Request) -> bytes:
        """The whole body, until EOF, with the size limit applied as it streams in."""
        limit = self.config.limits.max_body_bytes
        declared = request.content_length
        if (declared or 0) > limit:
            close_after_response(request)
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        loop = self.loop
        # for the whole body; a socket read's deadline is the loop's, as asyncio's timeouts are
        deadline = loop.time() + self.config.header_timeout_s
        content = request.content
        try:
            while chunk := await next_chunk(content, loop, deadline - loop.time()):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
                if size == declared:  # all of it (aiohttp's parser reads no further): no
                    break  # second read to find the end
        except TimeoutError:
            raise RefusedError(
                json_error(408, "body_timeout", "the body did not arrive in time", NO_RETRY)
            ) from None
        except (HttpProcessingError, RequestPayloadError) as exc:  # e.g. gzip that is not gzip
            close_after_response(request)
            raise RefusedError(
                json_error(
                    400,
                    "bad_content_encoding",
                    "the body cannot be decoded as its Content-Encoding says",
                    NO_RETRY,
                )
            ) from exc
        return b"".join(chunks)

    def _route(self, tenant: str) -> Callable[[str | None], int | None]:
        """For `normalize`: the body's model → its pool, checked (404 for a model no pool
        serves, 403 for a tenant with no contract there); the backend priority to write."""

        def priority(model: str | None) -> int | None:
            pool = self.pools.get(None) or self.pools.get(model or "")
            served = self.served_models if None in self.pools else None
            if served is not None and model is not None and model not in served:
                raise BadRequestError(
                    404,
                    "model_not_found",
                    f"the model {model[:80]!r} is not served here (the backends list "
                    f"{sorted(served)[:10]}); GET /v1/models lists the models",
                    "model",
                )
            if pool is None:
                raise BadRequestError(
                    404,
                    "model_not_found",
                    f"the model {str(model)[:80]!r} is not served here; GET /v1/models "
                    "lists the models",
                    "model",
                )
            contract = pool.contracts.get(tenant)
            if contract is None:
                raise BadRequestError(
                    403,
                    "no_contract_for_model",
                    f"tenant {tenant!r} has no contract for {model!r}",
                    "model",
                )
            return contract.cls.backend_priority if self.config.forward_priority else None

        return priority

    async def _normalize_apart(self, raw: bytes, path: str, tenant: str) -> Work:
        """A large body normalized off the event loop, one at a time per tenant."""
        async with self._large_bodies.setdefault(tenant, asyncio.Semaphore(1)):
            return await asyncio.to_thread(self._normalize, raw, path, tenant)

    def _normalize(self, raw: bytes, path: str, tenant: str) -> Work:
        """The body normalized (`normalize`), or refused (`RefusedError`)."""
        chat, embedding = path.endswith("/chat/completions"), path.endswith("/embeddings")
        try:
            return normalize(
                raw,
                chat=chat,
                limits=self.limits,
                priority=self._route(tenant),
                tokenizer=self.tokenizer,
                embedding=embedding,
            )
        except BadRequestError as exc:
            raise RefusedError(
                json_error(exc.status, exc.kind, str(exc), NO_RETRY, param=exc.param)
            ) from exc

    async def _prepare(
        self, request: web.Request, path: str, seen: dict[str, Any]
    ) -> tuple[str, Work, Pool]:
        """Everything before admission: the tenant, the whole body, the normalized work,
        its pool (what is known so far is put in `seen`, for the access log)."""
        if self.draining:
            raise RefusedError(
                json_error(
                    503,
                    "draining",
                    "this guard is shutting down; retry",
                    {"Connection": "close", "Retry-After": "1"},
                )
            )
        try:
            tenant = self._tenant(request)
        except UnknownKidError:  # the provider may have rotated its key: fetch, ask once more
            assert self.identity.jwks is not None
            await self.identity.jwks.fetch_for_unknown_kid()
            try:
                tenant = self._tenant(request)
            except UnknownKidError as exc:
                raise RefusedError(json_error(exc.status, exc.kind, str(exc))) from exc
        seen["tenant"] = tenant
        raw = await self._read_body(request)
        if self.fault_hook is not None:
            await self.fault_hook("parse")
        if len(raw) > _LARGE_BODY_BYTES:  # off the event loop
            work = await self._normalize_apart(raw, path, tenant)
        else:
            work = self._normalize(raw, path, tenant)
        seen["model"] = work.model[:_LOGGED_CHARS] if work.model is not None else None
        seen["stream"] = work.stream
        seen["max_tokens"] = work.num_output_tokens
        seen["prompt_tokens"] = work.num_prompt_tokens
        pool = self.pools.get(None) or self.pools[work.model or ""]
        if not pool.health.any_up():
            retry = str(max(1, math.ceil(self.config.health_interval_s)))
            raise RefusedError(
                json_error(
                    503,
                    "no_healthy_backend",
                    "no backend is answering its health probe",
                    {"Retry-After": retry},
                )
            )
        return tenant, work, pool

    async def handle(self, request: web.Request, path: str) -> web.StreamResponse:
        """One request, end to end: its `x-request-id` (the client's, if well-formed, else
        a fresh one) goes upstream and back, and it is one access-log line."""
        given = request.headers.get("x-request-id", "")
        request_id = given if given and _REQUEST_ID.match(given) else _fresh_request_id()
        rid = f"{self.replica}-{next(self._ids)}"
        seen: dict[str, Any] = {}
        response: web.StreamResponse | None = None
        try:
            try:
                tenant, work, pool = await self._prepare(request, path, seen)
            except RefusedError as refused:
                response = refused.response
                self.metrics.on_refused(response.status, error_code(response))
            else:
                response = await pool.handle(
                    request, path, work, tenant=tenant, rid=rid, request_id=request_id
                )
            return response
        finally:
            if response is not None and not response.prepared:
                response.headers["x-request-id"] = request_id
            if response is not None and self.draining:  # no keep-alive past the drain: the
                response.force_close()  # next request would find the connection closed
            status = response.status if response is not None else 499  # the client left
            self.served[f"{status // 100}xx"] += 1
            if self._access is not None:
                self._access.append_line(
                    access_line(
                        request,
                        path,
                        response,
                        status=status,
                        ids=(request_id, rid),
                        seen=seen,
                        now=self.clock.now(),
                        ended=self.metrics.take_ended(rid),
                    )
                )

    # -- status ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """`/admin/status`: the guard's window, queues, monitors, §6 report, and the store;
        with `models:`, one such object per model under `pools`; and the replica's name and
        process, the reply bytes held for clients (`replies`: held now, replies cut), the
        last reloads."""
        replies = {"held_bytes": self.replies.held_bytes, "cut": self.replies.num_cut}
        edge = {
            "replica": self.replica,
            "pid": os.getpid(),
            "replies": replies,
            "reloads": self.reloads[-10:],
            "attainment": self.metrics.attainment(),
        }
        if self.identity.jwks is not None:
            edge["jwks"] = self.identity.jwks.status()
        if None in self.pools:
            return {**self.pools[None].status(), **edge}
        return {"pools": {n: pool.status() for n, pool in self.pools.items()}, **edge}

    def store_status(self) -> dict[str, Any]:
        """The shared floor's state (the one pool's; with several, the worst of them)."""
        states = [p.shared_floor.status() for p in self.pools.values() if p.shared_floor]
        degraded = [s for s in states if s["state"] != "shared"]
        return (degraded or states)[0]


def _too_large(limit: int) -> RefusedError:
    return RefusedError(
        json_error(413, "body_too_large", f"the body exceeds {limit} bytes", NO_RETRY)
    )


def _model_ids(listing: bytes) -> frozenset[str] | None:
    """The model ids an OpenAI `/v1/models` body lists, or None if it is not one."""
    try:
        return frozenset(str(m["id"]) for m in orjson.loads(listing)["data"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


_ID_PREFIX: Final = secrets.token_hex(8)
_ID_COUNT: Final = itertools.count(1 << 64)


def _fresh_request_id() -> str:
    """A fresh `x-request-id` (32 hex digits): a random prefix for this process, then a
    count — unique across replicas and workers (each its own process) without a
    `getrandom` system call per request. The count starts at 2⁶⁴, so `hex` writes it as
    `0x1` and 16 digits (a format spec would cost a compiled build ~4,000 instructions).
    (Not a module-level generator expression: mypyc evaluates one eagerly, and over
    `itertools.count()` that never ends.)"""
    return _ID_PREFIX + hex(next(_ID_COUNT))[3:]


_SAMPLED = (
    "entitled", "surplus", "reject", "drop", "late", "complete", "fail", "floor_ended",
    "floor_met",
)  # fmt: skip
"""The status page's counts a second (`/admin/history`): admissions, refusals, drops,
outcomes, and the floor-entitled requests that ended and that were met (attainment)."""

_LARGE_BODY_BYTES = 65_536
"""A body larger than this is parsed and counted off the event loop, one at a time per
tenant: one tenant's megabyte bodies cannot delay another's arrivals."""


_CUT_WAIT_S = 2.0
"""After the drain deadline's cut: how long the handlers get to write their last answers
(a queued request's 503, a stream's error event) before the listener closes them."""

_LOGGED_CHARS = 200
"""A client-controlled string (the body's `model`) is clipped to this in the logs."""

_MODELS_TTL_S = 5.0
"""How long the edge answers `/v1/models` from its copy of the backend's list."""

SERVER: web.AppKey[GuardServer] = web.AppKey("floorguard.server", GuardServer)
"""The app's `GuardServer` (its guard, metrics and status)."""


def create_app(
    config: GuardServerConfig,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    fault_hook: FaultHook | None = None,
) -> web.Application:
    """Everything is built here: no module-level state (docs/design.md §18.12). Run it with
    `GuardRunner(app, handler_cancellation=True)`: a client that disconnects then cancels
    its handler at once, so the guard aborts the request, frees its slot and closes the
    upstream request. With `admin.port` the admin paths are served by `create_admin_app`
    on a listener of their own, not here."""
    server = GuardServer(config, environ=environ, clock=clock, fault_hook=fault_hook)
    app = web.Application(middlewares=[json_errors])
    app[SERVER] = server

    async def models(_: web.Request) -> web.Response:
        if config.models is not None:  # what this guard serves, not what a backend says
            return web.json_response(
                {
                    "object": "list",
                    "data": [
                        {"id": name, "object": "model", "created": 0, "owned_by": "floorguard"}
                        for name in config.models
                    ],
                }
            )
        return await server.model_list()

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        """200 while the upstream session is open, some backend answers its probe and the
        guard is not draining (with `models:`, a model whose backends are all down answers
        503 `no_healthy_backend`; the others go on)."""
        backends = [
            {"backend": n, "healthy": healthy, **({"model": name} if name is not None else {})}
            for name, pool in server.pools.items()
            for n, healthy in enumerate(pool.health.healthy)
        ]
        ready = server.upstream_open and server.any_up() and not server.draining
        body: dict[str, Any] = {"ready": ready, "backends": backends}
        if any(pool.shared_floor is not None for pool in server.pools.values()):
            body["store"] = server.store_status()["state"]
        return web.json_response(body, status=200 if ready else 503)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await server.handle(request, "/v1/completions")

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await server.handle(request, "/v1/chat/completions")

    async def embeddings(request: web.Request) -> web.StreamResponse:
        return await server.handle(request, "/v1/embeddings")

    async def expect(request: web.Request) -> web.Response | None:
        """`Expect: 100-continue`: an oversized body is refused before the client sends it
        (413, the connection closed), not invited with 100 Continue."""
        limit = server.config.limits.max_body_bytes
        if (request.content_length or 0) > limit:
            close_after_response(request)
            return _too_large(limit).response
        await _default_expect_handler(request)
        return None

    app.router.add_post("/v1/completions", completions, expect_handler=expect)
    app.router.add_post("/v1/chat/completions", chat_completions, expect_handler=expect)
    app.router.add_post("/v1/embeddings", embeddings, expect_handler=expect)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if config.admin.port is None:
        admin_routes(server, app, loopback_only=True)
    app.on_startup.append(server.start)
    app.on_shutdown.append(server.drain)
    app.on_cleanup.append(server.stop)
    return app


def create_admin_app(server: GuardServer) -> web.Application:
    """The admin listener's app (`admin.port`): `/metrics` and `/admin/status` of `server`."""
    app = web.Application(middlewares=[json_errors])
    admin_routes(server, app, loopback_only=False)
    return app
