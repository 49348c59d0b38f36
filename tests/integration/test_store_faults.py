"""The shared floor's own faults, each as a regression test against a real redis-server
(docs/replicas.md): a burst from one tenant, one slow call, a Redis that restarts empty inside a
window, the order and the uniqueness of the hand-back, and the fail-static windows of a
replica whose clock is off."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from floorguard.clock import WallClock
from floorguard.core.contract import WindowSchedule
from floorguard.rig.local_redis import LocalRedis, LocalSentinel
from floorguard.store.leases import (
    SlotLeases,
    handed_channel,
    lease_keys,
    pool_tag,
    redis_lease_script,
)
from floorguard.store.plan import run_plan, run_plan_async
from floorguard.store.redis_store import RedisCreditStore
from floorguard.store.shared import SharedFloor, Unavailable
from tests.redis_server import RedisServer


@pytest.fixture
def server(redis_server):
    return redis_server


@pytest.fixture
def kept():
    """A Redis that keeps its data across a kill and restart (unreachable, not lost)."""
    server = RedisServer(persistent=True).start()
    yield server
    server.close()


@pytest.fixture
def floors(loop):
    """Make shared floors over fresh stores (the server's defaults unless told); closed
    after the test on `loop`."""
    made = []

    def make(url, *, replicas=3, store_clock="server", store_options=None, **options):
        store = RedisCreditStore(
            url,
            clock=store_clock,
            **{
                "timeout_s": 0.05,
                "connect_timeout_s": 0.25,
                "max_connections": 64,
                "pool_timeout_s": 0.25,
                **(store_options or {}),
            },
        )
        made.append(store)
        options = {"retry_s": 0.5, "clock": time.time, **options}
        return SharedFloor(store, policy=Unavailable.FAIL_STATIC, replicas=replicas, **options)

    yield make
    for store in made:
        loop.run_until_complete(store.aclose())


def redis_now(url):
    with redis.Redis.from_url(url) as client:
        seconds, micros = client.time()
    return seconds + micros / 1e6


def mid_window(url):
    """An hour-long window whose middle is now on the Redis clock: no boundary in a test."""
    return WindowSchedule(3600.0, origin_at=redis_now(url) - 1800)


def used(url, tenant, prefix="floorguard"):
    with redis.Redis.from_url(url) as client:
        value = client.hget(f"{prefix}:{{{tenant}}}", "used")
    return int(value) if value is not None else 0


def take(loop, floor, tenant, n, schedule, now=None, capacity=6):
    async def go():
        at = time.time() if now is None else now
        grants = await asyncio.gather(
            *(floor.acquire_async(tenant, 1, capacity, schedule, at) for _ in range(n))
        )
        return [g.granted for g in grants]

    return loop.run_until_complete(go())


def test_one_tenants_burst_is_not_an_outage_for_another(server, floors, loop):
    """400 simultaneous requests from one tenant wait for the bounded pool instead of
    failing it: the floor stays shared, exactly B of the burst are granted, and another
    tenant's first request of the window is granted."""
    floor = floors(server.url, store_options={"max_connections": 16})
    schedule = mid_window(server.url)
    burst = take(loop, floor, "noisy", 400, schedule)
    assert sum(burst) == 6
    assert not floor.degraded and floor.calls["redis_error"] == 0
    assert take(loop, floor, "quiet", 1, schedule) == [True]
    assert used(server.url, "noisy") == 6 and used(server.url, "quiet") == 1


def test_one_slow_call_is_retried_not_an_outage(server, floors, loop):
    """Redis stalls for 70 ms (CLIENT PAUSE) with a 50 ms call timeout: the first attempt
    fails, the retry answers, and the floor never degrades."""
    floor = floors(server.url)
    schedule = mid_window(server.url)
    assert take(loop, floor, "acme", 1, schedule) == [True]  # connected, script loaded
    with redis.Redis.from_url(server.url) as admin:
        admin.execute_command("CLIENT", "PAUSE", 70)
    assert take(loop, floor, "acme", 1, schedule) == [True]
    assert floor.calls["failed_attempt"] >= 1 and floor.calls["redis_error"] == 0
    assert not floor.degraded and used(server.url, "acme") == 2


def test_a_redis_that_restarts_empty_inside_a_window_is_detected(server, floors, loop):
    """Two replicas grant 3 + 3 of B = 6; Redis restarts without its data inside the window.
    Each replica sees the tenant's new generation and re-forces its 3 before taking more, so
    the window grants nothing more: 6, not 12; both report `recovering` (Redis was away:
    others may still grant their fail-static shares), not degraded."""
    a, b = floors(server.url, replicas=2), floors(server.url, replicas=2)
    schedule = mid_window(server.url)
    assert take(loop, a, "acme", 3, schedule) == [True] * 3
    assert take(loop, b, "acme", 3, schedule) == [True] * 3
    server.kill()
    server.start()
    assert used(server.url, "acme") == 0  # the state is gone
    assert take(loop, a, "acme", 3, schedule) == [False] * 3
    assert take(loop, b, "acme", 3, schedule) == [False] * 3
    assert used(server.url, "acme") == 6
    assert a.calls["restored"] == 3 and b.calls["restored"] == 3
    assert a.state == b.state == "recovering"


def test_a_replica_that_never_called_for_a_tenant_finds_the_lost_state_too(server, floors, loop):
    """Replica A grants 6 of B = 6; Redis restarts empty; replica C never called for the
    tenant but learned its generation before serving (`learn_async`, as `serve` does at
    start): C's first takes find the lost state and the window stays closed. Without the
    learning C took the window afresh: 12 of B = 6."""
    a, c = floors(server.url, replicas=2), floors(server.url, replicas=2)
    schedule = mid_window(server.url)
    assert loop.run_until_complete(c.learn_async(["acme"], schedule, time.time())) == 0
    assert used(server.url, "acme") == 0  # a peek: nothing taken
    assert take(loop, a, "acme", 6, schedule) == [True] * 6
    server.kill()
    server.start()
    assert take(loop, c, "acme", 6, schedule) == [False] * 6
    assert c.calls["lost_state"] == 1 and c.state == "recovering"
    assert take(loop, a, "acme", 1, schedule) == [False]
    assert used(server.url, "acme") == 6  # A re-forced its 6


def test_the_hand_back_comes_before_the_take(kept, floors, loop):
    """While replica A is degraded it grants 2 locally in window 1; replica Z, shared, takes
    4 of B = 6 there. A's first call after Redis returns hands its 2 back *before* taking:
    4 + 2 = 6, so A's request is refused and the window holds 6 (take-then-hand-back would
    have granted it and left 7)."""
    a = floors(kept.url, store_clock="caller", replicas=3)
    z = floors(kept.url, store_clock="caller", replicas=3)
    schedule = WindowSchedule(1.0)
    assert take(loop, a, "acme", 1, schedule, now=0.1) == [True]
    kept.kill()
    assert take(loop, a, "acme", 1, schedule, now=0.2) == [False]  # onset window: nothing
    assert a.degraded
    assert take(loop, a, "acme", 2, schedule, now=1.1) == [True, True]  # ⌊6/3⌋ locally
    kept.start()
    assert take(loop, z, "acme", 4, schedule, now=1.2) == [True] * 4
    assert take(loop, a, "acme", 1, schedule, now=1.7) == [False]
    assert not a.degraded and a.calls["lost_state"] == 0  # Redis kept its state
    assert z.store.remaining("acme", 6, schedule, 1.8) == 0  # 4 + 2 handed back, no more


def test_two_successes_at_recovery_hand_back_the_local_grants_once(server, floors, loop):
    """Two concurrent requests are the first to reach Redis again: only one carries the
    2 local grants, so the window holds 2, not 2 + 2, and the other waits for that hand-back
    before its own take. (Both are refused: while the fleet recovers, 6 − 2·⌊6/3⌋ leaves
    room for no more than the 2 handed back.)"""
    a = floors(server.url, store_clock="caller", replicas=3)
    schedule = WindowSchedule(1.0)
    server.kill()
    take(loop, a, "acme", 1, schedule, now=0.2)  # degraded (onset window)
    assert take(loop, a, "acme", 2, schedule, now=1.1) == [True, True]
    server.start()
    # the one not carrying the 2 waits for the one that does, so Redis counts them first
    assert take(loop, a, "acme", 2, schedule, now=1.7) == [False, False]
    assert a.store.remaining("acme", 6, schedule, 1.8) == 4
    assert not a.degraded and a.state == "recovering"


def test_other_tenants_local_grants_are_handed_back_at_recovery(server, floors, loop):
    """Recovery through one tenant's call also hands back every other tenant's local
    grants of the window."""
    a = floors(server.url, store_clock="caller", replicas=3)
    schedule = WindowSchedule(1.0)
    server.kill()
    take(loop, a, "acme", 1, schedule, now=0.2)
    assert take(loop, a, "globex", 2, schedule, now=1.1) == [True, True]
    server.start()
    assert take(loop, a, "acme", 1, schedule, now=1.7) == [True]
    assert a.store.remaining("globex", 6, schedule, 1.8) == 4


def test_the_redis_clock_offset_is_measured_while_shared(server, floors, loop):
    """A replica whose clock runs 0.5 s ahead measures its offset from the Redis clock on
    every answer; its fail-static windows then follow Redis, not its own clock."""
    skewed = floors(server.url, clock=lambda: time.time() + 0.5)
    schedule = mid_window(server.url)
    take(loop, skewed, "acme", 1, schedule, now=time.time() + 0.5)
    assert skewed.offset_s == pytest.approx(-0.5, abs=0.05)
    assert skewed.status()["clock_offset_s"] == skewed.offset_s


@pytest.mark.parametrize("kind", ["cluster", "sentinel"])
def test_cluster_and_sentinel_urls_share_the_floor(kind, loop):
    """`redis+cluster://` (a one-node Redis Cluster: the script's two keys must share a
    hash slot, or Redis refuses it) and `redis+sentinel://` (the master a Sentinel names)
    share one floor across two replicas like a plain URL."""
    probe = RedisServer()  # skips without redis-server
    probe.close()
    master = LocalRedis(probe.binary, cluster=kind == "cluster").start()
    sentinel = LocalSentinel(master).start() if kind == "sentinel" else None
    url = sentinel.url if sentinel else master.url
    stores = [RedisCreditStore(url, timeout_s=0.5) for _ in range(2)]
    try:
        floors = [
            SharedFloor(s, policy=Unavailable.FAIL_STATIC, replicas=2, retry_s=1, clock=time.time)
            for s in stores
        ]
        with redis.Redis(port=master.port) as client:
            seconds, micros = client.time()
        schedule = WindowSchedule(3600.0, origin_at=seconds + micros / 1e6 - 1800)
        grants = [take(loop, floors[i % 2], "acme", 1, schedule)[0] for i in range(8)]
        assert grants == [True] * 6 + [False] * 2
        assert not any(f.degraded for f in floors)
        with redis.Redis(port=master.port) as client:
            assert int(client.hget("floorguard:{acme}", "used")) == 6
    finally:
        for s in stores:
            loop.run_until_complete(s.aclose())
        if sentinel:
            sentinel.close()
        master.close()


def _leases(url, replica, capacity=2, ttl_s=2.0, waiting=lambda: 0):
    store = RedisCreditStore(url, timeout_s=0.2)
    return store, SlotLeases(
        redis_lease_script(store),
        backends=["http://vllm:8000"],
        capacity=[capacity],
        replica=replica,
        ttl_s=ttl_s,
        waiting=waiting,
    )


def test_slot_leases_bound_the_fleet_and_hand_freed_slots_over_assured_first(server, loop):
    """C = 2 leases fleet-wide: a third start waits (`full`); while replica A has a
    floor-entitled request waiting, replica B may not start an opportunistic request there
    (`order`). Released slots are handed over in the release's own call, entitled waiters
    first: B's release hands its slot to A, whose waiting request then starts on it with
    one call that renews the handed lease (its renewal found the slot; a subscriber hears
    it at once, below); A's release hands its slot to B's waiting opportunistic request."""
    (sa, a), (sb, b) = _leases(server.url, "A"), _leases(server.url, "B")
    run = loop.run_until_complete
    try:
        assert run(a.acquire_async(0, "a1", entitled=False)) == ""
        assert run(b.acquire_async(0, "b1", entitled=False)) == ""
        assert run(a.acquire_async(0, "a2", entitled=True)) == "full"  # and A now waits
        assert run(b.acquire_async(0, "b2", entitled=False)) == "order"  # A's entitled waits
        run(b.release_async(0, "b1"))  # its slot goes to A, in the same call
        assert _members(server.url) == ["A|a1", "A|handed"]
        run(_renew(a))  # A finds the slot handed to it (no subscriber in this test)
        calls = a._seq
        assert run(a.acquire_async(0, "a2", entitled=True)) == ""
        assert a._seq == calls + 1  # taken with one call (the handed lease renewed)
        assert run(b.acquire_async(0, "b3", entitled=False)) == "full"  # B waits again
        run(a.release_async(0, "a1"))  # A waits for nothing: its slot goes to B
        assert _members(server.url) == ["A|handed", "B|handed"]
        run(_renew(b))
        assert run(b.acquire_async(0, "b3", entitled=False)) == ""  # the board let it
        assert a.denied == {"full": 1, "order": 0} and b.denied == {"full": 1, "order": 1}
        assert a.handed == {"in": 1, "used": 1, "passed_on": 0} and b.handed["used"] == 1
    finally:
        run(sa.aclose())
        run(sb.aclose())


def _members(url):
    """The backend's leases, each without its number (`<replica>|<request or handed>`)."""
    with redis.Redis.from_url(url) as client:
        stored = client.zrange(
            lease_keys("floorguard", pool_tag(None), "http://vllm:8000")[0], 0, -1
        )
    return sorted(m.decode().rsplit("|", 1)[0] for m in stored)


def test_a_handed_slot_is_heard_at_once_by_a_subscriber(server, loop):
    """A's subscriber (what `serve` runs: `RedisCreditStore.subscribe` on its channel)
    hears the slot B's release hands it, before any renewal: `on_handed` is called with
    the backend, and A's waiting request starts on it without a call."""
    heard = []
    store_a, a = _leases(server.url, "A", capacity=1)
    a.on_handed = heard.append
    sb, b = _leases(server.url, "B", capacity=1)
    run = loop.run_until_complete

    async def scenario():
        channel = handed_channel(store_a, "A")
        listening = asyncio.ensure_future(
            store_a.subscribe(channel, lambda m: a.on_message(*m.split(" ", 1)), asyncio.sleep)
        )
        await asyncio.sleep(0.2)  # subscribed
        assert await b.acquire_async(0, "b1", entitled=False) == ""
        assert await a.acquire_async(0, "a1", entitled=True) == "full"
        await b.release_async(0, "b1")
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.01)
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)

    try:
        run(scenario())
        assert heard == [0]
        calls = a._seq
        assert run(a.acquire_async(0, "a1", entitled=True)) == "" and a._seq == calls + 1
    finally:
        run(store_a.aclose())
        run(sb.aclose())


