"""The guard behind a real authenticating gateway (Debian's nginx, deploy/gateway/nginx.conf
as shipped, ports rewritten): nginx turns an API key into X-Tenant, the guard trusts the
header only from nginx's own source address. The attacks: a client naming a tenant through
nginx (replaced), a client talking to the guard directly with X-Tenant (403), no key (401 at
nginx). A stream passes token by token, and the request id nginx sets reaches the log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from floorguard.analysis.checker import check_trace
from floorguard.core.events import read_jsonl
from floorguard.rig.net import wait_listening
from tests.integration.backends import ScriptedBackend
from tests.integration.processes import emulate, serve, stop
from tests.redis_server import free_port

CONF = Path(__file__).parents[2] / "deploy" / "gateway" / "nginx.conf"
ACME, FREE = "Bearer key-acme-0123456789abcdef", "Bearer key-free-0123456789abcdef"

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None and not os.environ.get("FLOORGUARD_REQUIRE_NGINX"),
    reason="nginx is not installed (apt-get install nginx-light; .ci/run installs it)",
)


def _guard_config(backend: str, log: Path, access: Path) -> dict:
    return {
        "contracts": [
            {"tenant": "acme", "class": "assured", "floor": 6, "deadline_ms": 1820},
            {"tenant": "free-tier", "class": "opportunistic", "deadline_ms": 1820},
        ],
        "backends": [{"url": backend, "slots": 4}],
        "identity": {"mode": "header", "header": "X-Tenant", "trusted_upstreams": ["127.0.0.2/32"]},
        "decision_log": str(log),
        "access_log": str(access),
    }


async def _post(url, headers, body=None):
    body = body or {"model": "m", "prompt": "hi", "max_tokens": 3}
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as r:
        return r.status, r.headers.get("x-floorguard-decision"), await r.read()


@contextlib.contextmanager
def _nginx(tmp_path: Path, guard_url: str) -> Iterator[int]:
    """Debian's nginx with the shipped config in front of `guard_url`, on a free port.
    It runs in a session of its own and is stopped as nginx stops: SIGQUIT to the master,
    which waits for its workers; then anything left in its process group is killed, so no
    worker outlives the test."""
    port = free_port()
    prefix = tmp_path / "nginx"
    for sub in ("tmp/body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi"):
        (prefix / sub).mkdir(parents=True)
    conf = CONF.read_text()
    assert "127.0.0.1:8443" in conf and "server 127.0.0.1:8080;" in conf
    conf = conf.replace("127.0.0.1:8443", f"127.0.0.1:{port}")
    conf = conf.replace("server 127.0.0.1:8080;", f"server {guard_url.removeprefix('http://')};")
    (prefix / "nginx.conf").write_text(conf)
    nginx = subprocess.Popen(
        ["nginx", "-p", str(prefix), "-c", "nginx.conf", "-g", "daemon off;"],
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_listening(port, nginx)
        yield port
    finally:
        if nginx.poll() is None:
            nginx.send_signal(signal.SIGQUIT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                nginx.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(nginx.pid, signal.SIGKILL)
        nginx.wait(10)


def test_nginx_authenticates_and_the_guard_trusts_only_nginx(tmp_path):
    backend, emulator = emulate()
    log, access = tmp_path / "d.jsonl", tmp_path / "access.jsonl"
    guard_url, guard = serve(_guard_config(backend, log, access), tmp_path / "guard.yaml")
    try:
        with _nginx(tmp_path, guard_url) as port:
            gateway = f"http://127.0.0.1:{port}/v1/completions"

            async def attacks():
                return {
                    "acme": await _post(gateway, {"Authorization": ACME}),
                    "forged": await _post(gateway, {"Authorization": FREE, "X-Tenant": "acme"}),
                    "no key": await _post(gateway, {"X-Tenant": "acme"}),
                    "direct": await _post(guard_url + "/v1/completions", {"X-Tenant": "acme"}),
                    "stream": await _post(
                        gateway,
                        {"Authorization": ACME},
                        {"model": "m", "prompt": "hi", "max_tokens": 5, "stream": True},
                    ),
                }

            out = asyncio.run(attacks())
            assert out["acme"][:2] == (200, "entitled")
            assert out["forged"][:2] == (200, "surplus")  # served as free-tier, not as acme
            assert out["no key"][0] == 401 and b"invalid_api_key" in out["no key"][2]
            assert out["direct"][0] == 403 and b"untrusted_upstream" in out["direct"][2]
            assert out["stream"][0] == 200 and out["stream"][2].count(b"data: {") >= 5
            guard.send_signal(signal.SIGTERM)
            assert guard.wait(30) == 0
    finally:
        stop(guard, emulator)
    report = check_trace(list(read_jsonl(str(log))))
    assert report.ok(), report.violations[:3]
    lines = access.read_text().splitlines()
    tenants = [line.split('"tenant":"')[1].split('"')[0] for line in lines if '"tenant"' in line]
    assert tenants.count("acme") == 2 and tenants.count("free-tier") == 1
    assert all(len(line.split('"request_id":"')[1].split('"')[0]) == 32 for line in lines)


def test_a_slow_reader_behind_nginx_does_not_hold_the_slots(tmp_path, live):
    """Behind the shipped nginx (which relays SSE unbuffered and would wait 60 s on a slow
    client), four free-tier streams of 16 MB whose clients read nothing: the guard cuts them
    at its own bound, the slots are free, and six assured requests through nginx meanwhile
    are all on time; the log verifies."""
    backend = ScriptedBackend()
    backend_url, _ = live.serve(backend.app)
    log, access = tmp_path / "d.jsonl", tmp_path / "access.jsonl"
    config = {**_guard_config(backend_url, log, access), "client_write_timeout_s": 2.0}
    config["limits"] = {"max_buffered_reply_bytes": 1_000_000}
    guard_url, guard = serve(config, tmp_path / "guard.yaml")
    hogs: list[socket.socket] = []
    try:
        with _nginx(tmp_path, guard_url) as port:
            body = orjson.dumps({"model": "m", "prompt": "huge:16", "max_tokens": 4,
                                 "stream": True})  # fmt: skip
            for _ in range(4):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(
                    f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: {FREE}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                    .encode() + body
                )  # fmt: skip
                hogs.append(sock)
            time.sleep(2.0)

            async def assured():
                async def one():
                    started = time.monotonic()
                    status, _, _ = await _post(
                        f"http://127.0.0.1:{port}/v1/completions", {"Authorization": ACME}
                    )
                    return status, time.monotonic() - started

                return await asyncio.gather(*(one() for _ in range(6)))

            results = asyncio.run(assured())
            assert [s for s, _ in results] == [200] * 6
            assert max(t for _, t in results) < 1.82
            for sock in hogs:
                sock.close()
            guard.send_signal(signal.SIGTERM)
            assert guard.wait(30) == 0
    finally:
        for sock in hogs:
            sock.close()
        stop(guard)
    report = check_trace(list(read_jsonl(str(log))))
    assert report.ok(), report.violations[:3]
    ends = [e for e in read_jsonl(str(log)) if e.tenant == "free-tier" and e.kind.value == "abort"]
    assert len(ends) == 4 and {e.reason for e in ends} == {"client_too_slow"}
