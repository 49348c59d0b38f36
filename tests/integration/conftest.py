"""Fixtures of the loopback integration tests."""

from __future__ import annotations

import pytest

from tests.integration.live import Live


@pytest.fixture(scope="module")
def live():
    """A background event loop serving apps on loopback, closed after the module."""
    servers = Live()
    yield servers
    servers.close()
