"""A throw-away `redis-server` on a free loopback port: for `floorguard bench store` and
the tests (which also kill and restart it). Without persistence by default (a restart comes
back empty); `persistent=True` keeps an append-only file fsynced on every write, so a
killed and restarted server comes back with its data (Redis unreachable, state kept)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from typing import Any

import redis

from floorguard.rig.net import free_ports

__all__ = ["LocalRedis", "LocalSentinel"]


class LocalRedis:
    def __init__(
        self, binary: str | None = None, *, persistent: bool = False, cluster: bool = False
    ) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
        self.binary = found
        self.port = free_ports()[0]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="floorguard-redis-")
        self._process: subprocess.Popen[bytes] | None = None
        self.persistent = persistent
        self.cluster = cluster
        self._bus_port = free_ports()[0] if cluster else 0
        """A one-node Redis Cluster holding every slot (`url` is `redis+cluster://…`)."""
        if cluster:
            self.url = f"redis+cluster://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        """Start (or restart, on the same port) and wait until it answers PING."""
        aof = ["yes", "--appendfsync", "always"] if self.persistent else ["no"]
        cluster = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            str(self._bus_port),
        ]  # (not port + 10000: may pass 65535)
        self._process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", *aof, "--dir", self._dir.name, *(cluster if self.cluster else [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        with redis.Redis(port=self.port, socket_timeout=0.5) as client:
            while True:
                try:
                    client.ping()
                    if self.cluster:
                        _own_every_slot(client, deadline)
                    return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.kill()
                        raise RuntimeError(f"redis-server did not start on {self.port}") from None
                    time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        """redis-server's process id while it runs (a benchmark reads its CPU time)."""
        return self._process.pid if self._process is not None else None

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


def _command(client: redis.Redis, *args: object) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _own_every_slot(client: redis.Redis, deadline: float) -> None:
    """Make a fresh cluster node hold all 16384 slots and wait until the cluster is ok."""
    if b"cluster_state:ok" in _command(client, "CLUSTER", "INFO"):
        return
    if not _command(client, "CLUSTER", "SLOTS"):
        _command(client, "CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    while b"cluster_state:ok" not in _command(client, "CLUSTER", "INFO"):
        if time.monotonic() > deadline:
            raise RuntimeError("the one-node Redis Cluster did not come up")
        time.sleep(0.05)


class LocalSentinel:
    """A Redis Sentinel (`redis-server --sentinel`) watching one `LocalRedis` as `service`."""

    def __init__(self, master: LocalRedis, service: str = "floorguard") -> None:
        self.master = master
        self.service = service
        self.port = free_ports()[0]
        self.url = f"redis+sentinel://127.0.0.1:{self.port}/{service}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="floorguard-sentinel-")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> LocalSentinel:
        conf = f"{self._dir.name}/sentinel.conf"
        with open(conf, "w", encoding="utf-8") as f:
            f.write(
                f"port {self.port}\nbind 127.0.0.1\ndir {self._dir.name}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 1\n"
            )
        self._process = subprocess.Popen(
            [self.master.binary, conf, "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        with redis.Redis(port=self.port, socket_timeout=0.5) as client:
            while True:
                try:
                    if _command(client, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service):
                        return self
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"redis sentinel did not start on {self.port}")
                time.sleep(0.05)

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(5)
            self._process = None
        self._dir.cleanup()
