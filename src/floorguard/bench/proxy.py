"""`floorguard bench proxy`: what the guard adds on loopback, measured beside references.

One instant upstream (a fixed OpenAI-shaped answer) runs in a child process of its own
(`direct`); a second child runs the two proxies in front of it on the event loop `serve`
runs (uvloop where it is installed, `serve.loop_factory`): `passthrough` (a bare aiohttp
proxy: read body, forward, return) and `floorguard` (JWT identity + meter + dispatch +
decision log, `C` large enough that nothing queues). Where `nginx` is installed, a fourth:
`nginx`, one worker process proxying to the same upstream on keep-alive connections (a
compiled proxy's cost, for scale). The parent is the client: latency at concurrency 1 and
requests/s at concurrency 32, paths interleaved, best of `repeats`; on Linux also each
child's CPU per request at concurrency 32 (the least of `repeats`): the proxies' own, and
the upstream's beside it.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import numpy as np
from aiohttp import web

from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.proxy.edge.openai_format import completion_body
from floorguard.proxy.process.app import GuardRunner, create_app
from floorguard.proxy.process.http_server import freeze_startup_heap
from floorguard.proxy.process.serve import loop_factory
from floorguard.rig.net import free_ports

__all__ = ["PATHS", "bench_proxy", "cpu_s", "nginx_binary", "serving_in_child"]

SECRET = "bench-secret-0123456789abcdef0123456789"
PATHS = ("direct", "passthrough", "floorguard")


def _upstream_app() -> web.Application:
    body = completion_body("bench", "m", False, " tok", completion_tokens=1, created_at=0.0)

    async def complete(_: web.Request) -> web.Response:
        return web.json_response(body)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_: web.Request) -> web.Response:
        return web.json_response(MODELS)

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/health", health)  # the guard dispatches only to a healthy backend
    app.router.add_get("/v1/models", models)  # as vLLM lists its model: the guard learns it
    # every few seconds (a backend that lists none is asked again every half second)
    return app


MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "bench"}]}
"""The upstream's `/v1/models`: the one model the bench's requests name."""


def _passthrough_app(upstream: str) -> web.Application:
    app = web.Application()
    session: dict[str, aiohttp.ClientSession] = {}

    async def start(_: web.Application) -> None:
        session["s"] = aiohttp.ClientSession()

    async def stop(_: web.Application) -> None:
        await session["s"].close()

    async def forward(request: web.Request) -> web.Response:
        data = await request.read()
        async with session["s"].post(
            upstream + "/v1/completions", data=data, headers={"Content-Type": "application/json"}
        ) as r:
            return web.Response(
                body=await r.read(), status=r.status, content_type="application/json"
            )

    app.router.add_post("/v1/completions", forward)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def _serve_upstream(ports: list[int], _: str) -> None:
    """The upstream alone, in its own process."""

    async def main() -> None:
        runner = GuardRunner(_upstream_app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", ports[0]).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def _guard_config(upstream: str, log_path: str) -> GuardServerConfig:
    return GuardServerConfig.model_validate(
        {
            "window_s": 1.0,
            "contracts": [
                {"tenant": "acme", "class": "assured", "floor": 1_000_000, "deadline_ms": 60_000}
            ],
            "backends": [{"url": upstream, "slots": 256}],
            "identity": {"mode": "jwt", "jwt": {"algorithms": ["HS256"], "secret": SECRET}},
            "decision_log": log_path,
        }
    )


def _serve_proxies(ports: list[int], log_path: str) -> None:
    """The pass-through and the guard in front of the upstream at `ports[0]`, on `ports[1]`
    and `ports[2]`, on the event loop `serve` would run the guard's configuration on."""
    upstream = f"http://127.0.0.1:{ports[0]}"
    config = _guard_config(upstream, log_path)

    async def main() -> None:
        runners = []
        for app, port in ((_passthrough_app(upstream), ports[1]), (create_app(config), ports[2])):
            runner = GuardRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
        freeze_startup_heap()  # as `serve` does
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=loop_factory(config)) as runner:
        runner.run(main())


async def _latencies(
    session: aiohttp.ClientSession, url: str, n: int, headers: dict[str, str]
) -> list[float]:
    out = []
    body = {"model": "m", "prompt": "x", "max_tokens": 1}
    for _ in range(n):
        started = time.perf_counter()
        async with session.post(url, json=body, headers=headers) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url} answered {r.status}")
        out.append(time.perf_counter() - started)
    return out


