"""The Redis credit store against a real redis-server: windows from the server's clock
(skewed replicas share them), atomic take-if-fits under concurrency, keys that expire, and
the shared floor's fallback policies when Redis is killed and restarted."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
import redis

from floorguard.bench.store import bench_store
from floorguard.core.contract import WindowSchedule
from floorguard.store.redis_store import RedisCreditStore
from floorguard.store.shared import SharedFloor, Unavailable


@pytest.fixture
def server(redis_server):
    return redis_server


@pytest.fixture
def stores(loop):
    """Make stores; all are closed after the test (their asyncio clients on `loop`)."""
    made = []

    def make(url, **options):
        made.append(RedisCreditStore(url, **options))
        return made[-1]

    yield make
    for store in made:
        loop.run_until_complete(store.aclose())


def redis_now(url):
    with redis.Redis.from_url(url) as client:
        seconds, micros = client.time()
    return seconds + micros / 1e6


def test_the_window_comes_from_the_redis_clock_and_skewed_replicas_share_it(server, stores):
    schedule = WindowSchedule(3600.0, origin_at=redis_now(server.url) - 1800)  # mid-window
    replicas = [stores(server.url) for _ in range(3)]
    skews = [0.0, -7200.0, 1e6]  # their own clocks disagree by hours
    grants = [replicas[i % 3].acquire("acme", 1, 4, schedule, skews[i % 3]) for i in range(9)]
    assert [g.granted for g in grants] == [True] * 4 + [False] * 5
    expected = math.floor((redis_now(server.url) - schedule.origin_at) / schedule.window_s)
    assert {g.window_index for g in grants} == {expected}
    with redis.Redis.from_url(server.url) as client:
        ttl_ms = client.pttl("floorguard:{acme}")
    assert 1_000 < ttl_ms <= 1_801_000  # expires a second after its window ends


def test_take_if_fits_is_atomic_under_concurrent_replicas(server):
    schedule = WindowSchedule(3600.0, origin_at=redis_now(server.url) - 1800)
    granted = []

    def replica():
        store = RedisCreditStore(server.url)
        granted.append(sum(store.acquire("acme", 1, 60, schedule, 0).granted for _ in range(50)))
        store.close()

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 60  # 200 attempts, exactly B granted


def test_async_calls_share_the_count_with_blocking_ones(server, stores, loop):
    store = stores(server.url, clock="caller")
    schedule = WindowSchedule(1.0)

    async def four_at_once():
        return await asyncio.gather(
            *(store.call_async("acme", 2, 7, schedule, 5.5) for _ in range(4))
        )

    results = loop.run_until_complete(four_at_once())
    assert sum(r.grant.granted for r in results) == 3  # 3 × 2 ≤ 7
    assert store.remaining("acme", 7, schedule, 5.9) == 1


def _floor(stores, server, policy, replicas=3):
    store = stores(server.url, clock="caller", timeout_s=0.2)
    return SharedFloor(store, policy=policy, replicas=replicas, retry_s=0.5, clock=lambda: 0.0)


def _take(loop, floor, now, n=1, capacity=6):
    schedule = WindowSchedule(1.0)

    async def go():
        return [
            (await floor.acquire_async("acme", 1, capacity, schedule, now)).granted
            for _ in range(n)
        ]

    return loop.run_until_complete(go())


def test_fail_static_grants_floor_b_over_n_from_the_next_window_and_recovers(server, stores, loop):
    floor = _floor(stores, server, Unavailable.FAIL_STATIC)
    assert _take(loop, floor, 0.1, 2) == [True, True]
    server.kill()
    assert _take(loop, floor, 0.2, 3) == [False] * 3  # the window Redis was lost in: nothing
    assert floor.degraded and floor.calls["redis_error"] == 1  # retried only after retry_s
    assert _take(loop, floor, 1.1, 3) == [True, True, False]  # ⌊6/3⌋ = 2 per replica
    server.start()  # empty: the window Redis lost its state in is closed to fresh takes
    assert _take(loop, floor, 1.7, 1) == [False]
    assert not floor.degraded and floor.calls["lost_state"] == 1
    shared = stores(server.url, clock="caller")
    assert shared.remaining("acme", 6, WindowSchedule(1.0), 1.8) == 4  # the 2 handed back
    assert _take(loop, floor, 2.1, 1) == [True]  # the next window is shared as usual
    assert shared.remaining("acme", 6, WindowSchedule(1.0), 2.2) == 5


@pytest.mark.parametrize(
    ("policy", "expected"),
    [(Unavailable.FAIL_OPEN, [True] * 6 + [False]), (Unavailable.FAIL_CLOSED, [False] * 7)],
)
def test_fail_open_grants_all_of_b_locally_fail_closed_none(server, stores, loop, policy, expected):
    floor = _floor(stores, server, policy)
    server.kill()
    assert _take(loop, floor, 0.1, 7) == expected


def test_an_unreachable_redis_never_hangs_the_call(server, stores, loop):
    floor = _floor(stores, server, Unavailable.FAIL_STATIC)
    server.kill()
    started = time.monotonic()
    _take(loop, floor, 0.1, 20)
    assert time.monotonic() - started < 2  # one failed call, then the fallback until retry_s


def test_bench_store_measures_both_sides_against_one_redis(server):
    """`floorguard bench store` runs (its figures are for docs/benchmarks.md, not asserted)."""
    result = bench_store(redis_url=server.url, requests=64, concurrency=8, repeats=2)
    assert len(result["decisions_per_s_runs"]) == len(result["raw_evalsha_per_s_runs"]) == 2
    assert min(result["decisions_per_s_runs"] + result["raw_evalsha_per_s_runs"]) > 0
    with redis.Redis.from_url(server.url) as client:  # both sides really went through Redis
        assert int(client.hget("bench-guard:{acme}", "used")) >= 1  # (this window's count)
        assert int(client.hget("bench-raw:{raw}", "used")) >= 1


def test_the_synchronous_path_degrades_and_hands_back_the_same_way(server, stores):
    """The core's own store calls (no grant handed in) follow the same policy."""
    floor = _floor(stores, server, Unavailable.FAIL_STATIC)
    schedule = WindowSchedule(1.0)
    assert floor.acquire("acme", 1, 6, schedule, 0.1).granted
    server.kill()
    assert not floor.acquire("acme", 1, 6, schedule, 0.2).granted  # the onset window
    assert [floor.acquire("acme", 1, 6, schedule, 1.1).granted for _ in range(3)] == [
        True,
        True,
        False,
    ]
    server.start()  # empty: window 1 is closed, the 2 local grants are handed back
    assert not floor.acquire("acme", 1, 6, schedule, 1.7).granted and not floor.degraded
    assert floor.store.remaining("acme", 6, schedule, 1.8) == 4
    assert floor.acquire("acme", 1, 6, schedule, 2.1).granted
