"""The live fleet (design §14) against a real redis-server: replicas announce themselves, the
count follows joins, departures and expiries, a joiner waits until the others settle to
the grown count, and a replica without Redis keeps the count it last heard."""

from __future__ import annotations

import asyncio

import pytest
import redis

from floorguard.store.members import Membership, View, others_settled, parse_members
from floorguard.store.redis_store import RedisCreditStore


@pytest.fixture
def fleet(redis_server, loop):
    """Make members of one fleet over fresh stores; each records the counts it followed."""
    stores = []

    def make(name, *, ttl_s=0.6, configured=1, explicit=False, settled=lambda: True):
        store = RedisCreditStore(redis_server.url, timeout_s=0.2, connect_timeout_s=0.2)
        stores.append(store)
        followed: list[int] = []
        member = Membership(
            store,
            replica=name,
            ttl_s=ttl_s,
            configured=configured,
            explicit=explicit,
            on_count=followed.append,
            settled=settled,
        )
        return member, followed

    yield make
    for store in stores:
        loop.run_until_complete(store.aclose())


def test_the_count_follows_joins_leaves_and_expiry(fleet, loop):
    run = loop.run_until_complete
    (a, a_followed), (b, _), (c, _) = fleet("a"), fleet("b"), fleet("c")
    assert run(a.beat()) and a.count == 1 and a_followed == []  # 1 = the configured count
    assert run(b.beat()) and b.count == 2
    assert run(c.beat()) and c.count == 3
    assert run(a.beat()) and a.count == 3 and a_followed == [3]
    assert sorted(a.members) == ["a", "b", "c"]
    run(c.leave())  # a drained replica is gone at once
    assert run(a.beat()) and a.count == 2 and a_followed == [3, 2]
    run(_beating([a], 0.9))  # b stops beating (it died): gone after its ttl
    assert run(a.beat()) and a.count == 1 and sorted(a.members) == ["a"]
    assert a_followed == [3, 2, 1]


async def _beating(members, seconds: float) -> None:
    """`members` beat every 0.15 s (a quarter of the tests' ttl) for `seconds`."""
    for _ in range(round(seconds / 0.15)):
        for member in members:
            await member.beat()
        await asyncio.sleep(0.15)


def test_a_live_count_that_differs_from_the_configured_one_is_a_warning(fleet, loop):
    run = loop.run_until_complete
    (a, _), (b, _) = fleet("a", configured=3, explicit=True), fleet("b")
    assert a.warning is None  # not heard from the fleet yet: the configured count governs
    run(a.beat())
    assert a.count == 1 and "1 replica(s) live, but store.replicas says 3" in a.warning
    run(b.beat())
    run(a.beat())
    assert a.count == 2 and a.status()["warning"] is not None
    unset, _ = fleet("c")  # no count configured: nothing to disagree with
    run(unset.beat())
    assert unset.warning is None and unset.count == 3


def test_a_joiner_waits_until_the_others_settle_to_the_grown_count(fleet, loop):
    """`a` has more in flight than its share after `b` joins: `b`'s join waits until `a`
    applies the count of 2 and fits it (it beats again), then returns True."""
    run = loop.run_until_complete
    busy = [True]
    a, _ = fleet("a", ttl_s=0.6, settled=lambda: not busy[0])
    b, _ = fleet("b", ttl_s=0.6)
    run(a.beat())

    async def scenario():
        joined = asyncio.ensure_future(b.join())
        await asyncio.sleep(0.1)
        await a.beat()  # a now applies 2 but is still over its share
        await asyncio.sleep(0.1)
        assert not joined.done()
        busy[0] = False  # its extra request ended
        await a.beat()
        return await asyncio.wait_for(joined, 1.0)

    assert run(scenario()) is True
    assert b.count == 2 and a.count == 2


