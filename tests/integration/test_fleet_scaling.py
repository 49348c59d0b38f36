"""A real fleet of `floorguard serve` replicas sharing one redis-server and one
emulated backend (6 slots, which it reports) is scaled up (2 → 3) and down (3 → 2, a
SIGTERM drain, as `kubectl scale` does) under load. Each replica's share of the backend
and its fail-static divisor follow the live count within one heartbeat expiry; the live
count that differs from `store.replicas` is a warning; the backend never runs more than
its slots; every answer is a JSON one (no connection error); `verify` passes over all
the replicas' logs, SLOTS counted across them."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time

import aiohttp
import orjson

from floorguard.core.events import EventKind, read_jsonl
from tests.integration.live import ISSUER, SECRET, token
from tests.integration.processes import emulate, serve, stop
from tests.integration.test_fleet_slots import _backend_gauge, _verify

CAPACITY, TTL_S = 6, 1.0


def _config(backend, redis_url, n, log):
    return {
        "window_s": 1.0,
        "replica": f"r{n}",
        "contracts": [
            {"tenant": "acme", "class": "assured", "floor": 3, "deadline_ms": 5000},
            {"tenant": "free", "class": "opportunistic", "deadline_ms": 5000},
        ],
        "backends": [{"url": backend, "slots": CAPACITY, "capacity": CAPACITY}],
        "identity": {
            "mode": "jwt",
            "jwt": {"algorithms": ["HS256"], "secret": SECRET, "issuer": ISSUER,
                    "audience": "floorguard"},
        },
        "store": {"url": redis_url, "replicas": 2, "membership_ttl_s": TTL_S},
        "decision_log": str(log),
    }  # fmt: skip


class Load:
    """Clients in a thread of their own, spread over the replicas in `targets` (a replica
    is taken out before it is told to drain, as a load balancer does on `/readyz`)."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.answers: list[tuple[int, str | None]] = []
        self.errors: list[str] = []
        self.running = True
        self._thread = threading.Thread(target=lambda: asyncio.run(self._clients(8)))

    async def _one(self, session, n):
        while self.running:
            targets = list(self.targets)
            url = targets[n % len(targets)]
            tenant = ("acme", "free")[n % 2]
            try:
                async with session.post(
                    url + "/v1/completions",
                    json={"model": "m", "prompt": "x", "max_tokens": 4},
                    headers={"Authorization": f"Bearer {token(tenant)}"},
                ) as r:
                    data = await r.read()
                    code = None if r.status == 200 else orjson.loads(data)["error"]["code"]
                    self.answers.append((r.status, code))
            except (aiohttp.ClientError, ValueError, KeyError) as exc:  # never expected
                self.errors.append(f"{url}: {exc!r}")
            n += 1
            await asyncio.sleep(0.01)

    async def _clients(self, n):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await asyncio.gather(*(self._one(session, i) for i in range(n)))

    def start(self):
        self._thread.start()

    def stop(self):
        self.running = False
        self._thread.join(30)


def _status(url):
    async def get():
        async with aiohttp.ClientSession() as session, session.get(url + "/admin/status") as r:
            return await r.json()

    return asyncio.run(get())


def _fleet(url):
    """(live count, this replica's slots, fail-static's divisor, the warning)."""
    status = _status(url)
    store = status["store"]
    membership = store["membership"]
    return membership["live"], status["queues"]["slots"], store["replicas"], membership["warning"]


def _until(urls, live, timeout_s):
    """Seconds until every replica in `urls` follows `live` replicas (shares ⌊6/live⌋)."""
    began = time.monotonic()
    while True:
        views = [_fleet(u) for u in urls]
        if all(v[:3] == (live, [CAPACITY // live], live) for v in views):
            return time.monotonic() - began
        assert time.monotonic() - began < timeout_s, views
        time.sleep(0.05)


def test_scaling_the_fleet_moves_the_shares_within_one_expiry(redis_server, tmp_path):
    backend, emulator = emulate(slots=CAPACITY)
    load = Load()
    replicas: dict[int, tuple[str, subprocess.Popen]] = {}
    logs = [tmp_path / f"r{n}.jsonl" for n in range(3)]
    try:
        for n in (0, 1):
            replicas[n] = serve(
                _config(backend, redis_server.url, n, logs[n]), tmp_path / f"r{n}.yaml"
            )
        _until([replicas[0][0], replicas[1][0]], 2, TTL_S)
        assert _fleet(replicas[0][0])[3] is None  # live 2 = store.replicas
        load.targets = [replicas[0][0], replicas[1][0]]
        load.start()
        time.sleep(1.0)

        replicas[2] = serve(_config(backend, redis_server.url, 2, logs[2]), tmp_path / "r2.yaml")
        urls = [u for u, _ in replicas.values()]
        took = _until(urls, 3, TTL_S)  # the joiner waited for the others to settle
        assert "3 replica(s) live, but store.replicas says 2" in _fleet(urls[0])[3]
        load.targets = urls
        time.sleep(1.5)

        load.targets = urls[1:]  # out of the balancer, then drained
        replicas[0][1].send_signal(signal.SIGTERM)
        assert replicas[0][1].wait(20) == 0
        took = max(took, _until(urls[1:], 2, TTL_S))
        time.sleep(1.0)
    finally:
        load.stop()
        for _, process in replicas.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process in replicas.values():
            process.wait(20)
        peak = asyncio.run(_backend_gauge(backend, "floorguard_backend_in_flight_max"))
        stop(emulator, *(p for _, p in replicas.values()))
    assert took < TTL_S
    assert load.errors == []
    statuses = {status for status, _ in load.answers}
    assert statuses <= {200, 429, 503}, statuses
    assert sum(status == 200 for status, _ in load.answers) > 50
    assert peak <= CAPACITY
    code, report = _verify(logs)
    assert code == 0, report["violations"][:3]
    assert 2 < report["fleet_peak_in_flight"][backend] <= CAPACITY
    resized = [
        e
        for log in logs
        for e in read_jsonl(log)
        if e.kind is EventKind.CONFIG and e.reason == "membership"
    ]
    assert len(resized) >= 3  # r0, r1 shrank to 2; r1, r2 grew to 3 (r2 from its start)
