"""The fleet's store against a real `floorguard serve` and a real redis-server: a Redis that can
evict the floor's keys is refused at start (or, with `store.eviction: warn`, served with an
error in the log), because an evicted counter re-grants its window's floor."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from floorguard.rig.local_redis import LocalRedis, LocalSentinel
from floorguard.rig.net import free_port_run, wait_listening
from tests.integration.live import ISSUER, SECRET, token
from tests.integration.processes import emulate, refused_start, serve, stop
from tests.redis_server import RedisServer


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
    said = refused_start(_config({"url": server.url}, backend), tmp_path / "guard.yaml")
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
    assert "appendonly no: a restart of this Redis is a lost state" in said  # and persistence


BACKEND_SLOTS, REPLICAS, TTL_S = 6, 3, 0.6


def _replica(backend: str, redis_url: str, n: int, log, slots: str = "partition") -> dict:
    store = {"url": redis_url, "replicas": REPLICAS, "membership_ttl_s": TTL_S, "slots": slots}
    if slots == "leased":
        store["lease_ttl_s"] = 1.0
    config = _config(store, backend)
    config["replica"] = f"r{n}"
    config["backends"] = [{"url": backend, "slots": BACKEND_SLOTS, "capacity": BACKEND_SLOTS}]
    config["decision_log"] = str(log)
    config["contracts"] = [
        {"tenant": "acme", "class": "assured", "floor": 3, "deadline_ms": 20_000},
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 20_000},
    ]
    return config


async def _sustained(urls: list[str], seconds: float, per_replica: int) -> list[int]:
    """`per_replica` clients per replica, each sending one request after another for
    `seconds`: every status (0 for a connection that failed)."""
    statuses: list[int] = []
    stop_at = asyncio.get_running_loop().time() + seconds

    async def client(session: aiohttp.ClientSession, url: str, tenant: str) -> None:
        body = {"model": "m", "prompt": "x", "max_tokens": 24}
        headers = {"Authorization": f"Bearer {token(tenant)}"}
        while asyncio.get_running_loop().time() < stop_at:
            try:
                async with session.post(url + "/v1/completions", json=body,
                                        headers=headers) as r:  # fmt: skip
                    await r.read()
                    statuses.append(r.status)
            except aiohttp.ClientError:
                statuses.append(0)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(
            client(session, url, ("acme", "free")[i % 2])
            for url in urls for i in range(per_replica)
        ))  # fmt: skip
    return statuses


async def _in_flight_max(url: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as r:
        text = await r.text()
    return next(
        f.samples[0].value
        for f in text_string_to_metric_families(text)
        if f.name == "floorguard_backend_in_flight_max"
    )


async def _under_fault(server: RedisServer, fault: str, urls: list[str], clients: int) -> list[int]:
    """`clients` clients per URL for 6 s; 1.5 s in, Redis restarts without its data
    (`restart`) or is paused past the membership TTL (`pause`). Every status."""
    load = asyncio.ensure_future(_sustained(urls, 6.0, clients))
    await asyncio.sleep(1.5)
    if fault == "restart":
        server.kill()
        server.start()
    else:
        os.kill(server.pid, signal.SIGSTOP)
        await asyncio.sleep(3 * TTL_S)
        os.kill(server.pid, signal.SIGCONT)
    return await load


def _held_and_served(statuses: list[int], backend: str) -> None:
    """Every request answered, enough served, the backend never over its slots."""
    assert statuses.count(200) > 30 and 0 not in statuses
    peak = asyncio.run(_in_flight_max(backend))
    assert peak <= BACKEND_SLOTS, f"the backend held {peak} > its {BACKEND_SLOTS} slots"


def _verified(logs: list) -> dict:
    """`floorguard verify` over `logs`, which must pass: its report."""
    done = subprocess.run(
        [sys.executable, "-m", "floorguard", "verify", *map(str, logs), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert done.returncode == 0, report["violations"][:3]
    return report


@pytest.mark.parametrize("slots", ["partition", "leased"])
@pytest.mark.parametrize("fault", ["restart", "pause"])
def test_a_fleet_whose_redis_forgets_it_never_overfills_the_backend(tmp_path, fault, slots):
    """Chaos: three replicas share a 6-slot backend — partitioned (2 each), or leasing
    slots fleet-wide — under a steady flood; Redis restarts without persistence, or is
    paused (SIGSTOP) past the membership TTL. Partitioned, each replica read that as "1
    replica(s) live" and took the whole backend (21 in flight on 12 slots); leased, the
    fleet ran 8-11 on the 6 before the leases kept to what each held. Now the backend
    never holds more than its 6, every replica serves on, and the three logs pass
    `verify`: the floor within B in every window (a restart shorter than a beat once
    granted 4 of 3; a retry across a restart once granted a fourth uncharged), and, leased,
    fleet ORDER (once broken by a board entry whose number lost two digits, an
    opportunistic request taking a slot handed for an entitled one, and a hand-over
    missed between a denial and its answer)."""
    server = RedisServer().start()
    backend, emulator = emulate(slots=BACKEND_SLOTS)
    processes = [emulator]
    try:
        urls = _replicas(tmp_path, backend, server.url, slots, processes)
        with redis.Redis.from_url(server.url) as admin:  # learned at start, nothing taken
            assert admin.exists("floorguard:{acme}:gen") and not admin.exists("floorguard:{acme}")

        _held_and_served(asyncio.run(_under_fault(server, fault, urls, 8)), backend)
        _stopped(processes[1:])
    finally:
        stop(*processes)
        server.close()
    _fleet_verified(tmp_path)


def _replicas(tmp_path, backend: str, store_url: str, slots: str, processes: list, **more) -> list:
    """`REPLICAS` `serve` replicas of one fleet (their configs `_replica`'s, with `more` on
    top), each appended to `processes` as it starts: their URLs."""
    urls = []
    for n in range(REPLICAS):
        config = _replica(backend, store_url, n, tmp_path / f"r{n}.jsonl", slots) | more
        with (tmp_path / f"r{n}.err").open("wb") as err:
            url, process = serve(config, tmp_path / f"r{n}.yaml", err)
        urls.append(url)
        processes.append(process)
    return urls


def _stopped(replicas: list) -> None:
    for process in replicas:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


def _fleet_verified(tmp_path) -> None:
    """The replicas' logs verify together, the fleet never over the backend's slots, and
    no replica wrote a traceback."""
    said = "".join((tmp_path / f"r{n}.err").read_text() for n in range(REPLICAS))
    assert "Traceback" not in said
    report = _verified([tmp_path / f"r{n}.jsonl" for n in range(REPLICAS)])
    assert (
        report["fleet_peak_in_flight"] == {}
        or max(report["fleet_peak_in_flight"].values()) <= BACKEND_SLOTS
    )


@pytest.mark.parametrize("slots", ["partition", "leased"])
@pytest.mark.parametrize("fault", ["restart", "pause"])
def test_two_workers_whose_redis_forgets_them_never_overfill_the_backend(tmp_path, fault, slots):
    """The same chaos on one `serve` with `workers: 2` (two processes on one port, each a
    replica of the fleet: docs/deploy.md, Workers): under a steady flood Redis restarts
    without its data or is paused past the membership TTL; the backend never holds more
    than its 6, every request is answered, and the two workers' logs pass `verify`."""
    server = RedisServer().start()
    backend, emulator = emulate(slots=BACKEND_SLOTS)
    processes = [emulator]
    admin = free_port_run(3)  # workers > 1 share one port they must be given: no port 0
    config = _replica(backend, server.url, 0, tmp_path / "decisions.jsonl", slots)
    config |= {"workers": 2, "port": admin + 2, "admin": {"port": admin}}
    config.pop("replica")
    config["store"].pop("replicas")  # the live workers are the fleet
    try:
        with (tmp_path / "serve.err").open("wb") as err:
            url, process = serve(config, tmp_path / "guard.yaml", err)
        processes.append(process)
        for i in range(2):
            wait_listening(admin + i, process)

        _held_and_served(asyncio.run(_under_fault(server, fault, [url], 16)), backend)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        stop(*processes)
        server.close()
    _verified([tmp_path / f"decisions.w{i}.jsonl" for i in range(2)])


