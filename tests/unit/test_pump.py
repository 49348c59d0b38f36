"""The pump on the injected clock: its timers are the clock's, so a `ManualClock` runs a
request's wait on virtual time — a doom drop and the end of a lease hold-off fire exactly
when the clock passes them, and not before."""

from __future__ import annotations

import asyncio
import dataclasses

from floorguard.clock import ManualClock
from floorguard.core.contract import AffineEnvelope
from floorguard.core.surface import LEASE_HOLD_OFF_S, Dispatch, Drop
from floorguard.proxy.pool.pump import Pump
from tests.helpers import make_config, make_guard, make_request


def test_a_held_off_backend_returns_when_the_manual_clock_passes_the_hold_off():
    async def scenario():
        clock = ManualClock()
        guard = make_guard(dataclasses.replace(make_config(slots=(1,)), slot_leases=True))
        pump = Pump(guard, clock)
        request = make_request(assured=False)
        guard.on_arrival(request, clock.now())
        first = await pump.turn(request.request_id)
        assert type(first) is Dispatch
        guard.lease_denied(request.request_id, clock.now())
        waiting = asyncio.ensure_future(pump.turn(request.request_id))
        await asyncio.sleep(0)
        clock.advance(LEASE_HOLD_OFF_S / 2)
        await asyncio.sleep(0)
        assert not waiting.done()  # still held off
        clock.advance(LEASE_HOLD_OFF_S)
        again = await asyncio.wait_for(waiting, 1.0)
        assert type(again) is Dispatch and again.request.request_id == request.request_id
        pump.close()

    asyncio.run(scenario())


def test_a_queued_request_is_dropped_when_the_manual_clock_reaches_its_doom():
    async def scenario():
        clock = ManualClock()
        config = make_config(slots=(1,), deadline_s=1.0, lower=AffineEnvelope(0.0, 0.01))
        guard = make_guard(config)
        pump = Pump(guard, clock)
        running = make_request(assured=False, tokens=16)
        guard.on_arrival(running, 0.0)
        assert type(await pump.turn(running.request_id)) is Dispatch
        queued = make_request(assured=False, tokens=16)  # L = 0.16 s: doomed after 0.84 s
        guard.on_arrival(queued, 0.0)
        waiting = asyncio.ensure_future(pump.turn(queued.request_id))
        await asyncio.sleep(0)
        clock.jump(0.8)
        await asyncio.sleep(0)
        assert not waiting.done()
        clock.jump(0.9)
        dropped = await asyncio.wait_for(waiting, 1.0)
        assert type(dropped) is Drop and dropped.reason == "doomed"
        pump.close()

    asyncio.run(scenario())
