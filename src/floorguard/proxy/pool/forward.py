"""A pool's conversation with its backend, from the forwarded request to the client's reply
(docs/design.md §12): connect / first-byte / idle timeouts, a backend's 4xx relayed as its own, a
non-streamed reply read whole, an SSE stream relayed through a bounded box at the backend's
pace (relay.py), and every way it can fail ended once in the guard (`Served.end`). The
backend is reached through the edge's `Upstream` (upstream.py), never aiohttp directly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp
import orjson
from aiohttp import web

from floorguard.clock import Clock
from floorguard.core.contract import Contract, ContractClass
from floorguard.core.events import TraceEvent
from floorguard.core.guard import Guard
from floorguard.core.surface import Dispatch
from floorguard.proxy.config.guard import BackendSpec, GuardServerConfig
from floorguard.proxy.edge.deadline import Deadline
from floorguard.proxy.edge.normalize import Work
from floorguard.proxy.edge.replies import (
    JSON,
    NO_RETRY,
    Exchange,
    end_stream,
    json_error,
)
from floorguard.proxy.observe.metrics import GuardMetrics
from floorguard.proxy.observe.tracing import Tracing
from floorguard.proxy.observe.usage import (
    USAGE,
    MalformedReplyError,
    Usage,
    UsageTap,
    is_sse,
    reply_usage,
)
from floorguard.proxy.pool.learner_http import HttpLearner
from floorguard.proxy.pool.relay import HeldReplies, ReplyBox
from floorguard.proxy.pool.upstream import UnreachableError, Upstream, UpstreamBroke, UpstreamReply

__all__ = [
    "FailedBeforeReplyError",
    "FaultHook",
    "Forwarder",
    "PoolHost",
    "Served",
    "UnreachableError",
]

FaultHook = Callable[[str], Awaitable[None]]
"""Awaited at each named await point of the request path (`parse`, `store`, `learner`,
`queue`, `connect`, `headers`, `stream`) where the edge has one: the fault-injection tests
raise or cancel there. Each site checks for it before calling (an await of a coroutine
that does nothing costs ≈ 1,000 instructions, five a request)."""

_RETRIED_STATUSES = frozenset({502, 503, 504})
"""A backend's answer that says it could not serve (a gateway's, an overloaded vLLM's)."""


class FailedBeforeReplyError(Exception):
    """The backend failed before the first byte of its reply — its connection broke, or it
    answered 502, 503 or 504 — and the caller allowed a retry: nothing reached the client,
    and the request goes to another backend once (not charged again: it was admitted)."""


log = logging.getLogger("floorguard.proxy")


class PoolHost(Protocol):
    """What a pool needs of the edge that hands it requests (the HTTP edge in `app.py`; a
    test gives a fake): the clock, the upstream transport, the event sink, the metrics, the
    held-reply budget, the fault hook and the drain's state."""

    clock: Clock
    loop: asyncio.AbstractEventLoop
    """The loop it serves on (held: `edge/deadline.py` says why)."""
    replica: str
    http_learner: HttpLearner | None
    tracing: Tracing | None
    """A span per request (`tracing:`), or None."""
    replies: HeldReplies
    cutting: bool
    """Set at the drain deadline: an ending request was cut by the drain."""
    num_cut_at_deadline: int

    @property
    def metrics(self) -> GuardMetrics: ...
    @property
    def upstream(self) -> Upstream:
        """The backends' transport (the request path, the health probes and reports)."""
        ...

    @property
    def session(self) -> aiohttp.ClientSession:
        """The learner callout's HTTP session (not the backends')."""
        ...

    fault_hook: FaultHook | None

    def on_event(self, event: TraceEvent) -> None: ...


class Served(Protocol):
    """What the backend half needs of the pool it serves (`Pool`): its configuration,
    clock, guard and edge, its backends and contracts, its metric label, and how a request
    ends in it (`end`) and which class it is of (`class_of`)."""

    config: GuardServerConfig
    clock: Clock
    guard: Guard
    edge: PoolHost
    backends: list[BackendSpec]
    contracts: dict[str, Contract]

    @property
    def label(self) -> str: ...
    def end(self, rid: str, kind: str, reason: str = "") -> None: ...
    def class_of(self, rid: str) -> ContractClass: ...