@pytest.mark.parametrize("late", [False, True], ids=["in_order", "grant_runs_late"])
def test_an_entitled_request_queued_while_another_takes_its_lease_holds_others_back(
    server, loop, late
):
    """Replica A's entitled a1 takes a lease; its call carries A's count without a1 (0).
    Entitled a2 queues while the call is out: A announces a2, though a1 counts as waiting
    (the announcement once waited for A's first). a1's call is granted, in order or after
    the announcement (another connection): either way A's board entry must still show a2,
    and B's opportunistic request is held back (`order`). Without the announcement, or
    with a late call's count standing over a newer one's, a1's grant cleared the entry.
    `waiting` stands for the guard's count (`num_waiting_entitled`): a1 waits from the
    moment the guard chose it until its lease is answered."""
    waiting = [1]  # a1, chosen by the guard
    (sa, a) = _leases(server.url, "A", waiting=lambda: waiting[0])
    (sb, b) = _leases(server.url, "B")
    run = loop.run_until_complete
    script = a._script()

    def answer(plan, call):
        return run_plan(plan, lambda c: run(script(c)), answer=run(script(call)))

    try:
        taking = a.plan_acquire(0, "a1", entitled=True)
        sent = next(taking)  # a1's call is out
        assert sent.waiting == 0  # the others: the script counts a1 if it is denied
        waiting[0] = 2  # a2 is queued
        announcing = a.plan_announce()
        announcement = next(announcing, None)
        assert announcement is not None and announcement.waiting == 2  # a1 and a2
        if late:
            answer(announcing, announcement)
            assert answer(taking, sent) == ""
        else:
            assert answer(taking, sent) == ""
            answer(announcing, announcement)
        assert run(b.acquire_async(0, "b1", entitled=False)) == "order"
    finally:
        run(sa.aclose())
        run(sb.aclose())


