"""`floorguard bench soak`: the guard under sustained overload, watched for drift.

A child process serves the emulated backend (v100-moe, `C` = 4) and the guard in front of
it. The parent fires, open-loop, one assured tenant at its floor rate (`B` per window) and
an opportunistic flood at `overload`× the backend's saturated capacity, for `minutes`; it
measures every request from the client side and samples the guard process's resident
memory and open file descriptors every second. Reported: per window *of the guard's clock*
(read from its decision log, which is also checked with `floorguard verify`'s checker), the
assured requests that arrived and were admitted from the floor; per client-side second, the
assured requests completed by their deadline; p50/p99 latencies per class; RSS and
descriptor counts over time, and their growth after the warm-up.

The floor is counted in the guard's windows, not the client's: under load a request sent
at x.99 s can arrive at x+1.01 s, so a client-side second may hold four arrivals of a
three-per-second stream and another two, though the guard's windows each hold three.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import numpy as np
from aiohttp import web
from rich.progress import Progress

from floorguard.analysis.checker import check_trace
from floorguard.bench.proxy import serving_in_child
from floorguard.core.events import EventKind, TraceEvent, read_jsonl
from floorguard.profiles import get_profile
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.proxy.process.app import create_app
from floorguard.rig.emulator import Emulator, create_emulator_app
from floorguard.rig.net import free_ports
from floorguard.sim.targets import saturated_capacity

__all__ = ["bench_soak"]

SECRET = "soak-secret-0123456789abcdef0123456789"
FLOOR, WINDOW_S, SLOTS, DEADLINE_MS, TOKENS = 3, 1.0, 4, 1820, 16


def _serve(ports: list[int], log: str) -> None:
    config = GuardServerConfig.model_validate(
        {
            "window_s": WINDOW_S,
            "contracts": [
                {"tenant": "acme", "class": "assured", "floor": FLOOR, "deadline_ms": DEADLINE_MS},
                {"tenant": "free", "class": "opportunistic", "deadline_ms": DEADLINE_MS},
            ],
            "backends": [{"url": f"http://127.0.0.1:{ports[0]}", "slots": SLOTS}],
            "identity": {"mode": "jwt", "jwt": {"algorithms": ["HS256"], "secret": SECRET}},
            "decision_log": log,
        }
    )

    async def main() -> None:
        for app, port in (
            (create_emulator_app(Emulator("v100-moe", SLOTS)), ports[0]),
            (create_app(config), ports[1]),
        ):
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def _sample(pid: int) -> tuple[float, int]:
    """Resident memory (MiB) and open descriptors of a process (Linux /proc)."""
    rss_kib = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))


async def _load(url: str, pid: int, seconds: float, opportunistic_per_s: float) -> dict[str, Any]:
    expires = time.time() + 86400
    tokens = {t: jwt.encode({"sub": t, "exp": expires}, SECRET) for t in ("acme", "free")}
    records: list[tuple[str, float, float, int, str]] = []
    samples: list[tuple[float, float, int]] = []
    started = time.time()

    async def one(session: aiohttp.ClientSession, tenant: str) -> None:
        sent = time.time()
        try:
            async with session.post(
                url,
                json={"model": "m", "prompt": "x", "max_tokens": TOKENS},
                headers={"Authorization": f"Bearer {tokens[tenant]}"},
            ) as r:
                await r.read()
                status, decision = r.status, r.headers.get("x-floorguard-decision", "")
        except aiohttp.ClientError:
            status, decision = 0, "client_error"
        records.append((tenant, sent, time.time() - sent, status, decision))

    async def fire(session: aiohttp.ClientSession, tenant: str, per_s: float) -> None:
        tasks: set[asyncio.Task[None]] = set()
        n = 0
        while (due := started + n / per_s) < started + seconds:
            await asyncio.sleep(max(0.0, due - time.time()))
            task = asyncio.create_task(one(session, tenant))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        await asyncio.gather(*tasks)

    async def watch() -> None:
        while time.time() < started + seconds:
            samples.append((time.time() - started, *_sample(pid)))
            await asyncio.sleep(1.0)

    with Progress(transient=True) as progress:
        bar = progress.add_task("soak", total=seconds)

        async def tick() -> None:
            while time.time() < started + seconds:
                progress.update(bar, completed=time.time() - started)
                await asyncio.sleep(0.5)

        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(
                fire(session, "acme", FLOOR / WINDOW_S),
                fire(session, "free", opportunistic_per_s),
                watch(),
                tick(),
            )
    return {"records": records, "samples": samples, "started": started}


def _floor_windows(events: list[TraceEvent]) -> list[dict[str, int]]:
    """Per window of the guard's clock: the assured tenant's arrivals and floor admissions."""
    window_of: dict[object, int] = {}
    windows: dict[int, Counter[str]] = {}
    for e in events:
        if e.tenant != "acme":
            continue
        if e.kind is EventKind.ARRIVE:
            window_of[e.request_id] = k = math.floor(e.at / WINDOW_S)  # origin_at = 0
            windows.setdefault(k, Counter())["arrived"] += 1
        elif e.kind is EventKind.ADMIT and e.entitled:
            windows[window_of[e.request_id]]["entitled"] += 1
    return [{"window": k, "arrived": 0, "entitled": 0, **v} for k, v in sorted(windows.items())]


def _report(
    run: dict[str, Any], seconds: float, overload: float, capacity: float
) -> dict[str, Any]:
    records, samples, events = run["records"], run["samples"], run["events"]
    per_window = _floor_windows(events)
    held = [w["entitled"] == min(FLOOR, w["arrived"]) for w in per_window]
    check = check_trace(events)
    on_time = sum(r[0] == "acme" and r[3] == 200 and r[2] * 1e3 <= DEADLINE_MS for r in records)
    latency = {}
    for cls, tenant in (("assured", "acme"), ("opportunistic", "free")):
        done = [r[2] * 1e3 for r in records if r[0] == tenant and r[3] == 200]
        latency[cls] = {
            "completed": len(done),
            "offered": sum(r[0] == tenant for r in records),
            "p50_ms": float(np.percentile(done, 50)) if done else None,
            "p99_ms": float(np.percentile(done, 99)) if done else None,
        }
    warm = [s for s in samples if s[0] >= min(10.0, seconds / 3)] or samples
    return {
        "seconds": seconds,
        "overload": overload,
        "backend_capacity_per_s": capacity,
        "floor_per_window": FLOOR,
        "windows_floor_held": sum(held),
        "windows": len(per_window),
        "assured_on_time": on_time,
        "assured_entitled": sum(w["entitled"] for w in per_window),
        "verify_ok": check.ok(),
        "verify_violations": [f"{v.prop}: {v.message}" for v in check.failed()[:10]],
        "latency": latency,
        "statuses": dict(Counter(str(r[3]) for r in records)),
        "rss_mib": [round(s[1], 1) for s in samples],
        "open_fds": [s[2] for s in samples],
        "rss_growth_mib_after_warmup": warm[-1][1] - warm[0][1],
        "fd_growth_after_warmup": warm[-1][2] - warm[0][2],
        "per_window": per_window,
    }


def bench_soak(*, minutes: float = 5.0, overload: float = 10.0) -> dict[str, Any]:
    seconds = minutes * 60
    capacity, _ = saturated_capacity(get_profile("v100-moe"), TOKENS, SLOTS)
    ports = free_ports(2)
    with serving_in_child(_serve, ports) as (child, log):
        assert child.pid is not None
        url = f"http://127.0.0.1:{ports[1]}/v1/completions"
        run = asyncio.run(_load(url, child.pid, seconds, overload * capacity))
        time.sleep(3 * 0.2)  # the guard flushes its log every 0.2 s (decision_log_flush_s)
        run["events"] = list(read_jsonl(str(log)))
    return _report(run, seconds, overload, capacity)
