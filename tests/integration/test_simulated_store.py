"""The simulated Redis (`store/simulated.py`) held to `acquire.lua` on a real redis-server:
random sequences of takes, peeks, carried hand-backs (some by grant id, resent) and
re-forces, stale and fresh generations, callers with different floors, restarts without data
and failovers (another server with the data: the markers name the one before), run side by
side against both (the real store on the caller's clock), must answer alike call for call —
granted, window, what is left, the pinned floor, the credits re-forced, the window closed, a
call id's replayed first answer or an unsure retry, and the same pattern of generations."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floorguard.store.leases import LeaseCall, lease_keys, redis_lease_script
from floorguard.store.redis_store import Carry, RedisCreditStore
from floorguard.store.simulated import SimulatedRedis
from floorguard.windows import WindowSchedule
from tests.redis_server import RedisServer

SCHEDULE = WindowSchedule(1.0)
PREFIXES = itertools.count()

_calls = st.fixed_dictionaries(
    {
        "op": st.sampled_from(["take", "take", "take", "peek", "restart", "failover"]),
        "caller": st.integers(0, 1),
        "key": st.sampled_from(["a", "b"]),
        "step_s": st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.2]),
        "weight": st.integers(1, 3),
        "capacity": st.integers(0, 5),
        "floor_above": st.sampled_from([None, 0, 0, 1, 3]),
        "seen": st.sampled_from(["", "last", "last", "stale"]),
        "carry_back": st.sampled_from([None, 0, 0, 1]),
        "shared": st.integers(0, 3),
        "local": st.integers(0, 3),
        "grants": st.sampled_from([(), (), (("g1", 1),), (("g1", 1), ("g2", 2)), (("g2", 2),)]),
        "id": st.sampled_from(["", "", "x", "y"]),
        "retry_of": st.sampled_from([None, None, 0, 1]),
    }
)


@pytest.fixture(scope="module")
def module_redis():
    server = RedisServer().start()
    yield server
    server.close()


def _written_elsewhere(client, markers) -> None:
    """A failover, as the scripts meet it: every generation marker names another server
    (`generation.lua`), the data kept."""
    for key in markers:
        marker = client.get(key)
        if marker is not None:
            client.set(key, marker.decode().rsplit("@", 1)[0] + "@" + "0" * 40)


def _pattern(generations: dict[str, int], token: str) -> int:
    return generations.setdefault(token, len(generations))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(calls=st.lists(_calls, min_size=1, max_size=30))
def test_the_simulated_redis_answers_as_acquire_lua_does(module_redis, calls):
    prefix = f"sim{next(PREFIXES)}"
    real = [RedisCreditStore(module_redis.url, prefix=prefix, clock="caller") for _ in range(2)]
    sim = SimulatedRedis()
    simulated = [sim.client(f"c{n}") for n in range(2)]
    flush = redis.Redis.from_url(module_redis.url)
    seen: dict[tuple[str, int, str], str] = {}
    patterns: dict[str, dict[str, int]] = {"real": {}, "sim": {}}
    now = 1000.0
    try:
        for call in calls:
            now += call["step_s"]
            if call["op"] == "restart":
                for key in flush.scan_iter(f"{prefix}:*"):
                    flush.delete(key)
                sim.restart()
                continue
            if call["op"] == "failover":
                _written_elsewhere(flush, list(flush.scan_iter(f"{prefix}:*:gen")))
                sim.failover()
                continue
            answers = {}
            for side, stores in (("real", real), ("sim", simulated)):
                last = seen.get((side, call["caller"], call["key"]), "")
                token = {"": "", "last": last, "stale": "stale-token"}[call["seen"]]
                index = SCHEDULE.index_at(now)
                carry = (
                    Carry()
                    if call["carry_back"] is None
                    else Carry(
                        index - call["carry_back"],
                        call["shared"],
                        sum(w for _, w in call["grants"]) or call["local"],
                        call["grants"],
                    )
                )
                floor = (
                    None if call["floor_above"] is None else call["capacity"] + call["floor_above"]
                )
                reply = stores[call["caller"]].call(
                    call["key"],
                    call["weight"],
                    call["capacity"],
                    SCHEDULE,
                    now,
                    mode=call["op"],
                    seen=token,
                    carry=carry,
                    floor=floor,
                    op=call["id"],
                    retry_of=None if call["retry_of"] is None else index - call["retry_of"],
                )
                seen[side, call["caller"], call["key"]] = reply.generation
                answers[side] = (
                    reply.grant,
                    reply.restored,
                    reply.closed,
                    reply.replayed,
                    reply.unsure,
                    _pattern(patterns[side], reply.generation),
                )
            assert answers["sim"] == answers["real"], call
    finally:
        flush.close()
        for store in real:
            store.close()


SEQ_BASE = 1_796_544_539_375_552
"""A replica's first call's number as the HTTP guard gives it (`PoolFleet`: the wall
clock's microseconds at start), one that 14 digits round up (…375_6e+15): an entry written
back that way stands above the replica's newer calls."""

_lease_calls = st.fixed_dictionaries(
    {
        "op": st.sampled_from(
            ["acquire"] * 3 + ["keep", "release", "pass", "renew", "restore", "restart", "failover"]
        ),
        "backend": st.sampled_from(["b", "b", "c"]),
        "replica": st.sampled_from(["A", "B", "C"]),
        "request": st.integers(0, 4),
        "handed": st.integers(0, 6),
        "step_s": st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0, 1.5]),  # binary-exact
        "capacity": st.integers(0, 3),
        "waiting": st.integers(0, 2),
        "surplus": st.integers(0, 2),
        "entitled": st.booleans(),
        # not rising: late calls, and a restarted replica's; numbered as the HTTP guard
        # numbers them, from the wall clock's microseconds (16 digits: a board entry
        # rewritten by a hand-over kept 14 of them, and a newer call was taken for older)
        "seq": st.integers(0, 3).map(lambda n: SEQ_BASE + n),
        "seen": st.sampled_from(["", "last", "last", "stale"]),
    }
)