def test_a_dead_replicas_leases_expire_within_the_ttl(server, loop):
    """Replica A takes both leases and dies (no renewal): within ttl_s the slots are free
    for replica B; a replica that keeps renewing keeps its lease past the ttl."""
    (sa, a), (sb, b) = _leases(server.url, "A", ttl_s=0.4), _leases(server.url, "B", ttl_s=0.4)
    run = loop.run_until_complete
    try:
        assert run(b.acquire_async(0, "b0", entitled=False)) == ""
        assert run(a.acquire_async(0, "a1", entitled=False)) == ""
        assert run(a.acquire_async(0, "a2", entitled=False)) == "full"

        async def renewing_for(seconds):
            task = asyncio.ensure_future(b.renew_every(WallClock()))
            await asyncio.sleep(seconds)
            task.cancel()

        run(renewing_for(0.6))  # A is silent: its lease expires; B renews its own
        assert run(b.acquire_async(0, "b1", entitled=False)) == ""  # a1's slot came back
        assert run(b.acquire_async(0, "b2", entitled=False)) == "full"  # b0 is still held
    finally:
        run(sa.aclose())
        run(sb.aclose())


def test_leases_keep_the_slots_held_while_redis_is_down_and_restore_them(server, loop):
    """Redis killed while replica A holds 2 of C = 4 leases: A grants locally only while it
    holds fewer than those 2 (it reuses its own slots; the other replicas may hold the rest,
    so a partition share would overshoot C), gives them back locally, and once Redis
    answers again puts every lease it holds back in it (a restarted Redis is empty), and
    keeps to its 2 for two renewals more: a replica leasing from the count at once after
    Redis returned filled a 6-slot backend with 10 in a chaos run (the others' leases not
    yet put back)."""
    store, leases = _leases(server.url, "A", capacity=4)
    run = loop.run_until_complete
    try:
        assert [run(leases.acquire_async(0, f"a{i}", entitled=True)) for i in range(2)] == ["", ""]
        server.kill()
        assert run(leases.acquire_async(0, "a2", entitled=True)) == "full"  # holds its 2
        run(leases.release_async(0, "a0"))  # Redis still down: released locally, no hang
        assert run(leases.acquire_async(0, "a3", entitled=False)) == ""  # a0's slot, reused
        assert run(leases.acquire_async(0, "a4", entitled=False)) == "full"
        assert leases.local_grants == 1 and leases.status()["degraded"]
        server.start()
        renew = leases.plan_renew
        run(run_plan_async(renew(), leases.script))  # finds Redis back: puts a1, a3 back
        assert leases.status()["recovering"] and not leases.status()["degraded"]
        assert _members(server.url) == ["A|a1", "A|a3"]
        # it keeps to its 2 until every replica has had a renewal to put back its own (the
        # count misses theirs till then): two renewals more
        assert run(leases.acquire_async(0, "a5", entitled=False)) == "full"
        for _ in range(2):
            run(run_plan_async(renew(), leases.script))
        assert not leases.status()["recovering"]
        assert run(leases.acquire_async(0, "a5", entitled=False)) == ""
        assert _members(server.url) == ["A|a1", "A|a3", "A|a5"]
    finally:
        run(store.aclose())


