"""`floorguard bench store`: admission decisions per second through one guard with the
Redis-shared floor, beside raw redis-py EVALSHA throughput, in one run.

Both sides run `concurrency` asyncio tasks on one event loop against the same
`redis-server` (a throw-away one on a free port unless `--redis URL` is given). Raw: each
task loops on the floor's Lua script (`EVALSHA`). Guard: each task loops on one admission —
`Guard.begin_arrival` (its store call), the awaited EVALSHA through `SharedFloor`,
`continue_arrival` with the grant,
then dispatch and completion so the queue stays empty. Leased: each task loops on one
fleet slot lease taken and given back (`SlotLeases.acquire_async` + `release_async`, two EVALSHA of
`lease.lua`), what `store.slots: leased` adds to each start. Sides alternate `repeats`
times; the best of each is reported.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import numpy as np

from floorguard.core.contract import Contract, ContractClass, GuardConfig, WindowSchedule
from floorguard.core.guard import Guard
from floorguard.core.request import Request
from floorguard.core.surface import StoreCall
from floorguard.learners.adversaries import AlwaysAdmit
from floorguard.rig.local_redis import LocalRedis
from floorguard.store.leases import SlotLeases, redis_lease_script
from floorguard.store.redis_store import RedisCreditStore
from floorguard.store.shared import SharedFloor, Unavailable

__all__ = ["bench_store"]


async def _raw(store: RedisCreditStore, schedule: WindowSchedule, n: int, tasks: int) -> float:
    async def worker() -> None:
        for _ in range(n // tasks):
            await store.call_async("raw", 1, 1_000_000_000, schedule, 0.0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return (n // tasks) * tasks / (time.perf_counter() - started)


async def _guarded(guard: Guard, floor: SharedFloor, n: int, tasks: int) -> float:
    ids = itertools.count()
    schedule = guard.config.schedule

    async def worker() -> None:
        for _ in range(n // tasks):
            now = time.time()
            offered = Request(next(ids), "acme", now, 16)
            pending = guard.begin_arrival(offered, now)
            assert type(pending.need) is StoreCall
            need = pending.need
            grant = await floor.acquire_async(
                need.key, need.weight, need.capacity, schedule, now, floor=need.floor
            )
            guard.continue_arrival(pending, now, grant)
            for decision in guard.poll(now):
                guard.finish(decision.request.request_id, now, "complete")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return (n // tasks) * tasks / (time.perf_counter() - started)


async def _leased(leases: SlotLeases, n: int, tasks: int) -> float:
    ids = itertools.count()

    async def worker() -> None:
        for _ in range(n // tasks):
            rid = str(next(ids))
            assert await leases.acquire_async(0, rid, entitled=True) == ""
            await leases.release_async(0, rid)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return (n // tasks) * tasks / (time.perf_counter() - started)


async def _run(url: str, requests: int, concurrency: int, repeats: int) -> dict[str, Any]:
    schedule = WindowSchedule(1.0)
    config = GuardConfig(
        contracts=(Contract("acme", ContractClass.ASSURED, 60.0, floor=1_000_000_000),),
        schedule=schedule,
        slots=(concurrency,),
    )
    raw_store = RedisCreditStore(url, prefix="bench-raw")
    store = RedisCreditStore(url, prefix="bench-guard")
    floor = SharedFloor(
        store, policy=Unavailable.FAIL_STATIC, replicas=1, retry_s=1.0, clock=time.time
    )
    guard = Guard(config, learner=AlwaysAdmit(), store=floor)
    lease_store = RedisCreditStore(url, prefix="bench-lease")
    leases = SlotLeases(
        redis_lease_script(lease_store),
        backends=["http://bench"],
        capacity=[concurrency],
        replica="bench",
        waiting=lambda: 0,
    )
    raw, guarded, leased = [], [], []
    try:
        await _raw(raw_store, schedule, 200, concurrency)  # warm up: connections, scripts
        await _guarded(guard, floor, 200, concurrency)
        await _leased(leases, 200, concurrency)
        for _ in range(repeats):
            raw.append(await _raw(raw_store, schedule, requests, concurrency))
            guarded.append(await _guarded(guard, floor, requests, concurrency))
            leased.append(await _leased(leases, requests, concurrency))
    finally:
        await raw_store.aclose()
        await store.aclose()
        await lease_store.aclose()
    if floor.calls["redis_error"]:
        raise RuntimeError(f"Redis failed {floor.calls['redis_error']} calls during the bench")
    return {
        "decisions_per_s": max(guarded),
        "raw_evalsha_per_s": max(raw),
        "ratio": max(guarded) / max(raw),
        "decisions_per_s_runs": guarded,
        "raw_evalsha_per_s_runs": raw,
        "median_ratio": float(np.median(np.array(guarded) / np.array(raw))),
        "leased_starts_per_s": max(leased),
        "leased_ratio": max(leased) / max(raw),
        "leased_starts_per_s_runs": leased,
        "concurrency": concurrency,
        "requests_per_run": requests,
        "repeats": repeats,
    }


def bench_store(
    *,
    redis_url: str | None = None,
    requests: int = 6_000,
    concurrency: int = 32,
    repeats: int = 3,
) -> dict[str, Any]:
    if redis_url is not None:
        return asyncio.run(_run(redis_url, requests, concurrency, repeats))
    with LocalRedis() as server:
        return {**asyncio.run(_run(server.url, requests, concurrency, repeats)), "redis": "local"}