def _stored_leases(client, prefix, backend):
    """A backend's leases and its pool's board, as `SimulatedRedis.lease_state` gives them."""
    keys = lease_keys(prefix, "pool", backend)[:2]
    leases = {m.decode(): score for m, score in client.zrange(keys[0], 0, -1, withscores=True)}
    board: dict[str, object] = {}
    for name, value in client.hgetall(keys[1]).items():
        field, text = name.decode(), value.decode()
        if field == "|turn":
            board[field] = int(text)
        elif field == "|moved":
            board[field] = float(text)
        elif field.startswith("|use:"):
            used, capacity = text.split("|")
            board[field] = (int(used), int(capacity))
        elif field.startswith("|h:"):
            where, expiry = text.rsplit("|", 1)
            board[field] = (where, float(expiry))
        else:
            count, expiry, seq, surplus = text.split("|")
            board[field] = (int(count), float(expiry), int(seq), int(surplus))
    return leases, board


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(calls=st.lists(_lease_calls, min_size=1, max_size=30))
def test_the_simulated_redis_leases_as_lease_lua_does(module_redis, calls):
    """Leases, their expiry, renewal and restore, releases, the pool's one waiting board's
    order denials, a late call (numbered below the board entry's) leaving the entry alone,
    each freed slot handed over to a replica waiting in the pool (entitled first,
    round-robin) in the same call, the handed slots a renewal lists on any backend, and
    the other backends a full denial names, on two backends of one pool, call for call
    against `lease.lua` on the caller's clock (ttl 1 s), and the leases and the board as
    stored after each call."""
    prefix = f"lease{next(PREFIXES)}"
    client = redis.Redis.from_url(module_redis.url)
    run = redis_lease_script(_Store(client, prefix))
    sim = SimulatedRedis()
    now = 1000.0
    loop = asyncio.new_event_loop()
    last = {"real": "", "sim": ""}  # the generation each side last answered
    patterns: dict[str, dict[str, int]] = {"real": {}, "sim": {}}
    try:
        for call in calls:
            now += call["step_s"]
            if call["op"] == "restart":
                client.delete(*(k for b in "bc" for k in lease_keys(prefix, "pool", b)))
                sim.restart()
                continue
            if call["op"] == "failover":
                _written_elsewhere(client, [lease_keys(prefix, "pool", "b")[2]])
                sim.failover()
                continue
            member = f"{call['replica']}|{call['request']}"
            if call["op"] != "restore" and call["request"] == 4:  # a handed slot, maybe
                member = f"{call['replica']}|handed|{call['handed']}"
            lease = LeaseCall(
                call["backend"],
                call["op"],
                call["capacity"],
                1.0,
                call["replica"],
                call["waiting"],
                call["entitled"],
                (member,),
                now,
                call["seq"],
                call["surplus"],
            )
            seen = {side: {"": "", "last": g, "stale": "gone"}[call["seen"]]
                    for side, g in last.items()}  # fmt: skip
            real = loop.run_until_complete(run(lease._replace(seen=seen["real"])))
            simulated = sim.lease(lease._replace(seen=seen["sim"]))
            last = {"real": real.generation, "sim": simulated.generation}
            assert _pattern(patterns["sim"], simulated.generation) == _pattern(
                patterns["real"], real.generation
            ), call
            assert simulated._replace(generation="") == real._replace(generation=""), call
            for backend in "bc":
                stored = _stored_leases(client, prefix, backend)
                assert sim.lease_state("pool", backend) == stored, call
    finally:
        loop.close()
        client.delete(*(k for b in "bc" for k in lease_keys(prefix, "pool", b)))
        client.close()