def test_a_renewal_puts_back_the_leases_a_quick_restart_lost(server, loop):
    """Redis restarts empty between two of replica A's calls (no call of A's fails, so A
    never falls back): A's 2 requests still run on C = 2. Its next renewal puts their
    leases back (`put_back`), and replica B is refused `full` again. Renewing only the
    leases Redis still held (as before), B was granted a slot A's requests were running
    on: 3 on a backend of 2, until A's requests ended."""
    (sa, a), (sb, b) = _leases(server.url, "A"), _leases(server.url, "B")
    fresh = RedisCreditStore(server.url, timeout_s=0.2)  # no pooled connection broken by
    run = loop.run_until_complete  # the restart: no call of A's fails
    try:
        assert [run(a.acquire_async(0, f"a{i}", entitled=True)) for i in range(2)] == ["", ""]
        server.kill()
        server.start()
        a.script = redis_lease_script(fresh)
        run(run_plan_async(a.plan_renew(), a.script))
        assert a.put_back == 2 and not a.status()["degraded"]
        assert _members(server.url) == ["A|a0", "A|a1"]
        assert run(b.acquire_async(0, "b0", entitled=True)) == "full"
    finally:
        run(sa.aclose())
        run(sb.aclose())
        run(fresh.aclose())


class LateReplies:
    """A TCP proxy in front of Redis on the test's loop that holds back the next
    `hold` replies by `delay_s`: Redis has run the call when the caller gives up on it."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.hold = 0
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> LateReplies:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _pipe(self, reader, writer) -> None:
        self._tasks.append(asyncio.current_task())
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [writer, up_writer]

        async def copy(src, dst, late: bool) -> None:
            try:
                while data := await src.read(65536):
                    if late and self.hold > 0:
                        self.hold -= 1
                        await asyncio.sleep(self.delay_s)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer, False), copy(up_reader, writer, True))

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(w.wait_closed() for w in self._writers), return_exceptions=True)
        await self._server.wait_closed()


def test_a_take_whose_reply_came_too_late_is_charged_once(server, floors, loop):
    """A floor take that timed out (50 ms) after Redis had run it was retried and
    charged again, so an assured request inside its floor was refused. Through a proxy that
    holds Redis's replies 120 ms, each of B = 4 takes times out once after Redis ran it; the
    retries get their first answers: all four granted, Redis counts 4, a fifth is refused."""
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    proxy = loop.run_until_complete(LateReplies(port, 0.12).start())
    floor = floors(f"redis://127.0.0.1:{proxy.port}", replicas=1)
    schedule = mid_window(server.url)
    assert take(loop, floor, "warm", 1, schedule) == [True]  # connected, script loaded
    granted = []
    for _ in range(4):
        proxy.hold = 1
        granted += take(loop, floor, "acme", 1, schedule, capacity=4)
    assert granted == [True] * 4
    assert floor.calls["replayed"] == 4 and not floor.degraded
    assert used(server.url, "acme") == 4
    assert take(loop, floor, "acme", 1, schedule, capacity=4) == [False]
    loop.run_until_complete(floor.store.aclose())
    loop.run_until_complete(proxy.close())


def test_a_lease_whose_grant_came_too_late_is_answered_once(server, loop):
    """A lease acquire (C = 1) that timed out (200 ms) after Redis granted it is sent again
    naming the same lease: the script answers its first grant. Without that the retry
    found the backend full, with its own lease, and the request waited for itself."""
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    proxy = loop.run_until_complete(LateReplies(port, 0.3).start())
    store, leases = _leases(f"redis://127.0.0.1:{proxy.port}", "A", capacity=1)
    run = loop.run_until_complete
    try:
        run(_renew(leases))  # connected, script loaded
        proxy.hold = 1
        assert run(leases.acquire_async(0, "a1", entitled=True)) == ""
        assert leases.retried == 1 and not leases.status()["degraded"]
        assert len(_members(server.url)) == 1
        run(leases.release_async(0, "a1"))
        assert len(_members(server.url)) == 0
    finally:
        run(store.aclose())
        run(proxy.close())


def test_a_lease_granted_by_redis_but_never_answered_is_given_back(server, loop):
    """Both attempts of A's acquire (C = 1) time out after Redis granted them: A cannot
    know, takes it as an outage (it held nothing, so it grants nothing locally) and
    releases that lease on the next call Redis answers. Without it the slot stayed taken
    by no request until the lease's ttl (2 s), and B was refused `full`."""
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    proxy = loop.run_until_complete(LateReplies(port, 0.3).start())
    store, a = _leases(f"redis://127.0.0.1:{proxy.port}", "A", capacity=1)
    sb, b = _leases(server.url, "B", capacity=1)
    run = loop.run_until_complete
    try:
        run(_renew(a))  # connected, script loaded
        proxy.hold = 2
        assert run(a.acquire_async(0, "a1", entitled=True)) == "full"
        assert a.status()["in_doubt"] == 1 and len(_members(server.url)) == 1
        run(asyncio.sleep(0.4))  # the late replies are through
        run(_renew(a))
        assert a.status()["in_doubt"] == 0 and not a.status()["degraded"]
        assert len(_members(server.url)) == 0
        assert run(b.acquire_async(0, "b1", entitled=False)) == ""
    finally:
        run(store.aclose())
        run(sb.aclose())
        run(proxy.close())


