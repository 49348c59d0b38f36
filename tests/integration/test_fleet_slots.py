"""SF across a fleet by an explicit slot partition (SPEC §13, docs/replicas.md): three
`floorguard serve` replicas in front of the *same* backend, each keeping its share of the
backend's slots, a real redis-server for the floor. The backend (the emulator, which
reports its own slot count and its in-flight high-water mark) never holds more than its
slots; the fleet's logs pass `verify` with SLOTS counted per backend across replicas; a
partition that does not fit the backend refuses to start."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.live import ISSUER, SECRET, token
from tests.integration.processes import emulate, serve, stop
from tests.redis_server import RedisServer, free_port

BACKEND_SLOTS, REPLICAS = 6, 3


def _config(backend, redis_url, n, log, slots):
    return {
        "window_s": 1.0,
        "replica": f"r{n}",
        "contracts": [
            {"tenant": "acme", "class": "assured", "floor": 3, "deadline_ms": 5000},
            {"tenant": "free", "class": "opportunistic", "deadline_ms": 5000},
        ],
        "backends": [{"url": backend, "slots": slots}],
        "identity": {
            "mode": "jwt",
            "jwt": {"algorithms": ["HS256"], "secret": SECRET, "issuer": ISSUER,
                    "audience": "floorguard"},
        },
        "store": {"url": redis_url, "replicas": REPLICAS},
        "decision_log": str(log),
    }  # fmt: skip


@pytest.fixture
def backend():
    redis_server = RedisServer().start()
    url, emulator = emulate(slots=BACKEND_SLOTS)
    yield url, redis_server.url
    stop(emulator)
    redis_server.close()


async def _flood(urls, n):
    """`n` requests per replica at once, acme and free-tier alternating."""

    async def one(session, url, tenant):
        async with session.post(
            url + "/v1/completions",
            json={"model": "m", "prompt": "x", "max_tokens": 8},
            headers={"Authorization": f"Bearer {token(tenant)}"},
        ) as r:
            await r.read()
            return r.status

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        return await asyncio.gather(
            *(one(session, url, ("acme", "free")[i % 2]) for url in urls for i in range(n))
        )


async def _backend_gauge(url, name):
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as r:
        text = await r.text()
    return next(f.samples[0].value for f in text_string_to_metric_families(text) if f.name == name)


def test_a_partitioned_fleet_never_overfills_the_backend(backend, tmp_path):
    url, redis_url = backend
    replicas = []
    try:
        for n in range(REPLICAS):
            log = tmp_path / f"r{n}.jsonl"
            config = _config(url, redis_url, n, log, BACKEND_SLOTS // REPLICAS)
            config["backends"][0]["capacity"] = BACKEND_SLOTS  # recorded for fleet SLOTS
            guard_url, process = serve(config, tmp_path / f"r{n}.yaml")
            replicas.append((guard_url, log, process))
        statuses = asyncio.run(_flood([u for u, _, _ in replicas], 20))
        assert statuses.count(200) >= 3 * REPLICAS  # every replica served
        peak = asyncio.run(_backend_gauge(url, "floorguard_backend_in_flight_max"))
        assert REPLICAS < peak <= BACKEND_SLOTS  # loaded through several replicas, never over
        for _, _, process in replicas:
            process.send_signal(signal.SIGTERM)
            assert process.wait(20) == 0
    finally:
        stop(*(p for _, _, p in replicas))
    verify = subprocess.run(
        [sys.executable, "-m", "floorguard", "verify", *(str(log) for _, log, _ in replicas),
         "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    report = json.loads(verify.stdout)
    assert verify.returncode == 0, report["violations"][:3]
    assert REPLICAS < report["fleet_peak_in_flight"][url] <= BACKEND_SLOTS


def test_a_partition_that_does_not_fit_the_backend_refuses_to_start(backend, tmp_path):
    """3 replicas × 4 slots against a backend that reports 6 of its own: `serve` exits 2
    naming the numbers, before it listens."""
    url, redis_url = backend
    config = {**_config(url, redis_url, 0, tmp_path / "r.jsonl", 4), "port": free_port()}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "floorguard", "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "3 replica(s) × 4 = 12 > the 6 slots" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_declared_capacity_that_the_partition_exceeds_is_a_config_error(tmp_path):
    """Without reaching any backend: `capacity` 6 with 3 replicas × 4 slots is refused at
    load, naming the backend."""
    config = _config("http://127.0.0.1:9", "redis://127.0.0.1:9/0", 0, tmp_path / "r.jsonl", 4)
    config["backends"][0]["capacity"] = 6
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "floorguard", "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "3 replica(s) × slots 4 = 12 in flight > its capacity 6" in done.stderr