class _Store:
    """What `redis_lease_script` reads of a `RedisCreditStore`, over one blocking client run
    on the asyncio path (no channel: nothing published)."""

    def __init__(self, client, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def register_async(self, script: str):
        registered = self.client.register_script(script)

        async def run(*, keys, args):
            args = list(args)
            args[9] = ""  # publish nothing
            return registered(keys=keys, args=args)

        return run


def test_a_slot_handed_to_a_replica_expires_with_its_waiting_entry(module_redis):
    """B waits for a full backend at t = 1000 (its board entry lives to 1001) and calls no
    more — it died. A releases at 1000.9: the slot is handed to B, expiring at 1001 (B's
    entry), not at 1001.9: a dead replica holds nothing past ttl_s after its last call."""
    prefix = f"lease{next(PREFIXES)}"
    client = redis.Redis.from_url(module_redis.url)
    run = redis_lease_script(_Store(client, prefix))
    sim = SimulatedRedis()
    steps = [("A", "acquire", 1000.0, "A|1"), ("B", "acquire", 1000.0, "B|1"),
             ("A", "release", 1000.9, "A|1")]  # fmt: skip
    loop = asyncio.new_event_loop()
    try:
        for replica, op, now, member in steps:
            lease = LeaseCall("b", op, 1, 1.0, replica, 0, True, (member,), now, 0)
            real = loop.run_until_complete(run(lease))
            assert sim.lease(lease)._replace(generation="") == real._replace(generation="")
        leases, _ = _stored_leases(client, prefix, "b")
        assert leases == {"B|handed|1": 1001.0} == sim.lease_state("pool", "b")[0]
    finally:
        loop.close()
        client.delete(*lease_keys(prefix, "pool", "b"))
        client.close()


def test_a_board_entry_a_hand_over_rewrites_keeps_its_number(module_redis):
    """A waits with 2 entitled requests (its calls numbered as the HTTP guard numbers them,
    16 digits); B releases one slot, handed to A, whose entry is written back with 1 left.
    A's next call, numbered above, must update the entry: with the number rewritten in 14
    digits (rounded up past it) the entry stood, a release of A's carrying 2 waiting left
    1, then 0, and the next freed slots went to B's opportunistic requests (a CI run)."""
    prefix = f"lease{next(PREFIXES)}"
    client = redis.Redis.from_url(module_redis.url)
    run = redis_lease_script(_Store(client, prefix))
    sim = SimulatedRedis()
    a, b = SEQ_BASE, 1000
    steps = [
        ("B", "acquire", "B|1", 0, True, b),  # B holds the only slot
        ("A", "acquire", "A|1", 1, True, a),  # denied: A waits with 2 entitled
        ("B", "release", "B|1", 0, False, b + 1),  # handed to A: A's entry has 1 left
        ("A", "renew", "A|handed|1", 2, False, a + 1),  # a newer call: 2 waiting again
    ]
    loop = asyncio.new_event_loop()
    try:
        for replica, op, member, waiting, entitled, seq in steps:
            lease = LeaseCall("b", op, 1, 1.0, replica, waiting, entitled, (member,), 1000.0, seq)
            real = loop.run_until_complete(run(lease))
            assert sim.lease(lease)._replace(generation="") == real._replace(generation="")
        _, board = _stored_leases(client, prefix, "b")
        assert board["A"] == (2, 1001.0, a + 1, 0) == sim.lease_state("pool", "b")[1]["A"]
    finally:
        loop.close()
        client.delete(*lease_keys(prefix, "pool", "b"))
        client.close()