async def _renew(leases):
    await run_plan_async(leases.plan_renew(), leases._script())


def test_a_release_that_failed_is_sent_again_when_redis_answers(kept, loop):
    """A Redis that keeps its data is down when A's request ends: the release fails, and A
    sends it again once Redis answers. Without it the lease outlived its request until
    its ttl, the backend's slot idle."""
    store, a = _leases(kept.url, "A", capacity=1)
    run = loop.run_until_complete
    try:
        assert run(a.acquire_async(0, "a1", entitled=False)) == ""
        kept.kill()
        run(a.release_async(0, "a1"))
        assert a.status()["in_doubt"] == 1
        kept.start()
        assert len(_members(kept.url)) == 1  # kept across the restart
        run(_renew(a))
        assert len(_members(kept.url)) == 0 and a.status()["in_doubt"] == 0
    finally:
        run(store.aclose())


def _promoted_behind(master, replica, synced):
    """`replica` follows `master` until `synced(client)` holds, then is promoted (REPLICAOF
    NO ONE): it misses what the master writes next, as a replica behind at a failover does
    (replication is asynchronous)."""
    with redis.Redis(port=master.port) as source:
        source.config_set("repl-diskless-sync-delay", 0)  # not 5 s, waiting for more replicas
    with redis.Redis(port=replica.port) as behind:
        behind.replicaof("127.0.0.1", master.port)
        deadline = time.monotonic() + 10
        while not synced(behind):
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.02)
        behind.replicaof("no", "one")


