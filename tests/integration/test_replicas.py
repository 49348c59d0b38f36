"""Three guard processes share one floor through a real redis-server: the fleet admits
`min(B, offered)` of a tenant's requests from the floor in every window, whichever replica
each request reaches, and the merged decision logs pass `floorguard verify`."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import aiohttp
import pytest

from tests.integration.live import ISSUER, SECRET, token
from tests.integration.processes import emulate, serve, stop
from tests.redis_server import RedisServer

FLOOR, WINDOW_S = 4, 1.0


@pytest.fixture
def fleet(tmp_path):
    redis_server = RedisServer().start()
    backend, emulator = emulate(slots=12)
    processes = [emulator]
    replicas = []
    for n in range(3):
        log = tmp_path / f"replica-{n}.jsonl"
        config = {
            "window_s": WINDOW_S,
            "replica": f"r{n}",
            "contracts": [
                {"tenant": "acme", "class": "assured", "floor": FLOOR, "deadline_ms": 1820},
                {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
            ],
            "backends": [{"url": backend, "slots": 4}],
            "identity": {
                "mode": "jwt",
                "jwt": {"algorithms": ["HS256"], "secret": SECRET, "issuer": ISSUER,
                        "audience": "floorguard"},
            },
            "store": {"url": redis_server.url, "replicas": 3},
            "decision_log": str(log),
        }  # fmt: skip
        url, process = serve(config, tmp_path / f"replica-{n}.yaml")
        processes.append(process)
        replicas.append((url, log, process))
    yield replicas
    stop(*processes)
    redis_server.close()


async def _drive(urls: list[str], seconds: float, per_s: float) -> list[tuple[str, int, str]]:
    """Round-robin acme's requests (and free-tier's) over the replicas, open-loop."""
    results = []
    headers = {t: {"Authorization": f"Bearer {token(t)}"} for t in ("acme", "free")}

    async def one(session, url, tenant):
        async with session.post(
            url + "/v1/completions",
            json={"model": "m", "prompt": "x", "max_tokens": 4},
            headers=headers[tenant],
        ) as r:
            await r.read()
            results.append((tenant, r.status, r.headers.get("x-floorguard-decision", "")))

    async with aiohttp.ClientSession() as session:
        tasks = []
        for i in range(int(seconds * per_s)):
            url = urls[i % len(urls)]
            tasks.append(asyncio.create_task(one(session, url, "acme")))
            tasks.append(asyncio.create_task(one(session, url, "free")))
            await asyncio.sleep(1 / per_s)
        await asyncio.gather(*tasks)
    return results


def test_three_replicas_share_one_floor(fleet):
    urls = [url for url, _, _ in fleet]
    results = asyncio.run(_drive(urls, seconds=3.0, per_s=9))
    decisions = [d for tenant, _, d in results if tenant == "acme"]
    assert decisions.count("entitled") <= FLOOR * 4  # at most B in each of ≤ 4 windows
    assert "rejected" in decisions  # 9/s against B = 4/s: the floor ran out
    for _, _, process in fleet:  # a graceful stop writes every pending log line
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    logs = [str(log) for _, log, _ in fleet]
    verify = subprocess.run(
        [sys.executable, "-m", "floorguard", "verify", *logs, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    report = json.loads(verify.stdout)
    assert verify.returncode == 0, report["violations"][:3]
    assert report["num_entitled"] == decisions.count("entitled")
    assert report["num_requests"] == len(results)
