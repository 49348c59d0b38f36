from __future__ import annotations

import asyncio

import pytest

from floorguard.clock import ManualClock, MonotonicClock


def test_manual_clock_moves_only_when_told_and_never_backwards():
    """advance() and jump() move it forward; a negative step or an earlier jump is refused."""
    clock = ManualClock(5.0)
    assert clock.now() == 5.0
    assert clock.advance(0.5) == 5.5
    assert clock.jump(7.0) == 7.0
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1.0)
    with pytest.raises(ValueError, match="earlier than now"):
        clock.jump(6.0)


def test_monotonic_clock_does_not_decrease():
    """The proxy's clock is monotonic."""
    clock = MonotonicClock()
    first = clock.now()
    assert clock.now() >= first


def test_a_manual_clocks_sleep_ends_when_the_clock_is_moved_past_it():
    """A driver's `await clock.sleep(s)` on a `ManualClock` returns once the test moves the
    clock `s` on, not before, whatever real time passes; a cancelled sleep leaves no timer."""

    async def scenario():
        clock = ManualClock(10.0)
        sleeper = asyncio.ensure_future(clock.sleep(2.0))
        await asyncio.sleep(0)
        clock.advance(1.9)
        await asyncio.sleep(0)
        assert not sleeper.done()
        clock.advance(0.1)
        await asyncio.sleep(0)
        assert sleeper.done()
        cancelled = asyncio.ensure_future(clock.sleep(5.0))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        clock.advance(10.0)  # its timer fires into a cancelled future: nothing happens

    asyncio.run(scenario())