def test_a_failover_to_a_replica_that_missed_takes_never_grants_past_b():
    """A replica of the floor's Redis has the tenant's count at 1 of B = 3 when it stops
    following; the master grants 2 more, then the fleet fails over to that replica, which
    carries the same token and a count of 1. Its marker names the old master
    (generation.lua), so the first call that meets it closes the tenant's window, whoever
    sends it: here a replica started after the failover (it has seen no generation), then
    the one that granted the 3. Before, the fleet granted 5 of B = 3."""
    # the replica with an append-only file, as a restart's is trusted
    master, replica = LocalRedis().start(), LocalRedis(persistent=True).start()
    try:
        schedule = WindowSchedule(600.0)  # one window for the whole test
        lost: list[tuple[str, int]] = []

        def replica_on(url):
            return SharedFloor(RedisCreditStore(url), policy=Unavailable.FAIL_STATIC,
                               replicas=2, retry_s=1.0, clock=time.time,
                               on_lost_state=lambda key, window, _: lost.append((key, window)))  # fmt: skip  # noqa: E501

        floor = replica_on(master.url)
        floor.learn(["acme"], schedule, time.time())
        assert floor.acquire("acme", 1, 3, schedule, time.time()).granted
        _promoted_behind(master, replica, lambda r: r.hget("floorguard:{acme}", "used") == b"1")
        granted = sum(floor.acquire("acme", 1, 3, schedule, time.time()).granted for _ in range(3))
        assert granted == 2  # the master: 3 of 3
        later = replica_on(replica.url)  # started after the failover
        later.learn(["acme"], schedule, time.time())
        floor.store = RedisCreditStore(replica.url)  # the failover
        after = sum(
            f.acquire("acme", 1, 3, schedule, time.time()).granted
            for f in (later, floor)
            for _ in range(3)
        )
        assert 1 + granted + after <= 3, f"{1 + granted + after} granted with B = 3"
        window = schedule.index_at(time.time())
        assert set(lost) == {("acme", window)} and len(lost) == 2  # each replica logs it
    finally:
        master.close()
        replica.close()


