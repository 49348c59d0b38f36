"""`floorguard bench proxy --workers N`: a host's cores. One `floorguard serve` with
`workers: N` beside the same guard with `workers: 1`, in one run: each shares its floor
through a throw-away local redis-server (its own key prefix), in front of one instant
upstream (a fixed OpenAI-shaped answer, in a child process), with the JWT identity and the
decision log on. This process is the client: requests/s at concurrency 32 on keep-alive
connections (the kernel spreads them over the workers), the two guards interleaved, best of
`repeats`; and each guard's CPU-seconds per request — the user + system time of its
processes (the supervisor and every worker, from Linux's /proc) over the requests sent.

The client, the upstream and Redis run on the same cores, so they bound what a second
worker can give: their CPU per request is measured in the same runs, and `rps_ratio_ceiling`
is the ratio the cores allow, `cores / (guard + client + upstream + Redis CPU per request)`
for N workers against `1 / (guard CPU per request)` for one (one worker is bound by its one
core wherever it is the slowest process on the path).

The load comes from `wrk` where it is installed (`apt-get install wrk`: a compiled client
nobody here wrote, which leaves the cores to what is measured; each run lasts
`WRK_SECONDS`), else from this process's aiohttp client (`requests` × 4 a run); `client`
in the output says which, and `client=` picks one.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import yaml

from floorguard.bench.proxy import (
    SECRET,
    _latencies,
    _serve_upstream,
    _throughput,
    cpu_s,
    serving_in_child,
)
from floorguard.errors import FloorguardError
from floorguard.rig.local_redis import LocalRedis
from floorguard.rig.net import free_port_run, free_ports

__all__ = ["bench_workers"]

CONCURRENCY = 32
WRK_SECONDS = 3  # whole seconds: wrk takes no fraction
_WRK_SCRIPT = """wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"x","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("TOKEN")
"""


def _config(
    upstream: str, redis_url: str, workers: int, *, port: int, admin: int, log: Path
) -> dict[str, Any]:
    return {
        "port": port,
        "window_s": 1.0,
        "contracts": [
            {"tenant": "acme", "class": "assured", "floor": 1_000_000, "deadline_ms": 60_000}
        ],
        "backends": [{"url": upstream, "slots": 256}],
        "identity": {"mode": "jwt", "jwt": {"algorithms": ["HS256"], "secret": SECRET}},
        "store": {"url": redis_url, "prefix": f"bench-w{workers}"},
        "workers": workers,
        "admin": {"port": admin},
        "decision_log": str(log),
    }


class _Guard:
    def __init__(self, workers: int, config: dict[str, Any], path: Path) -> None:
        self.workers = workers
        path.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{config['port']}/v1/completions"
        self.admins = [config["admin"]["port"] + i for i in range(workers)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "floorguard", "serve", "--config", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.pids: list[int] = []

    async def started(self, session: aiohttp.ClientSession, timeout_s: float = 60.0) -> None:
        """Every worker answers its admin port; their pids (and the supervisor's)."""
        deadline = time.monotonic() + timeout_s
        pids = {self.process.pid}
        for port in self.admins:
            while True:
                if self.process.poll() is not None:
                    raise FloorguardError(f"the {self.workers}-worker guard exited at start")
                try:
                    async with session.get(f"http://127.0.0.1:{port}/admin/status") as r:
                        pids.add(int((await r.json())["pid"]))
                        break
                except (aiohttp.ClientError, KeyError, ValueError):
                    if time.monotonic() > deadline:
                        raise FloorguardError(f"no worker answered on {port}") from None
                    await asyncio.sleep(0.2)
        self.pids = sorted(pids)

    def cpu_s(self) -> float:
        return sum(cpu_s(pid) for pid in self.pids)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _others_cpu_s(others: dict[str, int | None]) -> dict[str, float]:
    """CPU seconds so far of the processes beside the guard: the client (this process and
    its ended children: wrk), and the given pids."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"client": time.process_time() + ended.ru_utime + ended.ru_stime} | {
        name: cpu_s(pid) for name, pid in others.items() if pid is not None
    }


def _wrk(binary: str, url: str, token: str, script: Path) -> tuple[float, int]:
    """One `wrk` run at `CONCURRENCY`: (requests/s, requests answered)."""
    done = subprocess.run(
        [binary, "-t1", f"-c{CONCURRENCY}", f"-d{WRK_SECONDS}s", "-s", str(script), url],
        env={**os.environ, "TOKEN": token}, capture_output=True, text=True,
        timeout=WRK_SECONDS + 60, check=False,
    )  # fmt: skip
    answered = re.search(r"(\d+) requests in", done.stdout)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if done.returncode != 0 or answered is None or rate is None:
        raise FloorguardError(f"wrk failed: {(done.stderr or done.stdout)[-500:]}")
    if "Non-2xx" in done.stdout:
        raise FloorguardError(f"the guard refused requests under wrk: {done.stdout[-500:]}")
    return float(rate.group(1)), int(answered.group(1))


async def _client(
    guards: list[_Guard],
    requests: int,
    repeats: int,
    others: dict[str, int | None],
    wrk: tuple[str, Path] | None,
) -> dict[str, Any]:
    token = jwt.encode({"sub": "acme", "exp": time.time() + 3600}, SECRET, algorithm="HS256")
    headers = {"Authorization": f"Bearer {token}"}
    rps = {g.workers: 0.0 for g in guards}
    cpu: dict[int, list[float]] = {g.workers: [] for g in guards}
    beside: dict[str, list[float]] = {}  # the N-worker runs' client, upstream, Redis
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for guard in guards:
            await guard.started(session)
            await _latencies(session, guard.url, 100, headers)  # warm up
        n = requests * 4
        for _ in range(repeats):
            for guard in guards:
                before, others_before = guard.cpu_s(), _others_cpu_s(others)
                if wrk is None:
                    got = await _throughput(session, guard.url, n, CONCURRENCY, headers)
                    sent = n // CONCURRENCY * CONCURRENCY
                else:
                    got, sent = await asyncio.to_thread(_wrk, wrk[0], guard.url, token, wrk[1])
                rps[guard.workers] = max(rps[guard.workers], got)
                cpu[guard.workers].append((guard.cpu_s() - before) / sent)
                if guard is guards[-1]:
                    for name, spent in _others_cpu_s(others).items():
                        beside.setdefault(name, []).append((spent - others_before[name]) / sent)
    one, many = guards[0].workers, guards[-1].workers
    best_cpu = {w: min(samples) for w, samples in cpu.items()}
    best_beside = {name: min(samples) for name, samples in beside.items()}
    cores = os.cpu_count() or 1
    ceiling = min(cores / (best_cpu[many] + sum(best_beside.values())) * best_cpu[one], many)
    return {
        "workers": many,
        "client": "python aiohttp" if wrk is None else f"wrk ({wrk[0]}), {WRK_SECONDS} s a run",
        "concurrency": CONCURRENCY,
        "rps": {str(w): r for w, r in rps.items()},
        "rps_ratio": rps[many] / rps[one],
        "cpu_ms_per_request": {str(w): c * 1e3 for w, c in best_cpu.items()},
        "cpu_per_request_ratio": best_cpu[many] / best_cpu[one],
        "cpu_ms_per_request_beside": {name: c * 1e3 for name, c in best_beside.items()},
        "rps_ratio_ceiling": ceiling,
        "rps_over_ceiling": rps[many] / rps[one] / ceiling,
        "cores": cores,
        "requests_per_run": n if wrk is None else None,
        "repeats": repeats,
    }


def bench_workers(
    *, workers: int = 2, requests: int = 400, repeats: int = 3, client: str = "auto"
) -> dict[str, Any]:
    """`client`: `wrk`, `python`, or `auto` (wrk where installed)."""
    if workers < 2:
        raise FloorguardError(f"--workers {workers}: compare ≥ 2 workers with one")
    if client not in ("auto", "wrk", "python"):
        raise FloorguardError(f"--client {client!r}: one of auto, wrk, python")
    wrk_binary = shutil.which("wrk") if client in ("auto", "wrk") else None
    if client == "wrk" and wrk_binary is None:
        raise FloorguardError("--client wrk: wrk is not installed (apt-get install wrk)")
    if not Path("/proc/self/stat").exists():
        raise FloorguardError("bench proxy --workers reads CPU time from /proc: Linux only")
    try:
        redis_server = LocalRedis()
    except FileNotFoundError as exc:
        raise FloorguardError(
            f"bench proxy --workers: {exc} — the workers share the floor through it"
        ) from exc
    upstream_port, *ports = free_ports(3)
    with (
        redis_server,
        serving_in_child(_serve_upstream, [upstream_port]) as (upstream_child, _),
        tempfile.TemporaryDirectory() as tmp,
    ):
        upstream, folder = f"http://127.0.0.1:{upstream_port}", Path(tmp)
        guards: list[_Guard] = []
        try:
            for count, port in ((1, ports[0]), (workers, ports[1])):
                log = folder / f"w{count}.jsonl"
                admin = free_port_run(count)
                config = _config(upstream, redis_server.url, count, port=port, admin=admin, log=log)
                guards.append(_Guard(count, config, folder / f"guard-{count}.yaml"))
            others = {"upstream": upstream_child.pid, "redis": redis_server.pid}
            wrk = None
            if wrk_binary is not None:
                script = folder / "post.lua"
                script.write_text(_WRK_SCRIPT)
                wrk = (wrk_binary, script)
            return asyncio.run(_client(guards, requests, repeats, others, wrk))
        finally:
            for guard in guards:
                guard.stop()
