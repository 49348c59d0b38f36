"""Fleet-wide slot leases (SPEC §13): at most `C` requests in flight per backend across
every replica, and no opportunistic start on a backend while another replica has a
floor-entitled request waiting for it.

A replica dispatches a request only with a lease on its backend (`lease.lua`, one EVALSHA
per decision): granted iff fewer than `C` leases are live and, for a request that is not
floor-entitled, no other replica's entry on the backend's waiting board is positive. Every
call publishes this replica's count of entitled requests waiting (and a denied entitled
request counts itself), so the board is current after each decision, and a renewal every
`ttl_s / 4` keeps both the leases and the board entry alive. A replica that dies stops
renewing: its leases expire within `ttl_s` of its last renewal (≤ `1.25 · ttl_s` after it
died), and its board entry with them.

When Redis cannot be reached the leases fall back to the partition: a replica grants at
most `⌊C/N⌋` locally on each backend (the fleet stays within `C`), until Redis answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from floorguard.store.base import StoreUnavailable
from floorguard.store.redis_store import RedisCreditStore

__all__ = ["SlotLeases"]

SCRIPT = resources.files("floorguard.store").joinpath("lease.lua").read_text()
log = logging.getLogger("floorguard.leases")


class SlotLeases:
    def __init__(
        self,
        store: RedisCreditStore,
        *,
        backends: Sequence[str],
        capacity: Sequence[int],
        replica: str,
        replicas: int,
        ttl_s: float = 2.0,
        waiting: Callable[[], int],
    ) -> None:
        self.backends = list(backends)
        self.capacity = list(capacity)
        self.replica = replica
        self.replicas = replicas
        self.ttl_s = ttl_s
        self._waiting = waiting
        """This replica's floor-entitled requests queued (the guard's count)."""
        self._script = store.register_async(SCRIPT)
        self._prefix = store.prefix
        self.held: list[dict[str, bool]] = [{} for _ in backends]
        """Per backend: the leases this replica holds (request → through Redis or local)."""
        self.denied: dict[str, int] = {"full": 0, "order": 0}
        self.taking_entitled = 0
        """Entitled requests of this replica whose lease call is in flight: they wait too."""
        self.local_grants = 0

    def _keys(self, backend: int) -> list[str]:
        key = f"{self._prefix}:slots:{{{self.backends[backend]}}}"
        return [key, f"{key}:wait"]

    def _member(self, request_id: str) -> str:
        return f"{self.replica}|{request_id}"

    def waiting(self) -> int:
        """This replica's floor-entitled requests waiting for a slot: queued, or taking a
        lease (the one a call is for is counted by the script if it is denied)."""
        return self._waiting() + self.taking_entitled

    async def _call(
        self,
        backend: int,
        op: str,
        *members: str,
        entitled: bool = False,
        waiting: int | None = None,
    ) -> list[Any]:
        count = self.waiting() if waiting is None else waiting
        args = [op, self.capacity[backend], repr(self.ttl_s), self.replica, count, int(entitled)]
        reply: list[Any] = await self._script(
            keys=self._keys(backend),
            args=[*args, "", *members],  # "": the Redis clock
        )
        return reply

    async def acquire(self, backend: int, request_id: str, *, entitled: bool) -> str:
        """'' when the request may start on `backend` (it holds a lease), else why not:
        `full` (C leases live) or `order` (another replica's entitled request waits)."""
        others = self.waiting()
        self.taking_entitled += entitled
        try:
            granted, reason, *_ = await self._call(
                backend, "acquire", self._member(request_id), entitled=entitled, waiting=others
            )
        except StoreUnavailable:
            if len(self.held[backend]) >= self.capacity[backend] // self.replicas:
                self.denied["full"] += 1
                return "full"
            self.held[backend][request_id] = False
            self.local_grants += 1
            return ""
        finally:
            self.taking_entitled -= entitled
        if granted:
            self.held[backend][request_id] = True
            return ""
        why = reason.decode() if isinstance(reason, bytes) else str(reason)
        self.denied[why] = self.denied.get(why, 0) + 1
        return why

    async def release(self, backend: int, request_id: str, waiting: int | None = None) -> None:
        """Give the lease back (a request that ended); a failed call leaves it to expire.
        `waiting`: this replica's entitled count as of the end (the caller takes it before
        its own queue moves on, so the freed slot is not taken by another replica's
        opportunistic request ahead of this replica's entitled one)."""
        if self.held[backend].pop(request_id, None) is None:
            return
        with contextlib.suppress(StoreUnavailable):
            await self._call(backend, "release", self._member(request_id), waiting=waiting)

    async def renew_every(self) -> None:
        """Keep this replica's leases and waiting-board entries alive (every `ttl_s / 4`)."""
        while True:
            await asyncio.sleep(self.ttl_s / 4)
            for backend in range(len(self.backends)):
                members = [self._member(r) for r, shared in self.held[backend].items() if shared]
                try:
                    await self._call(backend, "renew", *members)
                except StoreUnavailable as exc:
                    log.warning(
                        "slot leases: renewal on %s failed: %s", self.backends[backend], exc
                    )

    def status(self) -> dict[str, object]:
        return {
            "ttl_s": self.ttl_s,
            "held": {b: len(h) for b, h in zip(self.backends, self.held, strict=True)},
            "denied": dict(self.denied),
            "local_grants": self.local_grants,
        }