def test_a_restart_from_a_snapshot_that_missed_takes_never_grants_past_b():
    """Redis saves a snapshot at 1 of B = 3, grants 2 more, dies and comes back from the
    snapshot: the count says 1 under the same token. The marker names the server before the
    restart and this one has no append-only file, so the window is closed (before, 5 of 3).
    A restart with an append-only file keeps its generation (`-k hand_back_comes_before`)."""
    server = LocalRedis().start()
    try:
        schedule = WindowSchedule(600.0)
        floor = SharedFloor(RedisCreditStore(server.url), policy=Unavailable.FAIL_STATIC,
                            replicas=1, retry_s=0.01, clock=time.time)  # fmt: skip
        floor.learn(["acme"], schedule, time.time())
        assert floor.acquire("acme", 1, 3, schedule, time.time()).granted
        with redis.Redis(port=server.port) as client:
            client.save()
        granted = sum(floor.acquire("acme", 1, 3, schedule, time.time()).granted for _ in range(3))
        assert granted == 2
        server.kill()
        server.start()  # from the snapshot
        time.sleep(0.02)  # past retry_s: the floor asks Redis again
        after = sum(floor.acquire("acme", 1, 3, schedule, time.time()).granted for _ in range(3))
        assert 1 + granted + after <= 3, f"{1 + granted + after} granted with B = 3"
        assert floor.calls["lost_state"] == 1
    finally:
        server.close()


