"""The guard's HTTP replies and stream reading, shared by the edge (`app`) and the pools
(`pool`): errors in the OpenAI shape, and the next piece of a body or reply."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from floorguard.proxy.edge.deadline import Deadline
from floorguard.proxy.edge.openai_format import error_body, sse_error
from floorguard.proxy.observe.tracing import RequestSpan
from floorguard.proxy.observe.usage import Usage

__all__ = [
    "JSON",
    "NO_RETRY",
    "Exchange",
    "RefusedError",
    "end_stream",
    "json_error",
    "next_chunk",
]

JSON = {"Content-Type": "application/json"}
NO_RETRY = {"x-should-retry": "false"}


def json_error(
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
        headers={**JSON, **(headers or {})},
    )


class RefusedError(Exception):
    """Carries the 4xx response for a request refused before the guard sees it."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


class Exchange:
    """One request's passage through a pool: what it has sent its client so far (a started
    stream cannot be undone), what its whole reply said it cost, and its trace. Kept here,
    not in the request's mapping, whose every read and write is interpreted Python."""

    __slots__ = ("response", "span", "trace", "usage")

    def __init__(self) -> None:
        self.response: web.StreamResponse | None = None
        self.usage: Usage | None = None
        """A non-streamed reply's usage, once read (a stream's is its tap's)."""
        self.trace: dict[str, str] | None = None
        """The trace context that goes upstream (tracing.py): the client's, or its span's."""
        self.span: RequestSpan | None = None
        """Its span, with `tracing:`."""


async def next_chunk(
    stream: aiohttp.StreamReader, loop: asyncio.AbstractEventLoop, timeout_s: float
) -> bytes:
    """The next piece of `stream` (b"" at its end): what is buffered at once, else the next
    to arrive within `timeout_s` (TimeoutError), on `loop`. No timer is armed for buffered
    data: most bodies and replies are in the buffer by the time they are read (the hot
    path)."""
    chunk = stream.read_nowait()
    if chunk or stream.at_eof():
        return chunk
    if timeout_s <= 0:
        raise TimeoutError
    async with Deadline(loop, timeout_s):
        return await stream.readany()


async def end_stream(response: web.StreamResponse, code: str, message: str) -> None:
    with contextlib.suppress(ConnectionResetError, RuntimeError):
        await response.write(sse_error(code, message))
        await response.write_eof()
