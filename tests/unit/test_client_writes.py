"""When a write to the client goes untimed (forward.py `_cannot_wait`): only where it cannot
wait for the client to read, checked on real loopback transports (asyncio's and uvloop's),
one whose reader never reads among them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from floorguard.proxy.pool.forward import _cannot_wait

uvloop = pytest.importorskip("uvloop")

RUNNERS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


async def _connected(
    kept: list[asyncio.StreamWriter],
) -> tuple[asyncio.WriteTransport, asyncio.Server]:
    """A client transport to a loopback server that accepts and never reads (both ends'
    streams are kept in `kept`: a collected StreamWriter closes its transport)."""
    server = await asyncio.start_server(lambda r, w: kept.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    kept.append(writer)
    return writer.transport, server


async def _close(kept: list[asyncio.StreamWriter], server: asyncio.Server) -> None:
    for writer in kept:
        writer.close()
    server.close()
    await server.wait_closed()
    await asyncio.sleep(0.01)  # the closed transports' last callbacks


@pytest.mark.parametrize("loop", RUNNERS)
def test_a_small_write_to_an_idle_transport_cannot_wait(loop: str) -> None:
    async def run() -> None:
        kept: list[asyncio.StreamWriter] = []
        transport, server = await _connected(kept)
        _, high = transport.get_write_buffer_limits()
        assert _cannot_wait(transport, 1_000)
        assert not _cannot_wait(transport, high)  # this write alone would pause it
        transport.close()
        assert not _cannot_wait(transport, 1_000)  # closing: the timed path decides
        await _close(kept, server)

    RUNNERS[loop](run())


@pytest.mark.parametrize("loop", RUNNERS)
def test_a_transport_whose_reader_stopped_reading_is_always_timed(loop: str) -> None:
    """The kernel's buffers fill, then the transport's: from then on every write is timed,
    however small, until the buffer is back at the low-water mark."""

    async def run() -> None:
        kept: list[asyncio.StreamWriter] = []
        transport, server = await _connected(kept)
        sock = transport.get_extra_info("socket")
        assert sock is not None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # fill it quickly
        low, high = transport.get_write_buffer_limits()
        while transport.get_write_buffer_size() <= low:
            transport.write(b"x" * 4096)
            await asyncio.sleep(0)
        assert not _cannot_wait(transport, 1)  # above low water: it may be paused
        while transport.get_write_buffer_size() <= high:
            transport.write(b"x" * 65_536)
            await asyncio.sleep(0)
        assert not _cannot_wait(transport, 1)  # paused
        transport.abort()
        await _close(kept, server)

    RUNNERS[loop](run())


def test_no_transport_is_timed() -> None:
    assert not _cannot_wait(None, 1)