def test_a_failover_to_a_replica_that_missed_leases_never_leases_past_c(loop):
    """C = 2: the replica stops following with one of A's leases, A takes the second on
    the master, and the fleet fails over. B, started after the failover (no generation
    seen), asks for a slot: the pool's marker names the old master, so every acquire is
    refused `lost` while the pool recovers, and B keeps to what it holds (nothing) instead
    of a third lease. A's renewal meets the new generation and puts both its leases back."""
    # the replica with an append-only file, as a restart's is trusted
    master, replica = LocalRedis().start(), LocalRedis(persistent=True).start()
    (sa, a), (sb, b) = _leases(master.url, "A", ttl_s=30.0), _leases(replica.url, "B", ttl_s=30.0)
    key = lease_keys("floorguard", pool_tag(None), "http://vllm:8000")[0]
    run = loop.run_until_complete
    try:
        assert run(a.acquire_async(0, "a1", entitled=False)) == ""
        _promoted_behind(master, replica, lambda r: r.zcard(key) == 1)
        assert run(a.acquire_async(0, "a2", entitled=False)) == ""
        a.script = b.script  # the failover
        assert run(b.acquire_async(0, "b1", entitled=True)) != "", "a third lease with C = 2"
        assert b.status()["degraded"] or b.status()["recovering"]
        run(_renew(a))
        assert _members(replica.url) == ["A|a1", "A|a2"]
    finally:
        run(sa.aclose())
        run(sb.aclose())
        master.close()
        replica.close()
