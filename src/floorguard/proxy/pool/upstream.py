"""The pool's seam to its backends (docs/architecture.md): an `Upstream` posts a dispatched
request and hands back its reply, read in chunks at the backend's pace, and answers the
health probes' and the start-up reports' GETs. The pool and its forwarder know only these
protocols and their three errors: `HttpUpstream` is the real one (aiohttp's client
session); a unit test hands a pool a fake one it answers by hand
(tests/unit/test_pool_fake_transport.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

import aiohttp

from floorguard.proxy.edge.replies import next_chunk

__all__ = ["HttpUpstream", "UnreachableError", "Upstream", "UpstreamBroke", "UpstreamReply"]


class UnreachableError(Exception):
    """No connection to the backend could be had: the request never reached it (the pool
    may dispatch it to another)."""


class UpstreamBroke(Exception):  # noqa: N818  # a state of the backend, as the pool names it
    """The backend's connection failed once made: mid-request or mid-reply."""


class UpstreamReply(Protocol):
    """A backend's reply, its status and headers read; its body still to come."""

    @property
    def status(self) -> int: ...

    @property
    def length(self) -> int | None:
        """The body's length as its headers declare it (None: not declared, e.g. chunked):
        once that much is read the reader stops, without a read to find the end."""
        ...

    async def chunk(self, timeout_s: float) -> bytes:
        """The next piece of the body (b"" at its end): what is buffered at once, else the
        next to arrive within `timeout_s` (TimeoutError); `UpstreamBroke` if it breaks."""
        ...

    async def head(self, size: int) -> bytes:
        """Up to `size` bytes of the body (an error's message)."""
        ...

    def release(self) -> None:
        """Done with it: its connection goes back to the pool, or is closed."""
        ...


class Upstream(Protocol):
    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamReply:
        """Send a request; its reply once its headers are in. `UnreachableError`: no
        connection; `UpstreamBroke`: it broke once connected (the caller bounds the wait)."""
        ...

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """A GET's status and whole body within `timeout_s` (TimeoutError);
        `UnreachableError`, `UpstreamBroke` as for `post`."""
        ...


class _HttpReply:
    __slots__ = ("_loop", "_response", "length", "status")

    def __init__(self, response: aiohttp.ClientResponse, loop: asyncio.AbstractEventLoop) -> None:
        self._response = response
        self._loop = loop
        self.status = response.status
        self.length = response.content_length

    async def chunk(self, timeout_s: float) -> bytes:
        try:
            return await next_chunk(self._response.content, self._loop, timeout_s)
        except aiohttp.ClientError as exc:
            raise UpstreamBroke(str(exc)) from exc

    async def head(self, size: int) -> bytes:
        try:
            return await self._response.content.read(size)
        except aiohttp.ClientError as exc:
            raise UpstreamBroke(str(exc)) from exc

    def release(self) -> None:
        self._response.release()


class HttpUpstream:
    """The backends over HTTP: aiohttp's client session (its connection pool and connect
    timeout), redirects never followed."""

    def __init__(self, session: aiohttp.ClientSession, loop: asyncio.AbstractEventLoop) -> None:
        self.session = session
        self.loop = loop
        """The session's loop (asked once: each `get_running_loop` is a `getpid` call)."""

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamReply:
        try:
            response = await self.session.post(
                url, data=body, headers=headers, allow_redirects=False
            )
        except aiohttp.ClientConnectorError as exc:
            raise UnreachableError(str(exc)) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamBroke(str(exc)) from exc
        return _HttpReply(response, self.loop)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        try:
            async with self.session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False
            ) as response:
                return response.status, await response.read()
        except aiohttp.ClientConnectorError as exc:
            raise UnreachableError(str(exc)) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamBroke(str(exc)) from exc
