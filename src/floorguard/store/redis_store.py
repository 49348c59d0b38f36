"""A fleet-shared credit store in Redis: one round trip per admission (an atomic Lua script,
`acquire.lua`, run by EVALSHA), the window index from the Redis server's clock.

Several guard replicas pointed at one Redis share each tenant's floor: the credits are
per tenant, not per replica. With `clock="server"` (the default) the caller's `now` is
ignored and the grant reports the window Redis used, so replicas with skewed clocks still
share windows; `clock="caller"` uses `now` (the simulator, and the store test suite that
runs the same assertions over every store). Tenant `acme`'s keys are `floorguard:{acme}`
(its counter, a hash that expires a second after its window) and `floorguard:{acme}:gen`
(its generation marker); the braces are literal, a Redis Cluster hash tag, so both sit in
one slot.

Each reply also carries the tenant's *generation* (a token written when its state began: a
Redis that restarted empty writes a new one, and so does another server than the one that
wrote the marker — a failover, a restart from a snapshot: `generation.lua` — which is how a
replica learns that the counts it relied on are gone) and the Redis clock it used (a replica
measures its offset from it, for the windows it keeps while Redis is unreachable). A call
can carry back what the caller granted (`Carry`): re-forced when the generation changed,
handed back before the take when it was granted locally. `store.shared.SharedFloor` is the
policy that uses them.

Both a blocking and an asyncio client are kept, each over a bounded, blocking connection
pool (a call waits up to `pool_timeout_s` for a free connection instead of failing) with
separate connect and call timeouts: the core's `acquire` is synchronous (the simulator,
tests), the HTTP guard awaits `call_async` so the event loop never blocks on Redis.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

from floorguard.errors import ConfigError
from floorguard.store.base import Grant, StoreUnavailable
from floorguard.store.script import NO_CARRY, Carry, Mode, Reply, ScriptStore, lua_script
from floorguard.windows import WindowSchedule

_UNREACHABLE = (redis.RedisError, OSError, TimeoutError)
"""What the Redis client raises when Redis cannot answer: `StoreUnavailable` to the rest."""

__all__ = ["NO_CARRY", "Carry", "RedisCreditStore", "Reply"]

SCRIPT = lua_script("acquire.lua")


class RedisCreditStore(ScriptStore):
    def __init__(
        self,
        url: str,
        *,
        prefix: str = "floorguard",
        timeout_s: float = 0.25,
        connect_timeout_s: float | None = None,
        max_connections: int = 64,
        pool_timeout_s: float = 0.1,
        clock: Literal["server", "caller"] = "server",
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.clock = clock
        options: dict[str, Any] = {
            "max_connections": max_connections,
            "socket_timeout": timeout_s,
            "socket_connect_timeout": connect_timeout_s if connect_timeout_s else timeout_s,
        }
        self._client, self._async_client, self._sentinels = _clients(url, options, pool_timeout_s)
        self._script = self._client.register_script(SCRIPT)
        self._async_script = self._async_client.register_script(SCRIPT)
        self._tokens = itertools.count()
        self._token_base = uuid.uuid4().hex

    def register_async(self, script: str) -> Callable[..., Awaitable[Any]]:
        """Another Lua script on this store's asyncio client (its pool and timeouts),
        called as `await run(keys=…, args=…)`; `StoreUnavailable` when Redis cannot answer."""
        registered = self._async_client.register_script(script)

        async def run(*, keys: list[str], args: list[Any]) -> Any:
            try:
                return await registered(keys=keys, args=args)
            except _UNREACHABLE as exc:
                raise _unavailable(exc) from exc

        return run

    def keys(self, tenant: str) -> list[str]:
        counter = f"{self.prefix}:{{{tenant}}}"
        return [counter, f"{counter}:gen"]

    def _args(  # noqa: PLR0917  # the script's argument list, in its order
        self,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        mode: Mode,
        now: float,
        seen: str,
        carry: Carry,
        floor: int | None,
        op: str,
        retry_of: int | None,
    ) -> list[str | int]:
        at = repr(now) if self.clock == "caller" else ""
        token = f"{self._token_base}:{next(self._tokens)}"
        return [
            weight,
            capacity,
            repr(schedule.window_s),
            repr(schedule.origin_at),
            mode,
            at,
            seen,
            token,
            carry.window,
            carry.shared,
            carry.local,
            self._token_base,
            capacity if floor is None else floor,
            op,
            "" if retry_of is None else retry_of,
            carry.encoded(),
        ]

    def call(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        mode: Mode = "take",
        seen: str = "",
        carry: Carry = NO_CARRY,
        floor: int | None = None,
        op: str = "",
        retry_of: int | None = None,
    ) -> Reply:
        """One EVALSHA (blocking); `StoreUnavailable` when Redis cannot answer."""
        args = self._args(weight, capacity, schedule, mode, now, seen, carry, floor, op, retry_of)
        try:
            return _reply(self._script(keys=self.keys(key), args=args))
        except _UNREACHABLE as exc:
            raise _unavailable(exc) from exc

    async def call_async(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        mode: Mode = "take",
        seen: str = "",
        carry: Carry = NO_CARRY,
        floor: int | None = None,
        op: str = "",
        retry_of: int | None = None,
    ) -> Reply:
        """One EVALSHA on the asyncio client; `StoreUnavailable` when Redis cannot answer."""
        args = self._args(weight, capacity, schedule, mode, now, seen, carry, floor, op, retry_of)
        try:
            return _reply(await self._async_script(keys=self.keys(key), args=args))
        except _UNREACHABLE as exc:
            raise _unavailable(exc) from exc

    async def eviction_risk(self) -> str | None:
        """Why the floor's keys could vanish from this Redis while it runs (its
        `maxmemory-policy` evicts keys under a `maxmemory` limit), or None where they
        cannot. Every floor counter has a TTL, so `volatile-*` policies evict them as
        surely as `allkeys-*`; only `noeviction` (or no limit) keeps them. A Redis that
        refuses `CONFIG GET` (a managed one may) says so, and is taken as unknown."""
        try:
            policy = await self._async_client.config_get("maxmemory-policy")
            limit = await self._async_client.config_get("maxmemory")
        except redis.ResponseError as exc:
            return f"unknown: CONFIG GET is refused here ({exc}); set maxmemory-policy noeviction"
        except _UNREACHABLE as exc:
            raise _unavailable(exc) from exc
        name = _text(_first(policy.get("maxmemory-policy", "noeviction")))
        maxmemory = int(_text(_first(limit.get("maxmemory", "0"))) or 0)
        if name == "noeviction" or maxmemory == 0:
            return None
        return (
            f"maxmemory-policy {name} with maxmemory {maxmemory}: Redis evicts keys under "
            "memory pressure, and an evicted floor counter re-grants a window's floor"
        )

    async def restart_risk(self) -> str | None:
        """What a restart of this Redis costs the floor, or None where nothing: without an
        append-only file a restart is a lost state (`generation.lua`: each tenant's window
        that meets it is closed to fresh takes); with `appendfsync` other than `always` a
        crash may lose the last second's takes, which are then granted again. None too
        where `CONFIG GET` is refused (a managed Redis: its failover is a lost state
        anyway)."""
        try:
            aof = await self._async_client.config_get("appendonly")
            fsync = await self._async_client.config_get("appendfsync")
        except redis.ResponseError:
            return None
        except _UNREACHABLE as exc:
            raise _unavailable(exc) from exc
        if _text(_first(aof.get("appendonly", "no"))) != "yes":
            return (
                "appendonly no: a restart of this Redis is a lost state (each tenant's "
                "window that meets it is closed to fresh takes); set appendonly yes, "
                "appendfsync always"
            )
        policy = _text(_first(fsync.get("appendfsync", "everysec")))
        if policy != "always":
            return (
                f"appendfsync {policy}: a crash may lose the last takes before it, and the "
                "floor grants them again; set appendfsync always"
            )
        return None

    async def existing(self, keys: list[str]) -> list[str]:
        """Which of `keys` exist (one EXISTS each: a cluster may keep them in different
        slots)."""
        try:
            found = [key for key in keys if await self._async_client.exists(key)]
        except _UNREACHABLE as exc:
            raise _unavailable(exc) from exc
        return found

    def close(self) -> None:
        """Close the blocking client (a store never used asynchronously needs no more)."""
        self._client.close()
        for client in self._sentinels[0].sentinels if self._sentinels else ():
            client.close()

    async def subscribe(
        self,
        channel: str,
        on_message: Callable[[str], None],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        """Hand each message published on `channel` (its text) to `on_message`, until
        cancelled. A lost connection is opened again, `sleep(0.5)` apart while Redis cannot
        be reached; what was published meanwhile is lost (its readers must learn it another
        way: `SlotLeases` finds a lost hand-over at its next renewal)."""
        while True:
            pubsub = self._async_client.pubsub()
            try:
                await pubsub.subscribe(channel)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        on_message(_text(message["data"]))
            except _UNREACHABLE:
                await sleep(0.5)
            finally:
                with contextlib.suppress(*_UNREACHABLE):
                    await pubsub.aclose()

    async def aclose(self) -> None:
        """Close both clients, on the event loop the asyncio client ran on."""
        await self._async_client.aclose()
        for client in self._sentinels[1].sentinels if self._sentinels else ():
            await client.aclose()
        self.close()


def _nodes(hosts: str) -> list[tuple[str, int]]:
    out = []
    for node in hosts.split(","):
        host, _, port = node.rpartition(":")
        out.append((host or "127.0.0.1", int(port)))
    return out


def _clients(
    url: str, options: dict[str, Any], pool_timeout_s: float
) -> tuple[Any, Any, tuple[Any, ...]]:
    """The blocking and asyncio clients for `url`: `redis://` or `rediss://` (one server,
    over a bounded blocking pool), `redis+cluster://host:port[,host:port…]` (a Redis
    Cluster: a tenant's two keys share one hash slot), or
    `redis+sentinel://host:port[,host:port…]/service[/db]` (the master Sentinel names);
    then the (blocking, asyncio) Sentinel objects whose own connections need closing."""
    scheme, _, rest = url.partition("://")
    if scheme == "redis+cluster":
        nodes = _nodes(rest.split("/", 1)[0])
        return (
            redis.cluster.RedisCluster(
                startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in nodes],  # type: ignore[no-untyped-call]
                **options,
            ),
            redis.asyncio.cluster.RedisCluster(
                startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in nodes],
                **options,
            ),
            (),
        )
    if scheme == "redis+sentinel":
        hosts, _, path = rest.partition("/")
        service, _, db = path.partition("/")
        if not service:
            raise ConfigError("store.url", url, "a Sentinel URL names its service: …/service[/db]")
        sentinels = _nodes(hosts)
        timeouts = {k: v for k, v in options.items() if k != "max_connections"}
        node = {**options, "db": int(db or 0)}
        # Through Any: redis-py < 8.2 leaves these constructors untyped, 8.2 types them.
        sync_sentinel: Any = redis.sentinel.Sentinel
        async_sentinel: Any = redis.asyncio.sentinel.Sentinel
        blocking: Any = sync_sentinel(sentinels, sentinel_kwargs=timeouts)
        asynchronous: Any = async_sentinel(sentinels, sentinel_kwargs=timeouts)
        return (
            blocking.master_for(service, **node),
            asynchronous.master_for(service, **node),
            (blocking, asynchronous),
        )
    return (
        redis.Redis.from_pool(
            redis.BlockingConnectionPool.from_url(url, timeout=pool_timeout_s, **options)
        ),
        redis.asyncio.Redis.from_pool(
            redis.asyncio.BlockingConnectionPool.from_url(url, timeout=pool_timeout_s, **options)
        ),
        (),
    )


_NOT_SENT = ("connecting", "No connection available", "Connection refused")
"""What redis-py says when a call never reached Redis: no connection could be opened or
taken from the pool (its messages; the only module that reads them)."""


def _unavailable(exc: BaseException) -> StoreUnavailable:
    """The client's error as `StoreUnavailable`, saying whether the call may have run."""
    text = str(exc)
    return StoreUnavailable(text, sent=not any(mark in text for mark in _NOT_SENT))


def _first(value: Any) -> Any:
    """A cluster client's `CONFIG GET` may answer per node (a list): the first one's."""
    return value[0] if isinstance(value, list) and value else value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reply(reply: Any) -> Reply:
    granted, index, remaining, generation, clock_s, restored, closed, floor, replayed, unsure = (
        reply
    )
    return Reply(
        Grant(bool(granted), int(index), int(remaining), int(floor)),
        _text(generation),
        float(_text(clock_s)),
        int(restored),
        bool(closed),
        bool(replayed),
        bool(unsure),
    )
