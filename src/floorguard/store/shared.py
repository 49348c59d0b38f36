"""The floor several guard replicas share through Redis, and what it does
when Redis cannot be reached (a documented policy, never a crash or a hang).

Every store call goes to Redis (`RedisCreditStore`, one EVALSHA, a short timeout). When a
call fails the floor is *degraded* and follows `on_unavailable`:

* `fail-static` (default): each of the `N` configured replicas grants from a local floor of
  `⌊B/N⌋` per window, so the fleet never admits more than `B` from the floor. In the window
  where Redis was lost the replica grants nothing more (it cannot know what the fleet
  already took there); `⌊B/N⌋` from the next window.
* `fail-open`: each replica grants the whole `B` locally (the fleet may admit up to `N·B`).
* `fail-closed`: no floor grants while Redis is away (assured requests meet their excess
  policy).

While degraded, Redis is retried at most every `retry_s`, on the request path; the first
call that succeeds ends the degradation, after the replica hands back (`force`) what it
granted locally in the current window, so the shared count includes it. Bound: while every
replica sees the same Redis (up or down) the fleet admits at most `B` per window under
`fail-static`; while replicas disagree (a partial partition, or the `retry_s` after Redis
returns) the fleet may admit up to `B + ⌊B/N⌋` per degraded replica in a window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import redis

from floorguard.store.base import CreditStore, Grant
from floorguard.store.memory import MemoryCreditStore
from floorguard.store.redis_store import RedisCreditStore
from floorguard.windows import WindowSchedule

__all__ = ["SharedFloor", "Unavailable"]

_UNREACHABLE = (redis.RedisError, OSError, TimeoutError)


class Unavailable(StrEnum):
    FAIL_STATIC = "fail-static"
    FAIL_OPEN = "fail-open"
    FAIL_CLOSED = "fail-closed"


class SharedFloor(CreditStore):
    def __init__(
        self,
        store: RedisCreditStore,
        *,
        policy: Unavailable,
        replicas: int,
        retry_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.policy = policy
        self.replicas = replicas
        self.retry_s = retry_s
        self._clock = clock
        self.degraded_since: float | None = None
        """When Redis was lost (the caller's clock); None while it answers."""
        self.calls: Counter[str] = Counter()
        """Store calls by outcome: redis, redis_error, local."""
        self._retry_at = 0.0
        self._onset_window = -1
        self._local = MemoryCreditStore()
        self._last: dict[str, Grant] = {}

    @property
    def degraded(self) -> bool:
        return self.degraded_since is not None

    def status(self) -> dict[str, Any]:
        """Its state for an operator: `shared`, or degraded under its fallback policy."""
        return {
            "url": self.store.url,
            "state": self.policy.value if self.degraded else "shared",
            "degraded_since": self.degraded_since,
            "replicas": self.replicas,
            "calls": dict(self.calls),
        }

    # -- two thin shells over one policy: the async one (the server's request path) and the
    # -- synchronous `CreditStore` interface (the core's own calls) ------------------------

    async def acquire_async(
        self, key: str, weight: int, capacity: int, schedule: WindowSchedule, now: float
    ) -> Grant:
        """The grant for one admission: from Redis, else by the fallback policy."""
        if self._should_try(now):
            try:
                grant = await self.store.call_async(key, weight, capacity, schedule, now)
                for owed_key, used in self._owed(schedule, now):
                    await self.store.call_async(owed_key, used, 0, schedule, now, mode="force")
            except _UNREACHABLE:
                self._lost(schedule, now)
            else:
                return self._answered(key, grant)
        return self._fallback(key, weight, capacity, schedule, now)

    def acquire(
        self, key: str, weight: int, capacity: int, schedule: WindowSchedule, now: float
    ) -> Grant:
        if self._should_try(now):
            try:
                grant = self.store.call(key, weight, capacity, schedule, now)
                for owed_key, used in self._owed(schedule, now):
                    self.store.call(owed_key, used, 0, schedule, now, mode="force")
            except _UNREACHABLE:
                self._lost(schedule, now)
            else:
                return self._answered(key, grant)
        return self._fallback(key, weight, capacity, schedule, now)

    def remaining(self, key: str, capacity: int, schedule: WindowSchedule, now: float) -> int:
        """As last seen by this replica (no round trip): the shared count after its latest
        admission in the current window, or the local floor's while degraded."""
        if self.degraded:
            return self._local.remaining(key, self._local_capacity(capacity), schedule, now)
        last = self._last.get(key)
        if last is None or last.window_index != schedule.index_at(now):
            return capacity
        return last.remaining

    # -- the policy -------------------------------------------------------------------------

    def _should_try(self, now: float) -> bool:
        return not self.degraded or now >= self._retry_at

    def _owed(self, schedule: WindowSchedule, now: float) -> list[tuple[str, int]]:
        """What to hand back to Redis once it answers again (`force`): what this replica
        granted locally in the current window, so the shared count includes it. Nothing
        while not degraded. A failure while handing back leaves it degraded; the next retry
        hands back again."""
        if not self.degraded:
            return []
        return list(self._local.used_in(schedule.index_at(now)).items())

    def _answered(self, key: str, grant: Grant) -> Grant:
        self.calls["redis"] += 1
        self._last[key] = grant
        if self.degraded:
            self._recovered()
        return grant

    def _lost(self, schedule: WindowSchedule, now: float) -> None:
        self.calls["redis_error"] += 1
        self._retry_at = now + self.retry_s
        if not self.degraded:
            self.degraded_since = now
            self._onset_window = schedule.index_at(now)
            self._local = MemoryCreditStore()

    def _recovered(self) -> None:
        self.degraded_since = None
        self._local = MemoryCreditStore()

    def _local_capacity(self, capacity: int) -> int:
        if self.policy is Unavailable.FAIL_OPEN:
            return capacity
        if self.policy is Unavailable.FAIL_CLOSED:
            return 0
        return capacity // self.replicas

    def _fallback(
        self, key: str, weight: int, capacity: int, schedule: WindowSchedule, now: float
    ) -> Grant:
        self.calls["local"] += 1
        index = schedule.index_at(now)
        local = self._local_capacity(capacity)
        if self.policy is Unavailable.FAIL_STATIC and index == self._onset_window:
            local = 0  # the fleet may have spent this window's floor before Redis went away
        return self._local.acquire(key, weight, local, schedule, now)
