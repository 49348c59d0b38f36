"""A throw-away `redis-server` on a free loopback port: for `floorguard bench store` and
the tests (which also kill and restart it). Without persistence by default (a restart comes
back empty); `persistent=True` keeps an append-only file fsynced on every write, so a
killed and restarted server comes back with its data (Redis unreachable, state kept)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import redis

from floorguard.rig.net import free_ports

__all__ = ["LocalRedis"]


class LocalRedis:
    def __init__(self, binary: str | None = None, *, persistent: bool = False) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
        self.binary = found
        self.port = free_ports()[0]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="floorguard-redis-")
        self._process: subprocess.Popen[bytes] | None = None
        self.persistent = persistent

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        """Start (or restart, on the same port) and wait until it answers PING."""
        aof = ["yes", "--appendfsync", "always"] if self.persistent else ["no"]
        self._process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", *aof, "--dir", self._dir.name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        with redis.Redis(port=self.port, socket_timeout=0.5) as client:
            while True:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.kill()
                        raise RuntimeError(f"redis-server did not start on {self.port}") from None
                    time.sleep(0.05)

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(5)
            self._process = None

    def close(self) -> None:
        self.kill()
        self._dir.cleanup()

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()
