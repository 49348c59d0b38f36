"""The fair surplus (docs/design.md §15) on a real `floorguard serve` over the emulator:
a polite opportunistic tenant sending a few requests beside a flooder is served in its turn,
not behind the whole flood — while the floor's tenant is still served first — and with
`surplus: learner` (one order for all) it waits behind the flood. The decision logs verify
(`guard_process`: AF, ORDER, SLOTS, TERMINAL)."""

from __future__ import annotations

import asyncio
import statistics
import time

import aiohttp

from tests.integration.live import token
from tests.integration.test_attacks import guard_process

pytest_plugins = ["tests.integration.test_attacks"]  # its `emulator` backend fixture

BODY = {"model": "m", "prompt": "hi", "max_tokens": 16}


async def _one(session, url, tenant, delay_s, body=BODY):
    await asyncio.sleep(delay_s)
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {token(tenant)}"}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
        await r.read()
        return tenant, r.status, time.monotonic() - started


async def _beside_a_flood(url):
    async with aiohttp.ClientSession() as session:
        sent = [_one(session, url, "free", 0.0) for _ in range(60)]
        sent += [_one(session, url, "polite", 0.5 + 0.4 * i) for i in range(4)]
        sent += [_one(session, url, "acme", 1.0 + 0.3 * i) for i in range(3)]
        return await asyncio.gather(*sent)


def _by_order(tmp_path, emulator, contracts, orders, drive):
    """`drive(url)` against a guard with each surplus order: its results by order."""
    seen = {}
    for order in orders:
        with guard_process(
            tmp_path / order, [emulator], contracts=contracts, surplus=order, window_s=60.0
        ) as guard:
            seen[order] = asyncio.run(drive(guard.url))
    return seen


def _latencies(results, tenant):
    assert all(status == 200 for t, status, _ in results if t == tenant)
    return [s for t, _, s in results if t == tenant]


def test_a_polite_tenant_is_served_in_its_turn_not_behind_the_flood(tmp_path, emulator):
    contracts = [
        {"tenant": "acme", "class": "assured", "floor": 3, "deadline_ms": 60000},
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 60000},
        {"tenant": "polite", "class": "opportunistic", "deadline_ms": 60000},
    ]
    seen = _by_order(tmp_path, emulator, contracts, ("fair", "learner"), _beside_a_flood)
    fair, learner = seen["fair"], seen["learner"]
    flood = statistics.median(_latencies(fair, "free"))
    assert max(_latencies(fair, "polite")) < flood  # in its turn: before most of the flood
    assert statistics.mean(_latencies(fair, "polite")) * 3 < statistics.mean(
        _latencies(learner, "polite")
    )  # one order for all: behind the flood
    for results in (fair, learner):  # the floor first, whatever the surplus order
        assert max(_latencies(results, "acme")) < statistics.median(_latencies(results, "free"))


async def _shapes(url):
    """A flood of 48-token requests queued at once, then six polite ones of 8 output
    tokens behind 1,000-byte prompts."""

    flood = {"model": "m", "prompt": "hi", "max_tokens": 48}
    polite = {"model": "m", "prompt": "x" * 1000, "max_tokens": 8}
    async with aiohttp.ClientSession() as session:
        sent = [_one(session, url, "free", 0.0, flood) for _ in range(16)]
        sent += [_one(session, url, "polite", 0.3, polite) for _ in range(6)]
        return await asyncio.gather(*sent)


def test_long_prompts_and_short_outputs_are_charged_the_slot_time_they_hold(tmp_path, emulator):
    """A polite tenant of 1,000-byte prompts and short outputs was charged a
    prompt byte like an output token, and waited behind a flooder of long outputs. Charged
    the slot time it holds (`fair`), its requests run before most of the flood; charged
    tokens (`fair-tokens`, the old charge) they wait behind it."""
    contracts = [
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 60000},
        {"tenant": "polite", "class": "opportunistic", "deadline_ms": 60000},
    ]
    seen = _by_order(tmp_path, emulator, contracts, ("fair", "fair-tokens"), _shapes)
    by_slot, by_tokens = (statistics.median(_latencies(seen[o], "polite")) for o in seen)
    assert max(_latencies(seen["fair"], "polite")) < statistics.median(
        _latencies(seen["fair"], "free")
    )
    assert by_slot * 2 < by_tokens, (by_slot, by_tokens)
