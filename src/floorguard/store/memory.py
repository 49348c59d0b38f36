"""The in-process credit store: the reference implementation every other store is tested
against."""

from __future__ import annotations

from floorguard.store.base import CreditStore, Grant
from floorguard.windows import WindowSchedule

__all__ = ["MemoryCreditStore"]


class MemoryCreditStore(CreditStore):
    """Keeps only each key's current window: `key -> (window_index, used, floor)`, the
    window's floor pinned at its first take, as `acquire.lua` pins it. A call for an earlier
    window than the key's latest (concurrent callers whose `now`s cross a boundary out of
    order: a degraded replica's fallback) is denied, never counted afresh: three replicas
    paused out of Redis each granted 2 of a fail-static share of 1 that way."""

    def __init__(self) -> None:
        self._windows: dict[str, tuple[int, int, int]] = {}

    def acquire(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        floor: int | None = None,
    ) -> Grant:
        index = schedule.index_at(now)
        own = capacity if floor is None else floor
        window, used, pinned = self._windows.get(key, (index, 0, own))
        if index < window:  # a call for a window already left (calls answered out of order)
            return Grant(False, index, 0, own)  # its count is gone: never grant it afresh
        if window != index:
            used, pinned = 0, own
        limit = min(capacity, pinned) if capacity < own else pinned
        granted = used + weight <= limit
        if granted:
            used += weight
        self._windows[key] = (index, used, pinned)
        # the NamedTuple's own `__new__` is interpreted Python even in a compiled build
        # (≈ 2,500 instructions an admission); `tuple.__new__` is C
        return tuple.__new__(Grant, (granted, index, limit - used, pinned))

    def remaining(self, key: str, capacity: int, schedule: WindowSchedule, now: float) -> int:
        index = schedule.index_at(now)
        window, used, pinned = self._windows.get(key, (index, 0, capacity))
        return capacity if window != index else pinned - used

    def used_in(self, index: int) -> dict[str, int]:
        """Credits taken per key in window `index` (keys with none are left out)."""
        windows = self._windows.items()
        return {key: used for key, (window, used, _) in windows if window == index and used}
