"""Real `redis-server` processes for tests (the Debian package; `.ci/run` installs it).

Without the binary the tests that need it skip with a message — unless
`FLOORGUARD_REQUIRE_REDIS=1` (set by `.ci/run`), where a missing Redis is a failure.
"""

from __future__ import annotations

import os
import shutil

import pytest

from floorguard.rig.local_redis import LocalRedis
from floorguard.rig.net import free_ports


def free_port() -> int:
    return free_ports()[0]


def RedisServer(*, persistent: bool = False) -> LocalRedis:
    """A `LocalRedis` (not started), or skip/fail when redis-server is not installed."""
    if shutil.which("redis-server") is None:
        message = "redis-server is not installed (apt-get install redis-server; .ci/run does)"
        if os.environ.get("FLOORGUARD_REQUIRE_REDIS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return LocalRedis(persistent=persistent)
