"""Clocks for the drivers. The core never reads one: a driver reads its clock once per step
and passes `now` down (STYLE §1)."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock", "WallClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's own time line."""
        ...


class MonotonicClock:
    """Real time from `time.monotonic()`, for the HTTP proxy."""

    def now(self) -> float:
        return time.monotonic()


class WallClock:
    """Seconds since the Unix epoch, `time.time()`: the guard's windows are tumbling windows
    of that shared time line (`t0` is an epoch every replica and contract agrees on).
    `origin_at` shifts it: seconds since that instant (a run whose arrivals start there)."""

    def __init__(self, origin_at: float = 0.0) -> None:
        self.origin_at = origin_at

    def now(self) -> float:
        return time.time() - self.origin_at


class ManualClock:
    """A clock that only moves when told to, for tests and the simulator."""

    def __init__(self, start_at: float = 0.0) -> None:
        self._now = start_at

    def now(self) -> float:
        return self._now

    def advance(self, duration_s: float) -> float:
        if duration_s < 0:
            raise ValueError(f"duration_s = {duration_s!r}: a clock cannot move backwards")
        self._now += duration_s
        return self._now

    def jump(self, at: float) -> float:
        if at < self._now:
            raise ValueError(f"at = {at!r}: earlier than now ({self._now!r})")
        self._now = at
        return self._now
