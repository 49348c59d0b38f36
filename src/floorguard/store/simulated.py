"""`acquire.lua`'s semantics in process, on the caller's clock: the Redis a simulation runs
against (the datacenter in `sim/fleet.py`), held to the real script by a differential test
against a real `redis-server` (`tests/integration/test_simulated_store.py`).

Every step of the script is here — the generation marker, the carried hand-back and the
re-force of a lost state (once per caller and window), the window closed by a lost state,
the floor pinned at a window's first take — so a fleet simulated over it meets the same
store the shipped replicas meet. `restart()` is a Redis that comes back without its data;
`down` makes every call fail as an unreachable one does. Key expiry is not modelled: the
script reads every field against the current window, so an expired field and a stale one
answer alike.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import redis

from floorguard.store.base import Grant
from floorguard.store.redis_store import NO_CARRY, Carry, Reply
from floorguard.windows import WindowSchedule

__all__ = ["SimulatedRedis"]


@dataclass
class _Counter:
    """A tenant's counter hash: `w`, `used`, `floor`, `lost`, and `r:<caller>` marks."""

    window: int | None = None
    used: int = 0
    floor: int | None = None
    lost: int | None = None
    reforced: dict[str, int] = field(default_factory=dict)


class SimulatedRedis:
    """One simulated Redis; `client(caller)` is one replica's connection to it (the
    caller's id keys its once-per-window re-force, as the real store's token base does)."""

    url = "sim://redis"

    def __init__(self, outage: tuple[float, float] | None = None) -> None:
        self.down = False
        """Every call raises `redis.ConnectionError` while set (an outage)."""
        self.outage = outage
        """… and while the caller's clock is in [start, end) seconds (a simulated one)."""
        self._counters: dict[str, _Counter] = {}
        self._generations: dict[str, str] = {}
        self._tokens = itertools.count()

    def restart(self) -> None:
        """Redis came back without its data: every counter and marker is gone."""
        self._counters.clear()
        self._generations.clear()

    def client(self, caller: str) -> SimulatedClient:
        return SimulatedClient(self, caller)

    def call(  # noqa: PLR0917  # the script's arguments, in its order
        self,
        caller: str,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        mode: str,
        seen: str,
        carry: Carry,
        floor: int | None,
    ) -> Reply:
        """One run of `acquire.lua`, step for step."""
        outage = self.outage
        if self.down or (outage is not None and outage[0] <= now < outage[1]):
            raise redis.ConnectionError("simulated outage")
        own_floor = capacity if floor is None else floor
        index = schedule.index_at(now)
        generation = self._generations.setdefault(key, f"sim:{next(self._tokens)}")
        counter = self._counters.setdefault(key, _Counter())
        current = counter.window == index
        used = counter.used if current else 0
        pinned = counter.floor if current else None
        window_floor = own_floor if pinned is None else pinned
        limit = min(capacity, window_floor) if capacity < own_floor else window_floor

        carried = carry.window == index
        restored = 0
        if seen not in (generation, ""):
            counter.lost = index
            if carried and counter.reforced.get(caller) != index:
                restored = carry.shared
                counter.reforced[caller] = index
        closed = counter.lost == index
        handed = carry.local if carried else 0
        used += restored + handed

        granted = mode == "take" and not closed and used + weight <= limit
        if granted:
            used += weight
        if mode == "take" or restored + handed > 0 or closed:
            counter.window, counter.used = index, used
            if mode == "take":
                counter.floor = window_floor
            elif pinned is None:
                counter.floor = None
        grant = Grant(granted, index, limit - used, window_floor)
        return Reply(grant, generation, now, restored, closed)


class SimulatedClient:
    """The `RedisCreditStore.call` surface over one `SimulatedRedis`, for one caller."""

    def __init__(self, server: SimulatedRedis, caller: str) -> None:
        self.server = server
        self.caller = caller
        self.url = server.url

    def call(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        mode: str = "take",
        seen: str = "",
        carry: Carry = NO_CARRY,
        floor: int | None = None,
    ) -> Reply:
        return self.server.call(
            self.caller, key, weight, capacity, schedule, now, mode, seen, carry, floor
        )
