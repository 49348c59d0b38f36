"""A fleet-shared credit store in Redis: one round trip per admission (an atomic Lua script,
`acquire.lua`, run by EVALSHA), the window index from the Redis server's clock.

Several guard replicas pointed at one Redis share each tenant's floor: the credits are
per tenant, not per replica. With `clock="server"` (the default) the caller's `now` is
ignored and the grant reports the window Redis used, so replicas with skewed clocks still
share windows; `clock="caller"` uses `now` (the simulator, and the store test suite that
runs the same assertions over every store). Keys are `{prefix}:{tenant}` hashes that expire
a second after their window.

Both a blocking and an asyncio client are kept: the core's `acquire` is synchronous (the
simulator, tests), the HTTP guard awaits `acquire_async` before `on_arrival` so the event
loop never blocks on Redis.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Literal

import redis
import redis.asyncio

from floorguard.store.base import CreditStore, Grant
from floorguard.windows import WindowSchedule

__all__ = ["RedisCreditStore"]

SCRIPT = resources.files("floorguard.store").joinpath("acquire.lua").read_text()
Mode = Literal["take", "force", "peek"]


class RedisCreditStore(CreditStore):
    def __init__(
        self,
        url: str,
        *,
        prefix: str = "floorguard",
        timeout_s: float = 0.25,
        clock: Literal["server", "caller"] = "server",
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.clock = clock
        options: dict[str, Any] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
        }
        self._client = redis.Redis.from_url(url, **options)
        self._async_client = redis.asyncio.Redis.from_url(url, **options)
        self._script = self._client.register_script(SCRIPT)
        self._async_script = self._async_client.register_script(SCRIPT)

    def key(self, tenant: str) -> str:
        return f"{self.prefix}:{tenant}"

    def _args(
        self, weight: int, capacity: int, schedule: WindowSchedule, mode: Mode, now: float
    ) -> list[str | int]:
        at = repr(now) if self.clock == "caller" else ""
        return [weight, capacity, repr(schedule.window_s), repr(schedule.origin_at), mode, at]

    def acquire(
        self, key: str, weight: int, capacity: int, schedule: WindowSchedule, now: float
    ) -> Grant:
        return self.call(key, weight, capacity, schedule, now)

    def remaining(self, key: str, capacity: int, schedule: WindowSchedule, now: float) -> int:
        return self.call(key, 0, capacity, schedule, now, mode="peek").remaining

    def call(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        mode: Mode = "take",
    ) -> Grant:
        """One EVALSHA (blocking); raises redis.RedisError when Redis cannot answer."""
        args = self._args(weight, capacity, schedule, mode, now)
        return _grant(self._script(keys=[self.key(key)], args=args))

    async def call_async(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        mode: Mode = "take",
    ) -> Grant:
        """One EVALSHA on the asyncio client; raises redis.RedisError when Redis cannot
        answer."""
        args = self._args(weight, capacity, schedule, mode, now)
        return _grant(await self._async_script(keys=[self.key(key)], args=args))

    def close(self) -> None:
        """Close the blocking client (a store never used asynchronously needs no more)."""
        self._client.close()

    async def aclose(self) -> None:
        """Close both clients, on the event loop the asyncio client ran on."""
        await self._async_client.aclose()
        self._client.close()


def _grant(reply: Any) -> Grant:
    granted, index, remaining = reply
    return Grant(bool(granted), int(index), int(remaining))