def _following(master: LocalRedis, replica: LocalRedis) -> None:
    """`replica` follows `master`, synced."""
    with redis.Redis(port=master.port) as source:
        source.config_set("repl-diskless-sync-delay", 0)
    with redis.Redis(port=replica.port) as follower:
        follower.replicaof("127.0.0.1", master.port)
        deadline = time.monotonic() + 10
        while follower.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)


FAILOVER_WINDOW_S = 4.0


async def _failover_behind(
    master: LocalRedis, replica: LocalRedis, sentinel: LocalSentinel, urls: list[str]
) -> list[int]:
    """A flood for 10 s; in it, 0.8 s before a window starts, the Redis replica stops
    following (REPLICAOF NO ONE: on loopback a paused replica still finds the master's
    writes in its socket, so nothing else makes it miss them) while the master grants that
    window's floor; 0.5 s into the window the master dies (kill -9) and the Sentinel is
    pointed at the replica (REMOVE and MONITOR, as after its own failover), which counts
    the window from 0. Every status."""
    load = asyncio.ensure_future(_sustained(urls, 10.0, 8))
    await asyncio.sleep(1.5)
    await asyncio.sleep((-time.time() - 0.8) % FAILOVER_WINDOW_S)
    with redis.Redis(port=replica.port) as behind:
        behind.replicaof("no", "one")
    await asyncio.sleep(1.3)
    master.kill()
    with redis.Redis(port=sentinel.port) as watcher:
        watcher.execute_command("SENTINEL", "REMOVE", sentinel.service)
        watcher.execute_command("SENTINEL", "MONITOR", sentinel.service, "127.0.0.1",
                                replica.port, 1)  # fmt: skip
    return await load


@pytest.mark.parametrize("slots", ["partition", "leased"])
def test_a_fleet_through_a_failover_to_a_replica_behind_holds_its_floor(tmp_path, slots):
    """Chaos: three replicas share a 6-slot backend through `redis+sentinel://` under a
    steady flood; the Redis replica stops following across a window's start (it misses
    that window's grants), the master dies and the Sentinel names the replica. The fleet
    follows the new master; its markers name the dead one (a lost state: the window it
    meets is closed, the pool's leases put back), so the backend never holds more than its
    6, every request is answered, and the three logs pass `verify`: no window over B (with
    markers that did not name their server, `verify` found 6 of B = 3 in both variants),
    fleet ORDER."""
    RedisServer().close()  # skips without redis-server
    master, replica = LocalRedis().start(), LocalRedis().start()
    _following(master, replica)
    sentinel = LocalSentinel(master).start()
    backend, emulator = emulate(slots=BACKEND_SLOTS)
    processes = [emulator]
    try:  # the lag and the failover in one window
        urls = _replicas(tmp_path, backend, sentinel.url, slots, processes,
                         window_s=FAILOVER_WINDOW_S)  # fmt: skip
        _held_and_served(asyncio.run(_failover_behind(master, replica, sentinel, urls)), backend)
        _stopped(processes[1:])
    finally:
        stop(*processes)
        sentinel.close()
        master.close()
        replica.close()
    _fleet_verified(tmp_path)
