"""The in-process credit store: the reference implementation every other store is tested
against."""

from __future__ import annotations

from floorguard.store.base import CreditStore, Grant
from floorguard.windows import WindowSchedule

__all__ = ["MemoryCreditStore"]


class MemoryCreditStore(CreditStore):
    """Keeps only each key's current window: `key -> (window_index, used)`."""

    def __init__(self) -> None:
        self._windows: dict[str, tuple[int, int]] = {}

    def acquire(
        self, key: str, weight: int, capacity: int, schedule: WindowSchedule, now: float
    ) -> Grant:
        index = schedule.index_at(now)
        window, used = self._windows.get(key, (index, 0))
        if window != index:
            used = 0
        if used + weight <= capacity:
            used += weight
            self._windows[key] = (index, used)
            return Grant(True, index, capacity - used)
        self._windows[key] = (index, used)
        return Grant(False, index, capacity - used)

    def remaining(self, key: str, capacity: int, schedule: WindowSchedule, now: float) -> int:
        index = schedule.index_at(now)
        window, used = self._windows.get(key, (index, 0))
        return capacity - (used if window == index else 0)

    def used_in(self, index: int) -> dict[str, int]:
        """Credits taken per key in window `index` (keys with none are left out)."""
        windows = self._windows.items()
        return {key: used for key, (window, used) in windows if window == index and used}
