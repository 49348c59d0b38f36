"""Clocks for the drivers. The core never reads one: a driver reads its clock once per step
and passes `now` down (design §18.1). A driver's timers are the clock's too (`call_at`), so a
test that runs the driver on a `ManualClock` moves its timers with it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock", "Timer", "WallClock"]


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's own time line."""
        ...

    def call_at(self, at: float, callback: Callable[[], None]) -> Timer:
        """Call `callback` once this clock reads `at` or later."""
        ...

    async def sleep(self, duration_s: float) -> None:
        """Return once this clock has moved `duration_s` on (on the running asyncio loop)."""
        ...


class _LoopTimers:
    """Timers of a clock that runs by itself: the running asyncio loop's."""

    def now(self) -> float:  # pragma: no cover  # each clock has its own
        raise NotImplementedError

    def call_at(self, at: float, callback: Callable[[], None]) -> Timer:
        delay = max(0.0, at - self.now())
        return asyncio.get_running_loop().call_later(delay, callback)

    async def sleep(self, duration_s: float) -> None:
        await asyncio.sleep(duration_s)


class MonotonicClock(_LoopTimers):
    """Real time from `time.monotonic()`, for the HTTP proxy."""

    def now(self) -> float:
        return time.monotonic()


class WallClock(_LoopTimers):
    """Seconds since the Unix epoch, `time.time()`: the guard's windows are tumbling windows
    of that shared time line (`t0` is an epoch every replica and contract agrees on).
    `origin_at` shifts it: seconds since that instant (a run whose arrivals start there)."""

    def __init__(self, origin_at: float = 0.0) -> None:
        self.origin_at = origin_at

    def now(self) -> float:
        return time.time() - self.origin_at


class _ManualTimer:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        self.callback = None


class ManualClock:
    """A clock that only moves when told to, for tests and the simulator; its timers fire
    as it moves past them, in time order (`advance`, `jump`)."""

    def __init__(self, start_at: float = 0.0) -> None:
        self._now = start_at
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, at: float, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer(callback)
        heapq.heappush(self._timers, (at, next(self._seq), timer))
        return timer

    async def sleep(self, duration_s: float) -> None:
        """Wait, on the running loop, until the clock is moved past `now + duration_s`."""
        woken = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        timer = self.call_at(self._now + max(0.0, duration_s), wake)
        try:
            await woken
        finally:
            timer.cancel()

    def advance(self, duration_s: float) -> float:
        if duration_s < 0:
            raise ValueError(f"duration_s = {duration_s!r}: a clock cannot move backwards")
        return self.jump(self._now + duration_s)

    def jump(self, at: float) -> float:
        if at < self._now:
            raise ValueError(f"at = {at!r}: earlier than now ({self._now!r})")
        timers = self._timers
        while timers and timers[0][0] <= at:
            due, _, timer = heapq.heappop(timers)
            self._now = max(self._now, due)
            if timer.callback is not None:
                timer.callback()
        self._now = at
        return self._now