async def _throughput(
    session: aiohttp.ClientSession, url: str, n: int, concurrency: int, headers: dict[str, str]
) -> float:
    started = time.perf_counter()
    await asyncio.gather(
        *(_latencies(session, url, n // concurrency, headers) for _ in range(concurrency))
    )
    return (n // concurrency) * concurrency / (time.perf_counter() - started)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc), in the kernel's clock
    ticks (10 ms): over `bench proxy`'s default 1,600 requests a run, 6 µs a request."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu(proxy_cpu_us: dict[str, float], upstream_cpu_us: dict[str, float]) -> dict[str, Any]:
    """CPU per request at concurrency 32, by path: the proxies' process's (each proxy's
    own: the upstream runs apart) and the upstream's beside it."""
    own = {p: proxy_cpu_us[p] for p in ("passthrough", "floorguard")}
    return {
        "own_cpu_us_per_request": own,
        "upstream_cpu_us_per_request": upstream_cpu_us,
        "floorguard_over_passthrough_cpu": own["floorguard"] / own["passthrough"],
    }


async def _client(
    ports: dict[str, int], requests: int, repeats: int, pids: tuple[int, int] | None
) -> dict[str, Any]:
    """`pids`: the upstream's process and the proxies' (Linux: their CPU is read)."""
    paths = list(ports)
    urls = {p: f"http://127.0.0.1:{port}/v1/completions" for p, port in ports.items()}
    token = jwt.encode({"sub": "acme", "exp": time.time() + 3600}, SECRET, algorithm="HS256")
    headers = {
        p: ({"Authorization": f"Bearer {token}"} if p == "floorguard" else {}) for p in paths
    }
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for p in paths:  # warm up every path (connections, imports, JIT-free caches)
            await _latencies(session, urls[p], 50, headers[p])
        c1: dict[str, list[float]] = {p: [] for p in paths}
        rps: dict[str, float] = dict.fromkeys(paths, 0.0)
        upstream_cpu_us: dict[str, float] = {p: math.inf for p in paths}
        proxy_cpu_us: dict[str, float] = {p: math.inf for p in PATHS[1:]}
        sent = requests * 4 // 32 * 32  # what `_throughput` sends at concurrency 32
        for _ in range(repeats):
            for p in paths:
                c1[p] += await _latencies(session, urls[p], requests, headers[p])
            for p in paths:
                before = [cpu_s(pid) for pid in pids] if pids is not None else []
                rps[p] = max(rps[p], await _throughput(session, urls[p], sent, 32, headers[p]))
                if pids is not None:
                    spent = [
                        (cpu_s(pid) - b) * 1e6 / sent for pid, b in zip(pids, before, strict=True)
                    ]
                    upstream_cpu_us[p] = min(upstream_cpu_us[p], spent[0])
                    if p in proxy_cpu_us:  # nginx is not the proxies' child
                        proxy_cpu_us[p] = min(proxy_cpu_us[p], spent[1])
    p50 = {p: float(np.percentile(c1[p], 50)) * 1e3 for p in paths}
    p99 = {p: float(np.percentile(c1[p], 99)) * 1e3 for p in paths}
    nginx: dict[str, Any] = (
        {
            "nginx_added_p50_ms_c1": p50["nginx"] - p50["direct"],
            "rps_nginx": rps["nginx"],
            "floorguard_over_nginx_rps": rps["floorguard"] / rps["nginx"],
        }
        if "nginx" in rps
        else {"nginx": "not installed: the nginx path is left out"}
    )
    return {
        "p50_ms_c1": p50,
        "p99_ms_c1": p99,
        "added_p50_ms_c1": p50["floorguard"] - p50["direct"],
        "added_p99_ms_c1": p99["floorguard"] - p99["direct"],
        "passthrough_added_p50_ms_c1": p50["passthrough"] - p50["direct"],
        "rps_direct": rps["direct"],
        "rps_passthrough": rps["passthrough"],
        "rps_floorguard": rps["floorguard"],
        "floorguard_over_passthrough_rps": rps["floorguard"] / rps["passthrough"],
        **(_own_cpu(proxy_cpu_us, upstream_cpu_us) if pids is not None else {}),
        "event_loop": _guard_config("http://upstream", "-").loop_choice(),
        **nginx,
        "requests_per_path": requests * repeats,
        "repeats": repeats,
    }


def bench_proxy(*, requests: int = 400, repeats: int = 2) -> dict[str, Any]:
    ports = free_ports(4)
    paths = dict(zip(PATHS, ports, strict=False))
    with ExitStack() as stack:
        upstream, _ = stack.enter_context(serving_in_child(_serve_upstream, ports[:1]))
        proxies, _ = stack.enter_context(serving_in_child(_serve_proxies, ports[:3]))
        binary = nginx_binary()
        if binary is not None:
            stack.enter_context(_nginx(binary, upstream=ports[0], port=ports[3]))
            paths["nginx"] = ports[3]
        assert upstream.pid is not None and proxies.pid is not None
        linux = Path(f"/proc/{proxies.pid}/stat").exists()
        pids = (upstream.pid, proxies.pid) if linux else None
        return asyncio.run(_client(paths, requests, repeats, pids))


def nginx_binary() -> str | None:
    """nginx's executable, if installed (on PATH, or in sbin, which a user's PATH may lack)."""
    found = shutil.which("nginx")
    return found or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )


@contextmanager
def _nginx(binary: str, *, upstream: int, port: int) -> Iterator[None]:
    """nginx in the foreground, one worker, proxying `port` to the upstream on keep-alive
    connections; stopped on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        temp_paths = "\n".join(
            f"  {kind}_temp_path {tmp}/{kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(
            f"""worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
{temp_paths}
  upstream bench {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://bench;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""
        )
        said = Path(tmp) / "stderr"
        with said.open("wb") as stderr:
            process = subprocess.Popen(
                [binary, "-p", tmp, "-c", str(conf), "-g", "daemon off;"],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            try:
                _wait_listening([port], timeout_s=10.0)
            except RuntimeError:
                logs = [said, Path(tmp) / "error.log"]
                errors = "".join(p.read_text() for p in logs if p.exists())[-500:]
                raise RuntimeError(f"nginx did not start: {errors}") from None
            yield
        finally:
            process.terminate()
            process.wait(5)


@contextmanager
def serving_in_child(
    serve: Callable[[list[int], str], None], ports: list[int]
) -> Iterator[tuple[multiprocessing.process.BaseProcess, Path]]:
    """Run `serve(ports, decision_log_path)` in a spawned child until every port listens;
    yields the child and its decision log's path; the child is terminated on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "decisions.jsonl"
        child = multiprocessing.get_context("spawn").Process(
            target=serve, args=(ports, str(log)), daemon=True
        )
        child.start()
        try:
            _wait_listening(ports)
            yield child, log
        finally:
            child.terminate()
            child.join(5)


def _wait_listening(ports: list[int], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for port in ports:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench server on port {port} did not start") from None
                time.sleep(0.1)
