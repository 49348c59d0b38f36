"""Fixtures of the loopback integration tests."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.live import Live
from tests.redis_server import RedisServer


@pytest.fixture(scope="module")
def live():
    """A background event loop serving apps on loopback, closed after the module."""
    servers = Live()
    yield servers
    servers.close()


@pytest.fixture
def redis_server():
    """A throw-away redis-server on loopback, without persistence (a restart is empty)."""
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture
def loop():
    """One event loop per test: the asyncio Redis client belongs to the loop it ran on."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
