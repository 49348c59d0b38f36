"""Fixtures of the loopback integration tests."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.live import Live
from tests.integration.processes import STARTED, stop
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


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_session():
    """Whatever `floorguard` process a module fixture left running is killed at the end."""
    yield
    stop(*STARTED)


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    """A test that fails between starting processes and its own `try` (a second replica
    that never listens, say) leaves the first running: kill what the test started.
    Processes of module fixtures are started before this one's set-up and are left alone."""
    before = len(STARTED)
    yield
    stop(*STARTED[before:])
