from __future__ import annotations

import itertools

import pytest

from floorguard.core.contract import Contract, ContractClass, MeterKind, WindowSchedule
from floorguard.core.meter import MeterVerdict, ReservationMeter
from floorguard.store import MemoryCreditStore
from floorguard.store.redis_store import RedisCreditStore
from tests.helpers import make_request
from tests.redis_server import RedisServer

PREFIXES = itertools.count()


@pytest.fixture(scope="module")
def redis_url():
    server = RedisServer().start()
    yield server.url
    server.close()


@pytest.fixture(params=["memory", "redis"])
def store(request):
    """One suite over every store: the in-memory reference and Redis (caller's clock, so
    the same instants drive both; `clock="server"` is tested on its own)."""
    if request.param == "memory":
        yield MemoryCreditStore()
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


def test_count_meter_entitles_first_B_per_window():
    """The first B assured arrivals of each window are entitled, the rest burst-excess."""
    contract = Contract("a95", ContractClass.ASSURED, 1.0, floor=2)
    meter = ReservationMeter(WindowSchedule(1.0), MemoryCreditStore(), MeterKind.COUNT)
    verdicts = [meter.charge(contract, make_request(at=t), t).verdict for t in (0, 0.2, 0.4, 1.1)]
    assert verdicts == [
        MeterVerdict.ENTITLED,
        MeterVerdict.ENTITLED,
        MeterVerdict.BURST_EXCESS,
        MeterVerdict.ENTITLED,
    ]


def test_token_meter_weighs_prompt_plus_output_and_sheds_cost_excess():
    """w = prompt + max_tokens; a request heavier than B can never fit: cost-excess."""
    contract = Contract("a95", ContractClass.ASSURED, 1.0, floor=100)
    meter = ReservationMeter(WindowSchedule(1.0), MemoryCreditStore(), MeterKind.TOKEN)
    assert meter.weight(make_request(tokens=16, prompt=30)) == 46
    assert meter.charge(contract, make_request(tokens=90, prompt=20), 0).verdict is (
        MeterVerdict.COST_EXCESS
    )
    assert meter.charge(contract, make_request(tokens=60, prompt=0), 0).verdict is (
        MeterVerdict.ENTITLED
    )
    assert meter.charge(contract, make_request(tokens=60, prompt=0), 0).verdict is (
        MeterVerdict.BURST_EXCESS
    )
    assert meter.remaining(contract, 0.5) == 40
