"""Real `redis-server` processes for tests (the Debian package; `.ci/run` installs it).

Without the binary the tests that need it skip with a message — unless
`FLOORGUARD_REQUIRE_REDIS=1` (set by `.ci/run`), where a missing Redis is a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest
import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_redis_server() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server is not installed (apt-get install redis-server; .ci/run does)"
        if os.environ.get("FLOORGUARD_REQUIRE_REDIS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return binary


class RedisServer:
    """One redis-server on a free loopback port, without persistence; it can be killed
    and restarted on the same port (for fault tests)."""

    def __init__(self) -> None:
        self.binary = require_redis_server()
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="floorguard-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        self._process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._dir.name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.05)
        client.close()
        return self

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(5)
            self._process = None

    def close(self) -> None:
        self.kill()
        self._dir.cleanup()
