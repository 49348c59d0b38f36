"""The guard's HTTP server below aiohttp's routing: every refusal in the OpenAI JSON error
shape — aiohttp's own (404, 405, …), the HTTP parser's (a malformed request line or
header), an HTTP/0.9 request line, a client that half-closes before its answer — and each
connection counted against the edge's cap (connections.py). `GuardRunner` serves an app
on it."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import HttpVersion10, web
from aiohttp.web_protocol import RequestHandler

from floorguard.proxy.edge.openai_format import error_body
from floorguard.proxy.edge.replies import json_error
from floorguard.proxy.process.connections import ConnectionCap

__all__ = [
    "GuardRunner",
    "JsonErrorHandler",
    "close_after_response",
    "freeze_startup_heap",
    "json_errors",
]

log = logging.getLogger("floorguard.proxy")


def freeze_startup_heap() -> None:
    """Once a server is listening: collect, then move every object alive (the modules, the
    configuration, the app) out of the cyclic garbage collector's reach (`gc.freeze`). The
    collector's full passes otherwise walk that whole start-up heap again and again while
    it serves: 3.7 % of a small request's instructions at 32 in flight (docs/benchmarks.md).
    Objects made later, a reload's included, are collected as before. Called by `serve` and
    by `bench proxy`'s server, so the bench measures what `serve` runs."""
    gc.collect()
    gc.freeze()


def close_after_response(request: web.Request) -> None:
    protocol = request.protocol
    if isinstance(protocol, JsonErrorHandler):
        protocol.close_after_response()


def _raw_json_error(status: int, reason: str, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response with `Connection: close`, for writing straight to a
    transport where aiohttp's response machinery cannot answer."""
    body = orjson.dumps(error_body(code, message, status=status))
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nx-should-retry: false\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
        % (status, reason.encode(), len(body), body)
    )


_HTTP09_REFUSAL = _raw_json_error(
    505, "HTTP Version Not Supported", "http_version", "send HTTP/1.0 or later"
)
"""The answer to an HTTP/0.9 request line, written raw (aiohttp would answer it in 0.9)."""
_HALF_CLOSE_REFUSAL = _raw_json_error(
    400,
    "Bad Request",
    "half_closed",
    "the client closed its sending side before the answer: this guard reads that as the "
    "client leaving and aborts the request (keep the connection open until the response, "
    "or ask the operator for half_close: serve)",
)

_STATUS_TEXT = {
    404: ("not_found", "no such path"),
    405: ("method_not_allowed", "method not allowed on this path"),
    413: ("body_too_large", "the body is too large"),
}


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own refusals (404, 405, …) in the OpenAI error shape, not text/plain; so is
    anything a handler failed to catch."""
    if request.version < HttpVersion10:  # HTTP/0.9 has no status line to answer with
        if request.transport is not None:
            request.transport.write(_HTTP09_REFUSAL)
            request.transport.close()
        raise asyncio.CancelledError
    try:
        return await handler(request)
    except web.HTTPException as exc:
        code, message = _STATUS_TEXT.get(exc.status, ("http_error", exc.reason))
        return json_error(exc.status, code, message)
    except Exception:  # a bug before any request was admitted: still JSON, logged
        log.exception("%s %s failed inside the guard", request.method, request.path)
        return json_error(500, "internal_error", "the guard failed on this request")


_EOF_HOPS = 8
"""Loop turns a half-closed connection's request may take to reach its handler."""


class JsonErrorHandler(RequestHandler):
    """The HTTP parser's refusals (a malformed request line or header) in JSON, and the
    connection counted against the edge's cap (connections.py)."""

    @property
    def busy(self) -> bool:
        return bool(self._request_in_progress)

    def close_now(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def close_after_response(self) -> None:
        """Close once this response is written, without reading the rest of the body
        (aiohttp would linger reading it, and re-raise a body it cannot decode)."""
        self._force_close = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        cap = getattr(self._manager, "cap", None)
        if cap is not None and not cap.opened(self):
            transport.close()

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio reads the bool
        """The client sent FIN. Between requests that ends the connection, as before. A
        client that half-closes after a whole request gets an answer: with `half_close:
        refuse` (the default) a 400 `half_closed` and the request aborted at once (its slot
        or queue place freed), since a client that left and one that only stopped sending
        look the same until a write fails; with `serve` the request goes on and the
        connection closes after its answer (a client that left is then found at the first
        failed write). Decided once the request's handler has started (`_after_eof`)."""
        if self._waiter is not None and not self._messages:  # idle between requests
            return False
        if self.transport is None or self.transport.get_extra_info("sslcontext") is not None:
            return False  # TLS has no half-close (asyncio closes it whatever we say)
        self._loop.call_soon(self._after_eof, _EOF_HOPS)
        return True

    def _after_eof(self, hops: int) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        request = self._current_request
        if request is None:
            if hops > 0 and (self._waiter is None or self._messages):  # not started yet
                self._loop.call_soon(self._after_eof, hops - 1)
            else:
                transport.close()
            return
        if not request.content.is_eof():  # a body cut short: the parser is told at close
            transport.close()
        elif getattr(self._manager, "half_close", "refuse") == "serve":
            self.close()  # once this answer is written: no further request can come
        else:
            if request._payload_writer.output_size == 0:  # nothing of an answer sent yet
                transport.write(_HALF_CLOSE_REFUSAL)
            transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        cap = getattr(self._manager, "cap", None)
        if cap is not None:
            cap.closed(self)
        super().connection_lost(exc)

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
        response = json_error(status, code, text)
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    cap: ConnectionCap | None = None
    half_close: str = "refuse"

    def __call__(self) -> RequestHandler:
        return JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class GuardRunner(web.AppRunner):
    """An `AppRunner` whose connections answer HTTP parser errors in JSON and, given a
    `cap`, are bounded by it."""

    def __init__(
        self,
        app: web.Application,
        *,
        cap: ConnectionCap | None = None,
        half_close: str = "refuse",
        **kw: Any,
    ):
        super().__init__(app, **kw)
        self._cap = cap
        self._half_close = half_close

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same object, one method more specific
        server.cap = self._cap  # type: ignore[attr-defined]
        server.half_close = self._half_close  # type: ignore[attr-defined]
        return server
