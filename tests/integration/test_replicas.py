"""Three guard processes share one floor through a real redis-server: the fleet admits
`min(B, offered)` of a tenant's requests from the floor in every window, whichever replica
each request reaches, and the merged decision logs pass `floorguard verify`."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
import yaml

from tests.integration.live import ISSUER, SECRET, token
from tests.redis_server import RedisServer, free_port

FLOOR, WINDOW_S = 4, 1.0


def _wait_listening(port: int, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"process exited with {process.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {port}") from None
            time.sleep(0.1)


def _floorguard(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "floorguard", *args])


@pytest.fixture
def fleet(tmp_path):
    redis_server = RedisServer().start()
    processes = []
    backend_port = free_port()
    processes.append(_floorguard("emulate", "--slots", "12", "--port", str(backend_port)))
    _wait_listening(backend_port, processes[-1])
    replicas = []
    for n in range(3):
        port, log = free_port(), tmp_path / f"replica-{n}.jsonl"
        config = {
            "port": port,
            "window_s": WINDOW_S,
            "replica": f"r{n}",
            "contracts": [
                {"tenant": "acme", "class": "assured", "floor": FLOOR, "deadline_ms": 1820},
                {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
            ],
            "backends": [{"url": f"http://127.0.0.1:{backend_port}", "slots": 4}],
            "identity": {
                "mode": "jwt",
                "jwt": {"algorithms": ["HS256"], "secret": SECRET, "issuer": ISSUER,
                        "audience": "floorguard"},
            },
            "store": {"url": redis_server.url, "replicas": 3},
            "decision_log": str(log),
        }  # fmt: skip
        path = tmp_path / f"replica-{n}.yaml"
        path.write_text(yaml.safe_dump(config))
        processes.append(_floorguard("serve", "--config", str(path)))
        _wait_listening(port, processes[-1])
        replicas.append((f"http://127.0.0.1:{port}", log, processes[-1]))
    yield replicas
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(10)
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