def test_a_joiner_does_not_wait_forever_for_a_replica_that_never_settles(fleet, loop):
    run = loop.run_until_complete
    a, _ = fleet("a", ttl_s=0.3, settled=lambda: False)
    b, _ = fleet("b", ttl_s=0.3)
    run(a.beat())

    async def scenario():
        beating = asyncio.ensure_future(a.beat_every())  # a stays live, never settled
        try:
            return await b.join()
        finally:
            beating.cancel()

    assert run(scenario()) is False  # waited 2 · ttl_s, then serves on its own share
    assert b.count == 2


def test_without_redis_the_count_stays_what_it_last_was(fleet, loop, redis_server):
    run = loop.run_until_complete
    (a, followed), (b, _) = fleet("a"), fleet("b")
    run(b.beat())
    run(a.beat())
    assert a.count == 2
    redis_server.kill()
    assert run(a.beat()) is False and a.count == 2 and a.failures == 1
    assert followed == [2]


def test_the_reply_parses_into_views():
    roll = parse_members([b"12.5", [b"a", b"3|1|13.1", b"b", b"2|0|13.0"], [b"c"], 1])
    views = roll.views
    assert views == {"a": View(3, True), "b": View(2, False)}
    assert roll.expiries == {"a": 13.1, "b": 13.0} and roll.left == {"c"} and roll.now == 12.5
    assert not others_settled(views, "a", 3)  # b applies 2 and is over its share
    assert others_settled(views, "b", 3)  # a applies 3 and fits
    assert others_settled({"me": View(1, False)}, "me", 5)  # alone: nothing to wait for


def _three(fleet, loop, ttl_s=0.6):
    run = loop.run_until_complete
    members = [fleet(name, ttl_s=ttl_s)[0] for name in "abc"]
    for _ in range(2):
        for member in members:
            assert run(member.beat())
    assert [m.count for m in members] == [3, 3, 3]
    return members


@pytest.mark.parametrize("fault", ["restart", "flush", "evict", "flush-then-quiet"])
def test_a_store_that_forgets_the_fleet_is_not_a_fleet_of_one(fleet, loop, redis_server,
                                                              fault):  # fmt: skip
    """After a Redis restart without persistence, a FLUSHALL or an evicted
    member key, each of three replicas counted "1 replica(s) live" and took a whole
    backend. A member missing before its time ran out is one the store forgot; so is every
    member when the store forgot this replica's own entry (whatever their expiries): still
    counted, and back in the roll once they beat again."""
    run = loop.run_until_complete
    a, b, c = _three(fleet, loop)
    with redis.Redis.from_url(redis_server.url) as admin:
        if fault == "restart":
            redis_server.kill()
            redis_server.start()
        elif fault == "flush":
            admin.flushall()
        elif fault == "flush-then-quiet":  # nobody beats until every expiry has passed
            admin.flushall()
            run(asyncio.sleep(0.7))
        else:
            admin.delete(*admin.keys("floorguard:fleet:*"))
    assert run(a.beat()) or run(a.beat())  # a pooled connection a restart broke fails once
    assert a.count == 3 and a.kept == {"b", "c"}
    assert run(b.beat()) and run(c.beat()) and run(a.beat())
    assert a.count == 3 and a.kept == frozenset() and sorted(a.members) == ["a", "b", "c"]


def test_a_paused_store_is_not_a_fleet_of_one(fleet, loop, redis_server):
    """Redis paused past every member's expiry (SIGSTOP, CLIENT PAUSE): when it answers
    again the others' entries are out of time, but they have not had a `ttl_s` to beat:
    they stay counted, and drop out only if they stay silent a `ttl_s` more."""
    run = loop.run_until_complete
    a, b, _ = _three(fleet, loop)
    with redis.Redis.from_url(redis_server.url) as admin:
        admin.execute_command("CLIENT", "PAUSE", 900)
    assert run(a.beat()) is False  # timed out in the pause
    run(asyncio.sleep(0.8))
    assert run(a.beat()) and a.count == 3 and a.kept == {"b", "c"}
    assert run(b.beat())  # b is alive; c died in the pause
    run(_beating([a, b], 0.9))
    assert run(a.beat()) and a.count == 2 and sorted(a.members) == ["a", "b"]
