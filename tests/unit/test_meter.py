from __future__ import annotations

import itertools

import pytest

from floorguard.core.contract import MeterKind, WindowSchedule
from floorguard.core.meter import ReservationMeter
from floorguard.core.surface import RejectReason, StoreCall
from floorguard.store import MemoryCreditStore
from floorguard.store.redis_store import RedisCreditStore
from floorguard.store.simulated import SimulatedRedis
from tests.helpers import make_config, make_guard, make_request
from tests.redis_server import RedisServer

PREFIXES = itertools.count()


@pytest.fixture(scope="module")
def redis_url():
    server = RedisServer().start()
    yield server.url
    server.close()


@pytest.fixture(params=["memory", "simulated", "redis"])
def store(request):
    """One suite over every store: the in-memory reference, the simulated Redis the fleet
    simulator runs on, and Redis (caller's clock, so the same instants drive all three;
    `clock="server"` is tested on its own)."""
    if request.param == "memory":
        yield MemoryCreditStore()
        return
    if request.param == "simulated":
        yield SimulatedRedis().client("c0")
        return
    store = RedisCreditStore(
        request.getfixturevalue("redis_url"), prefix=f"t{next(PREFIXES)}", clock="caller"
    )
    yield store
    store.close()


def test_store_grants_until_capacity_then_denies_and_resets_next_window(store):
    """Take-if-fits per window: B grants, then denials, then a fresh window."""
    schedule = WindowSchedule(1.0)
    grants = [store.acquire("t", 1, 3, schedule, 0.1 * i) for i in range(5)]
    assert [g.granted for g in grants] == [True, True, True, False, False]
    assert [g.remaining for g in grants] == [2, 1, 0, 0, 0]
    assert {g.window_index for g in grants} == {0}
    nxt = store.acquire("t", 1, 3, schedule, 1.0)
    assert (nxt.granted, nxt.window_index, nxt.remaining) == (True, 1, 2)
    assert store.remaining("t", 3, schedule, 1.5) == 2
    assert store.remaining("other", 3, schedule, 1.5) == 3


def test_store_weight_that_does_not_fit_leaves_credits_for_smaller_ones(store):
    """A denied weight consumes nothing."""
    schedule = WindowSchedule(1.0)
    assert store.acquire("t", 8, 10, schedule, 0.0).granted
    assert not store.acquire("t", 5, 10, schedule, 0.1).granted
    assert store.acquire("t", 2, 10, schedule, 0.2).granted


def test_store_pins_a_windows_floor_at_its_first_take(store):
    """Two callers with different floors (a reload that reached one replica): the first
    take of a window pins its floor, later takes are judged against it whatever floor
    they bring; the next window is pinned afresh."""
    schedule = WindowSchedule(1.0)
    first = [store.acquire("t", 1, 4, schedule, 0.1, floor=4) for _ in range(2)]
    later = [store.acquire("t", 1, 2, schedule, 0.2, floor=2) for _ in range(3)]
    assert [g.granted for g in first + later] == [True, True, True, True, False]
    assert {g.floor for g in first + later} == {4}
    assert [g.remaining for g in later] == [1, 0, 0]
    assert store.remaining("t", 2, schedule, 0.3) == 0
    nxt = [store.acquire("t", 1, 2, schedule, 1.1, floor=2) for _ in range(3)]
    assert [g.granted for g in nxt] == [True, True, False]
    assert {g.floor for g in nxt} == {2}
    assert not store.acquire("t", 1, 4, schedule, 1.2, floor=4).granted  # pinned at 2


def test_store_a_lowered_floor_takes_within_the_pinned_one(store):
    """A caller whose floor is lowered (capacity 1 of B = 3) takes at most its capacity;
    it pins the contract's B, not the lowered one, so an unlowered caller takes up to B."""
    schedule = WindowSchedule(1.0)
    lowered = [store.acquire("t", 1, 1, schedule, 0.1, floor=3) for _ in range(2)]
    assert [g.granted for g in lowered] == [True, False]
    assert lowered[0].floor == 3 and lowered[1].remaining == 0
    full = [store.acquire("t", 1, 3, schedule, 0.2, floor=3) for _ in range(3)]
    assert [g.granted for g in full] == [True, True, False]


def test_count_meter_entitles_first_B_per_window():
    """The first B assured arrivals of each window are entitled, the rest burst-excess."""
    guard = make_guard(make_config(floor=2))
    admissions = [guard.on_arrival(make_request(at=t), t) for t in (0, 0.2, 0.4, 1.1)]
    assert [a.entitled for a in admissions] == [True, True, False, True]
    assert admissions[2].reason == RejectReason.FLOOR_EXHAUSTED
    assert admissions[2].retry_at == 1.0, "a floor refusal says when the next window starts"


def test_token_meter_weighs_prompt_plus_output_and_sheds_cost_excess():
    """w = prompt + max_tokens; a request heavier than B can never fit: cost-excess, and it
    never reaches the store."""
    assert ReservationMeter(MeterKind.TOKEN).weight(make_request(tokens=16, prompt=30)) == 46
    guard = make_guard(make_config(floor=100, meter=MeterKind.TOKEN))
    heavy = guard.begin_arrival(make_request(tokens=90, prompt=20), 0)
    assert heavy.need is None and heavy.admission.reason == RejectReason.COST_EXCESS
    first = guard.begin_arrival(make_request(tokens=60, prompt=0), 0)
    assert first.need == StoreCall("a95", 60, 100, 0.0, 100)
    assert guard.on_arrival(make_request(tokens=60, prompt=0), 0).entitled
    assert not guard.continue_arrival(first, 0, guard.answer(first.need, 0)).admission.entitled
    assert guard.credits_left("a95", 0.5) == 100 - 60
