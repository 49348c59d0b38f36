"""Issue 46 against a real `floorguard serve` and a real redis-server: a Redis that can
evict the floor's keys is refused at start (or, with `store.eviction: warn`, served with an
error in the log), because an evicted counter re-grants its window's floor."""

from __future__ import annotations

import subprocess

import pytest
import redis
import yaml

from tests.integration.live import ISSUER, SECRET
from tests.integration.processes import emulate, floorguard, serve, stop
from tests.redis_server import RedisServer, free_port


def _config(store: dict, backend: str) -> dict:
    return {
        "window_s": 1.0,
        "contracts": [{"tenant": "acme", "class": "assured", "floor": 4, "deadline_ms": 1820}],
        "backends": [{"url": backend, "slots": 4}],
        "identity": {
            "mode": "jwt",
            "jwt": {"algorithms": ["HS256"], "secret": SECRET, "issuer": ISSUER,
                    "audience": "floorguard"},
        },
        "store": store,
    }  # fmt: skip


@pytest.fixture
def evicting():
    """A Redis under a memory limit that evicts keys with a TTL (`volatile-lru`), and an
    emulated backend."""
    server = RedisServer().start()
    with redis.Redis.from_url(server.url) as admin:
        admin.config_set("maxmemory", 64 * 1024 * 1024)
        admin.config_set("maxmemory-policy", "volatile-lru")
    backend, emulator = emulate()
    yield server, backend
    stop(emulator)
    server.close()


def test_a_redis_that_can_evict_the_floor_is_refused_at_start(tmp_path, evicting):
    """`volatile-lru` evicts the floor's keys (each has a TTL) as surely as `allkeys-lru`:
    `serve` exits non-zero naming `store.eviction`, the policy and what to set."""
    server, backend = evicting
    path = tmp_path / "guard.yaml"
    path.write_text(yaml.safe_dump({**_config({"url": server.url}, backend), "port": free_port()}))
    with (tmp_path / "guard.err").open("wb") as err:
        process = floorguard("serve", "--config", str(path), stderr=err)
        try:
            assert process.wait(60) != 0
        except subprocess.TimeoutExpired:
            stop(process)
            raise
    said = (tmp_path / "guard.err").read_text()
    assert "store.eviction" in said and "volatile-lru" in said and "noeviction" in said
    assert "Traceback" not in said and "Unclosed" not in said


def test_with_eviction_warn_it_serves_and_says_so(tmp_path, evicting):
    server, backend = evicting
    config = _config({"url": server.url, "eviction": "warn"}, backend)
    with (tmp_path / "guard.err").open("wb") as err:
        _, process = serve(config, tmp_path / "guard.yaml", err)
    stop(process)
    said = (tmp_path / "guard.err").read_text()
    assert "maxmemory-policy volatile-lru" in said and "ERROR" in said
