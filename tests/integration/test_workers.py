"""`workers: 2` (docs/deploy.md, Workers) on a real `floorguard serve` over a real redis-server: two
processes on one port share one floor as replicas do — clients on fresh connections reach
both, the fleet admits at most `B` per window from the floor, and the two workers' decision
logs pass `floorguard verify` together; SIGHUP reloads both; a worker killed with SIGKILL
is started again under a new name; SIGTERM drains both and the supervisor exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import aiohttp
import pytest
import yaml

from floorguard.rig.net import free_port_run, wait_listening
from tests.integration.live import AUDIENCE, ISSUER, SECRET, Bearer
from tests.integration.processes import emulate, serve, stop
from tests.redis_server import RedisServer

FLOOR = 4
BEARER = Bearer("acme", "free")


@pytest.fixture
def workers(tmp_path):
    redis_server = RedisServer().start()
    backend, emulator = emulate(slots=8)
    admin = free_port_run(3)  # workers > 1 share one port they must be given: no port 0
    config = {
        "port": admin + 2,
        "window_s": 1.0,
        "contracts": [
            {"tenant": "acme", "class": "assured", "floor": FLOOR, "deadline_ms": 1820},
            {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
        ],
        "backends": [{"url": backend, "slots": 4}],
        "identity": {
            "mode": "jwt",
            "jwt": {"algorithms": ["HS256"], "secret": SECRET, "issuer": ISSUER,
                    "audience": AUDIENCE},
        },
        "store": {"url": redis_server.url},
        "decision_log": str(tmp_path / "decisions.jsonl"),
        "workers": 2,
        "admin": {"port": admin},
    }  # fmt: skip
    path = tmp_path / "guard.yaml"
    url, process = serve(config, path)
    admins = [f"http://127.0.0.1:{admin + i}" for i in range(2)]
    for i in range(2):
        wait_listening(admin + i, process)
    yield url, process, admins, path
    stop(process, emulator)
    redis_server.close()


def _status(admin: str) -> dict:
    async def go():
        async with aiohttp.ClientSession() as s, s.get(admin + "/admin/status") as r:
            return await r.json()

    return asyncio.run(go())


async def _drive(
    url: str, seconds: float, per_s: float, *, lost_ok: bool = False
) -> list[tuple[str, int, str]]:
    """acme (and free) open-loop, each request on a connection of its own, so the kernel
    spreads them over the workers. `lost_ok`: a connection a killed worker drops is
    recorded as status 0, not raised."""
    results: list[tuple[str, int, str]] = []

    async def one(session, tenant):
        try:
            async with session.post(
                url + "/v1/completions",
                json={"model": "m", "prompt": "x", "max_tokens": 4},
                headers=BEARER[tenant],
            ) as r:
                await r.read()
                results.append((tenant, r.status, r.headers.get("x-floorguard-decision", "")))
        except aiohttp.ClientError:
            if not lost_ok:
                raise
            results.append((tenant, 0, ""))

    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = []
        for _ in range(int(seconds * per_s)):
            tasks += [asyncio.create_task(one(session, t)) for t in ("acme", "free")]
            await asyncio.sleep(1 / per_s)
        await asyncio.gather(*tasks)
    return results


def test_two_workers_share_one_port_and_one_floor(workers, tmp_path):
    url, process, admins, _ = workers
    results = asyncio.run(_drive(url, seconds=3.0, per_s=10))
    decisions = [d for tenant, _, d in results if tenant == "acme"]
    assert "rejected" in decisions  # 10/s against B = 4 per window: the floor ran out
    served = [_status(a)["replica"] for a in admins]
    assert served[0] != served[1] and all("-w" in name for name in served)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0  # both drained
    logs = [tmp_path / f"decisions.w{i}.jsonl" for i in range(2)]
    counts = [log.read_text().count('"event":"arrive"') for log in logs]
    assert all(n > 0 for n in counts) and sum(counts) == len(results), counts  # both served
    verify = subprocess.run(
        [sys.executable, "-m", "floorguard", "verify", *map(str, logs), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    report = json.loads(verify.stdout)
    assert verify.returncode == 0, report["violations"][:3]
    assert report["num_entitled"] == decisions.count("entitled") <= FLOOR * 4
    assert report["num_requests"] == len(results)


def test_sighup_reloads_every_worker_and_a_killed_one_comes_back(workers):
    _, process, admins, path = workers
    config = yaml.safe_load(path.read_text())
    config["contracts"][0]["floor"] = FLOOR + 2
    path.write_text(yaml.safe_dump(config))
    process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while not all(_status(a)["reloads"] for a in admins):
        assert time.monotonic() < deadline, "a worker did not reload"
        time.sleep(0.1)
    victim = _status(admins[1])
    os.kill(victim["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while True:
        try:
            again = _status(admins[1])
            if again["pid"] != victim["pid"]:
                break
        except aiohttp.ClientError:
            pass
        assert time.monotonic() < deadline, "the killed worker was not started again"
        time.sleep(0.2)
    assert again["replica"] != victim["replica"]  # its request ids never repeat its former self's
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0


@pytest.mark.parametrize("client", ["python", "wrk"])
def test_the_workers_bench_measures_both_guards_side_by_side(client):
    """`floorguard bench proxy --workers 2` runs (figures are measured, not asserted): both
    guards answered every request (a non-200 raises), each with its CPU counted, and the
    processes beside them (client, upstream, Redis) with theirs."""
    from floorguard.bench.workers import bench_workers  # noqa: PLC0415

    if client == "wrk" and shutil.which("wrk") is None:
        if os.environ.get("FLOORGUARD_REQUIRE_WRK"):
            pytest.fail("wrk is not installed (apt-get install wrk) and FLOORGUARD_REQUIRE_WRK=1")
        pytest.skip("wrk is not installed (apt-get install wrk)")
    RedisServer().close()  # skips (or fails under .ci/run) without redis-server, as the bench
    result = bench_workers(workers=2, requests=64, repeats=1, client=client)
    assert result["client"].startswith(client)
    assert set(result["rps"]) == {"1", "2"} and min(result["rps"].values()) > 0
    assert set(result["cpu_ms_per_request"]) == {"1", "2"}
    assert all(v > 0 for v in result["cpu_ms_per_request"].values())
    assert set(result["cpu_ms_per_request_beside"]) == {"client", "upstream", "redis"}
    assert all(v >= 0 for v in result["cpu_ms_per_request_beside"].values())
    assert 0 < result["rps_ratio_ceiling"] <= 2


def test_a_killed_workers_log_verifies_beside_the_survivors(workers, tmp_path):
    """A SIGKILLed worker's log and the survivors' could never pass `verify`
    together. Under load worker 1 is killed and started again (appending to its log under
    a new name): the two logs verify together, the killed life's requests that were still
    open counted as cut by its death, not as a violation."""
    url, process, admins, _ = workers

    async def scenario():
        load = asyncio.ensure_future(_drive(url, seconds=4.0, per_s=10, lost_ok=True))
        await asyncio.sleep(1.5)
        victim = await asyncio.to_thread(_status, admins[1])
        os.kill(victim["pid"], signal.SIGKILL)
        return await load

    asyncio.run(scenario())
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    logs = [tmp_path / f"decisions.w{i}.jsonl" for i in range(2)]
    verify = subprocess.run(
        [sys.executable, "-m", "floorguard", "verify", *map(str, logs), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