class Forwarder:
    """The backend half of a pool's request path: forward a dispatched request to its
    backend and relay the reply, ending the request in the pool when the backend is done."""

    def __init__(self, pool: Served) -> None:
        self.pool = pool
        self.edge, self.clock, self.guard = pool.edge, pool.clock, pool.guard
        """Fixed for a pool's life (its configuration, backends and contracts are not)."""
        self._warned_usage = False
        """A backend finished a reply without usage: said once per pool."""

    async def forward(
        self,
        request: web.Request,
        path: str,
        work: Work,
        decision: Dispatch,
        *,
        headers: dict[str, str],
        exchange: Exchange,
        retry: bool = False,
    ) -> web.StreamResponse:
        """Forward `decision`'s request and relay the reply. `retry`: a failure before the
        first byte of the reply raises `FailedBeforeReplyError` (the request not ended)
        instead of answering the client."""
        rid = str(decision.request.request_id)
        backend = self.pool.backends[decision.backend]
        upstream_config, fault_hook = self.pool.config.upstream, self.edge.fault_hook
        if fault_hook is not None:
            await fault_hook("connect")
        try:
            async with Deadline(self.edge.loop, upstream_config.first_byte_timeout_s):
                upstream = await self.edge.upstream.post(
                    backend.url.rstrip("/") + path,
                    work.body,
                    self._upstream_headers(decision, headers["x-request-id"], exchange.trace),
                )
        except (TimeoutError, UpstreamBroke) as exc:  # UnreachableError: the caller's
            if retry and isinstance(exc, UpstreamBroke):
                raise FailedBeforeReplyError(str(exc)) from exc
            return self._upstream_failed(rid, exc, headers)
        try:
            if fault_hook is not None:
                await fault_hook("headers")
            if retry and upstream.status in _RETRIED_STATUSES:
                raise FailedBeforeReplyError(f"the backend answered {upstream.status}")
            if upstream.status >= 300:
                self.pool.end(rid, "fail", f"upstream_{upstream.status}")
                if 400 <= upstream.status < 500 and upstream.status not in (408, 429):
                    return await _rejected(upstream, headers)
                return json_error(
                    502,
                    "upstream_error",
                    f"the backend answered {upstream.status}",
                    headers,
                    upstream_status=upstream.status,
                )
            tap = UsageTap(strip=not work.usage_asked) if work.stream else None
            try:
                if tap is not None:
                    return await self._relay(
                        request, rid, upstream, headers, exchange=exchange, tap=tap
                    )
                return await self._reply(request, rid, upstream, headers, exchange)
            finally:  # also when the client's leaving at the end cancels this handler
                self._count_usage(request, decision, tap, exchange)
        finally:
            upstream.release()

    def _count_usage(
        self, request: web.Request, decision: Dispatch, tap: UsageTap | None, exchange: Exchange
    ) -> None:
        """What the reply cost, for the access log and `floorguard_tokens_total`: as the
        backend said, or the guard's estimate where it did not (usage.py). Counted once the
        reply is over, however it ended: a client that reads a stream to its end and leaves
        at once cancels the handler before it returns, and the tokens were still spent."""
        usage = tap.usage if tap is not None else exchange.usage
        if usage is None:
            usage = self._estimate(decision, tap)
        request[USAGE] = usage
        pool, tenant = self.pool, decision.request.tenant
        pool.edge.metrics.on_usage(pool.label, tenant, pool.contracts[tenant].cls, usage)

    def _estimate(self, decision: Dispatch, tap: UsageTap | None) -> Usage:
        """A reply without usage billed from what the guard knows: the metered prompt, and
        the events read (a stream) or the metered cap (a whole reply). A backend that
        finished without usage is warned about, once per pool."""
        whole = tap.ended if tap is not None else True
        if whole and not self._warned_usage:
            self._warned_usage = True
            log.warning(
                "a backend of %s finished a reply without usage: billed the guard's estimate "
                "(floorguard_usage_estimated_total; docs/http.md, Usage)",
                self.pool.label,
            )
        request = decision.request
        completion = tap.events if tap is not None else request.num_output_tokens
        return Usage(
            request.num_prompt_tokens or 0,
            completion,
            "unreported" if whole else "cut",
        )

    def _upstream_headers(
        self, decision: Dispatch, request_id: str, trace: dict[str, str] | None
    ) -> dict[str, str]:
        """What goes upstream besides the body: JSON, the request id, the trace context
        (tracing.py), and (behind a GAIE pool) the objective of the request's class.
        Nothing else of the client's headers.

        The request id upstream is the client's `x-request-id`, then the decision log's id
        (`<x-request-id>.<id>`): unique, whatever clients send. A backend may name its own
        request by that header (vLLM does) and one that does not make it unique itself
        would take two tenants' requests that share an id for one: the first to leave
        aborted both (tests/integration/test_vllm.py, with vLLM's randomization off)."""
        upstream_id = f"{request_id}.{decision.request.request_id}"
        out = {**JSON, "x-request-id": upstream_id, **(trace or {})}
        objectives = self.pool.config.upstream.inference_objectives
        if objectives is not None:
            cls = self.pool.contracts[decision.request.tenant].cls
            if cls in objectives:
                out["x-gateway-inference-objective"] = objectives[cls]
        return out

    def _upstream_failed(
        self, rid: str, exc: BaseException, headers: dict[str, str]
    ) -> web.Response:
        """Before the response started: end the request as failed and answer 504 (the backend
        timed out) or 502 (its connection failed) — never with its text or address."""
        if isinstance(exc, TimeoutError):
            self.pool.end(rid, "fail", "upstream_timeout")
            return json_error(
                504, "upstream_timeout", "the backend did not answer in time", headers
            )
        self.pool.end(rid, "fail", "upstream_error")
        return json_error(502, "upstream_error", "the backend connection failed", headers)

    def _box(self, request: web.Request, limit_bytes: int) -> ReplyBox:
        """A reply box whose cut aborts this client's connection (relay.py)."""
        transport = request.transport
        return self.edge.replies.box(
            limit_bytes, transport.abort if transport is not None else None
        )

    async def _from_backend(
        self,
        rid: str,
        upstream: UpstreamReply,
        box: ReplyBox,
        first: bytes = b"",
        tap: UsageTap | None = None,
    ) -> Usage | None:
        """Read the backend's reply at the backend's pace into `box`, bounded by
        `limits.max_response_bytes`, and end the request in the guard when the backend has
        finished (its slot goes on then, whatever the client does). A failure ends the box
        with it; a cut box stops the reading (the request is aborted by the writer). A
        whole reply (no `tap`) must be a completion (else `upstream_malformed`): its usage
        is returned."""
        config = self.pool.config
        cap, idle = config.limits.max_response_bytes, config.upstream.idle_timeout_s
        metrics, cls = self.edge.metrics, self.pool.class_of(rid)
        fault_hook = self.edge.fault_hook
        size, chunk, length = 0, first, upstream.length
        last = self.clock.now() if first else 0.0  # a stream's: its gaps are measured
        try:
            if not chunk:
                chunk = await upstream.chunk(idle)
            while chunk:
                size += len(chunk)
                if size > cap:
                    self.pool.end(rid, "fail", "upstream_reply_too_large")
                    box.finish(("upstream_reply_too_large", f"the reply exceeds {cap} bytes"))
                    return None
                passed = tap.feed(chunk) if tap is not None else chunk
                if passed and not box.put(passed):
                    return None
                if fault_hook is not None:
                    await fault_hook("stream")
                if size == length:  # all it declared (aiohttp reads no further): no read to
                    break  # find the end
                chunk = await upstream.chunk(idle)
                if chunk and first:
                    now = self.clock.now()
                    metrics.on_chunk_gap(self.pool.label, cls, now - last)
                    last = now
        except (TimeoutError, UpstreamBroke) as exc:
            reason = (
                "upstream_timeout"
                if isinstance(exc, TimeoutError)
                else "upstream_broke_mid_stream"
                if first
                else "upstream_error"
            )
            self.pool.end(rid, "fail", reason)
            box.finish((reason, "the backend reply failed mid-way"))
            return None
        usage = None
        if tap is not None:
            rest, tap.ended = tap.flush(), True
            if rest and not box.put(rest):
                return None
        else:
            try:
                usage = reply_usage(box.whole())
            except MalformedReplyError:
                self.pool.end(rid, "fail", "upstream_malformed")
                box.finish(("upstream_malformed", "the backend's reply is not a completion"))
                return None
        self.pool.end(rid, "complete")
        box.finish()
        return usage

    async def _reply(
        self,
        request: web.Request,
        rid: str,
        upstream: UpstreamReply,
        headers: dict[str, str],
        exchange: Exchange,
    ) -> web.StreamResponse:
        """A non-streamed reply: read whole (up to `limits.max_response_bytes`), the request
        ended in the guard, then written to the client within `client_write_timeout_s`."""
        box = self._box(request, self.pool.config.limits.max_response_bytes)
        try:
            usage = await self._from_backend(rid, upstream, box)
            if box.cut_reason is not None:
                self.pool.end(rid, "abort", box.cut_reason)
                return json_error(503, box.cut_reason, "the guard holds too many replies")
            if box.failure is not None:
                code, message = box.failure
                self.pool.end(rid, "abort", code)  # stopped by the drain (a failure has ended it)
                status = {"upstream_timeout": 504, "drain_deadline": 503}.get(code, 502)
                return json_error(status, code, message, headers)
            body = box.take_all()
            exchange.usage = usage
            # A `Response`, not a `StreamResponse`: its headers go out with the body in one
            # write (one send, one segment for the client to read).
            response = web.Response(body=body, status=200, headers={**headers, **JSON})
            try:
                if _cannot_wait(request.transport, len(body)):  # untimed, as `_to_client`
                    await _send_whole(request, response)
                else:
                    async with Deadline(self.edge.loop, self.pool.config.client_write_timeout_s):
                        await _send_whole(request, response)
            except TimeoutError:
                box.cut("client_too_slow")
                log.info("request %s: its client was cut (client_too_slow)", rid)
            return response
        finally:
            box.close()

    async def _to_client(
        self, request: web.Request, response: web.StreamResponse, chunk: bytes
    ) -> None:
        """One write towards the client, within `client_write_timeout_s` (TimeoutError);
        untimed where it cannot wait for the client at all (`_cannot_wait`): a timer armed
        and cancelled per write was 2 % of a small request's instructions, and one per
        chunk of every stream."""
        if _cannot_wait(request.transport, len(chunk)):
            await response.write(chunk)
        else:
            async with Deadline(self.edge.loop, self.pool.config.client_write_timeout_s):
                await response.write(chunk)

    async def _relay(
        self,
        request: web.Request,
        rid: str,
        upstream: UpstreamReply,
        headers: dict[str, str],
        *,
        exchange: Exchange,
        tap: UsageTap,
    ) -> web.StreamResponse:
        """Relay an SSE stream (its usage read, and stripped where the guard asked for it,
        by `tap`). Before its first byte a failure is still a JSON error; after
        it, the stream ends with an SSE error event (never a second response). The backend
        is read into a bounded box at its own pace (`_from_backend`); the client is written
        from it, and cut when it cannot keep up (relay.py)."""
        timeouts = self.pool.config.upstream
        try:
            first = await upstream.chunk(timeouts.first_byte_timeout_s)
        except (TimeoutError, UpstreamBroke) as exc:
            return self._upstream_failed(rid, exc, headers)
        if not is_sse(first):  # an error page or plain text behind a 200
            self.pool.end(rid, "fail", "upstream_malformed")
            return json_error(
                502, "upstream_malformed", "the backend's reply is not an event stream", headers
            )
        response = web.StreamResponse(
            status=200,
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        exchange.response = response
        await response.prepare(request)
        self.guard.on_first_token(rid, self.clock.now())
        box = self._box(request, self.pool.config.limits.max_buffered_reply_bytes)
        reading = asyncio.create_task(self._from_backend(rid, upstream, box, first, tap))
        reading.add_done_callback(box.finish_with)
        try:
            while (chunk := await box.get()) is not None:
                await self._to_client(request, response, chunk)
            if box.cut_reason is None:
                await asyncio.wait([reading])
                reading.result()  # a fault inside the reading fails this request here
            if box.failure is not None:
                await end_stream(response, *box.failure)
            elif box.cut_reason is None:
                with contextlib.suppress(ConnectionResetError):
                    await response.write_eof()
        except TimeoutError:
            box.cut("client_too_slow")
        except ConnectionResetError:
            pass
        finally:
            if not reading.done():
                reading.cancel()
                await asyncio.wait([reading])
            stopped = box.failure[0] if box.failure is not None else None
            self.pool.end(rid, "abort", box.cut_reason or stopped or "client_disconnected")
            if box.cut_reason is not None:
                log.info("request %s: its client was cut (%s)", rid, box.cut_reason)
            box.close()
        return response


async def _send_whole(request: web.Request, response: web.Response) -> None:
    await response.prepare(request)
    await response.write_eof()


def _cannot_wait(transport: asyncio.WriteTransport | None, size: int) -> bool:
    """Whether writing `size` bytes (and their framing) to the client's `transport` returns
    without waiting for the client to read: its protocol is not paused (asyncio resumes a
    paused writer only once its buffer is down to the low-water mark) and this write keeps
    the buffer under the high-water mark (where asyncio would pause it). aiohttp's writer
    waits only on a paused protocol. (uvloop's transports have these methods without
    subclassing asyncio's.)"""
    if transport is None or transport.is_closing():
        return False
    low, high = transport.get_write_buffer_limits()
    held = transport.get_write_buffer_size()
    return held <= low and held + size + _FRAMING_BYTES < high


_FRAMING_BYTES = 8192
"""Room for what aiohttp adds to a write: the status line and headers, a chunk's framing."""


async def _rejected(upstream: UpstreamReply, headers: dict[str, str]) -> web.Response:
    """A backend's 4xx (the request itself is wrong: a mistyped model, a field it refuses)
    relayed as that 4xx in the OpenAI shape, not retryable — a retry would cost the tenant
    another admission. Only the backend's own message goes back, clipped."""
    message = ""
    with contextlib.suppress(Exception):
        answer = orjson.loads(await upstream.head(8192))
        error = answer.get("error", answer) if isinstance(answer, dict) else {}
        found = error.get("message") or error.get("detail") if isinstance(error, dict) else None
        message = found if isinstance(found, str) else ""
    status = upstream.status
    return json_error(
        status,
        "upstream_rejected",
        f"the backend refused the request ({status})" + (f": {message[:300]}" if message else ""),
        {**headers, **NO_RETRY},
        upstream_status=status,
    )
