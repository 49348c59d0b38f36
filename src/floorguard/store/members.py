"""The live fleet (docs/design.md §14): which guard replicas share this store, so that what depends
on their number — fail-static's ⌊B/N⌋ share, each replica's share of a partitioned
backend, the leases' fallback share ⌊C/N⌋ — follows the replicas that are live, not a
number written in a file.

Each replica beats every `ttl_s / 3` (`members.lua`, one EVALSHA): it announces itself
until `ttl_s` later on the Redis clock and publishes the count its shares follow and
whether what it has in flight fits them (*settled*). The live count is the members whose
entries have not expired. A replica that leaves after its drain is gone at once; one that
dies is gone within `ttl_s` of its last beat, and the others follow at their next beat.

A replica *joins* before it serves: it announces itself and waits (up to `2 · ttl_s`) until
every other member applies a count at least as large and has settled to it, so the shares
of a grown fleet never sum past a backend's slots. While Redis cannot be reached the count
stays what it last was (nothing can be learned; a replica that starts then uses the
configured `store.replicas`).

**A shrinking count is believed only when it is known.** A member that left says so (the
script keeps a record of its leaving for `ttl_s`); one missing without having left is gone
only once its own expiry, as last seen, has passed *and* the store has answered this
replica for a whole `ttl_s` since it last could not (or since it last forgot a member, or
this replica's own entry, however long the store was away):
then a live member would have beaten again. A member missing before its expiry is one the
store forgot — restarted without persistence, flushed, an entry evicted — and stays
counted; so does every member after Redis was paused or unreachable past their expiries,
until they have had a `ttl_s` to announce themselves again. Before this, each replica of
three read a Redis restart or a pause as "1 replica(s) live" and took a whole backend
(21 requests in flight on a 12-slot backend).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from floorguard.clock import Clock, WallClock
from floorguard.store.base import StoreUnavailable
from floorguard.store.redis_store import RedisCreditStore

__all__ = ["Membership", "Roll", "View", "parse_members"]

SCRIPT = resources.files("floorguard.store").joinpath("members.lua").read_text()
log = logging.getLogger("floorguard.members")


@dataclass(frozen=True, slots=True)
class View:
    """What one member applies: the replica count its shares follow, and whether its
    requests in flight fit those shares."""

    count: int
    settled: bool


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Roll:
    """One answer of the script: the Redis clock, every live member's view and expiry,
    and the members that left within the last `ttl_s`."""

    now: float
    views: dict[str, View]
    expiries: dict[str, float]
    left: frozenset[str]
    was_member: bool = True
    """The caller was live in the store before this call."""


def parse_members(reply: list[Any]) -> Roll:
    """The script's reply → the roll."""
    now, flat, left, was_member = reply
    views: dict[str, View] = {}
    expiries: dict[str, float] = {}
    for member, value in zip(flat[0::2], flat[1::2], strict=True):
        count, settled, expiry = _text(value).split("|")
        views[_text(member)] = View(int(count), settled == "1")
        expiries[_text(member)] = float(expiry)
    return Roll(
        float(_text(now)),
        views,
        expiries,
        frozenset(_text(m) for m in left),
        int(was_member) == 1,
    )


def others_settled(views: dict[str, View], me: str, count: int) -> bool:
    """Every other member applies at least `count` replicas and fits its shares."""
    return all(v.count >= count and v.settled for m, v in views.items() if m != me)


class Membership:
    def __init__(
        self,
        store: RedisCreditStore,
        *,
        replica: str,
        group: str = "members",
        ttl_s: float,
        configured: int,
        explicit: bool,
        on_count: Callable[[int], None],
        settled: Callable[[], bool],
        on_return: Callable[[], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        """`group`: the fleet's name in the store (one per pool: `members`, `members:<model>`);
        `clock`: seconds since the epoch, what its beats and waits run on."""
        self.clock: Clock = WallClock() if clock is None else clock
        self.replica = replica
        self.ttl_s = ttl_s
        self.configured = configured
        """`store.replicas`: the count until the fleet is heard from."""
        self.explicit = explicit
        """The configuration names the count: a live count that differs is a warning."""
        self.count = configured
        """The replica count this replica's shares follow (`on_count` applies it)."""
        self.members: dict[str, View] = {}
        self.heard_at: float | None = None
        """When the fleet last answered (wall clock); None: never."""
        self.failures = 0
        self.kept: frozenset[str] = frozenset()
        """Members missing from the store that are still counted (module docstring)."""
        self._expiries: dict[str, float] = {}
        """Each member's expiry as last seen (Redis clock)."""
        self._answering_since: float | None = None
        """Since when (Redis clock) the store has answered every beat and forgotten no
        member; None: its last beat failed."""
        self._on_count = on_count
        self._settled = settled
        self._on_return = on_return
        """Called when a beat succeeds after one failed: Redis is back."""
        self._script = store.register_async(SCRIPT)
        key = f"{store.prefix}:fleet:{{{group}}}"
        self._keys = [key, f"{key}:view", f"{key}:left"]

    @property
    def warning(self) -> str | None:
        if self.explicit and self.heard_at is not None and self.count != self.configured:
            return (
                f"{self.count} replica(s) live, but store.replicas says {self.configured}: "
                "shares follow the live count"
            )
        return None

    async def _call(self, op: str) -> Roll:
        args = [op, self.replica, repr(self.ttl_s), self.count, int(self._settled())]
        reply: list[Any] = await self._script(keys=self._keys, args=args)
        return parse_members(reply)

    async def beat(self) -> bool:
        """Announce this replica and follow the live count; False if Redis did not answer
        (the count stays)."""
        try:
            roll = await self._call("beat")
        except StoreUnavailable as exc:
            self.failures += 1
            self._answering_since = None
            log.warning("membership: heartbeat failed: %s", exc)
            return False
        self.heard_at = self.clock.now()
        if self._answering_since is None and self.failures and self._on_return is not None:
            self._on_return()
        self.members = roll.views
        self.kept = self._still_counted(roll)
        self._follow(max(1, len(roll.views) + len(self.kept)))
        return True

    def _still_counted(self, roll: Roll) -> frozenset[str]:
        """The members missing from `roll` that are not known to be gone (module
        docstring), and the expiries remembered for the next beat."""
        now = roll.now
        missing = {
            m: at
            for m, at in self._expiries.items()
            if m not in roll.views and m not in roll.left and m != self.replica
        }
        forgotten = sorted(m for m, at in missing.items() if at > now)
        # this replica's own entry gone (it had one): the store forgot it, or this replica
        # was away past its own expiry — either way, it has not been watching the others
        lost_self = self.replica in self._expiries and not roll.was_member
        if self._answering_since is None or forgotten or lost_self:
            self._answering_since = now
        if forgotten:
            log.warning(
                "membership: the store forgot %d replica(s) before their time ran out (%s: "
                "restarted, flushed or evicted): they stay counted until they announce "
                "themselves again or %.1f s pass",
                len(forgotten),
                ", ".join(forgotten),
                self.ttl_s,
            )
        settled = now - self._answering_since >= self.ttl_s
        kept = {m: at for m, at in missing.items() if at > now or not settled}
        self._expiries = {**kept, **roll.expiries}
        return frozenset(kept)

    def _follow(self, count: int) -> None:
        if count == self.count:
            return
        was, self.count = self.count, count
        log.info("membership: %d replica(s) live (was %d): shares follow", count, was)
        if self.warning is not None:
            log.warning("membership: %s", self.warning)
        self._on_count(count)

    async def join(self) -> bool:
        """Announce this replica, then wait (up to `2 · ttl_s`) until every other member
        applies the grown count and fits its shares; False if they did not in time (or
        Redis did not answer), and the replica serves anyway on its own share."""
        deadline = self.clock.now() + 2 * self.ttl_s
        while await self.beat():
            if others_settled(self.members, self.replica, self.count):
                return True
            if self.clock.now() >= deadline:
                break
            await self.clock.sleep(min(0.05, self.ttl_s / 20))
        else:
            log.warning(
                "membership: Redis did not answer; the shares follow %d replica(s) "
                "(store.replicas) until it does",
                self.count,
            )
            return False
        log.warning(
            "membership: the other replicas did not settle to %d within %.1f s; serving "
            "on this replica's share",
            self.count,
            2 * self.ttl_s,
        )
        return False

    async def beat_every(self) -> None:
        while True:
            await self.clock.sleep(self.ttl_s / 3)
            await self.beat()

    async def leave(self) -> None:
        """Gone from the fleet at once (after the drain: nothing of this replica runs)."""
        try:
            await self._call("leave")
        except StoreUnavailable as exc:
            log.warning("membership: leaving failed (the entry expires): %s", exc)

    def status(self) -> dict[str, object]:
        return {
            "replica": self.replica,
            "live": self.count,
            "configured": self.configured,
            "members": sorted(self.members),
            "ttl_s": self.ttl_s,
            "heard_at": self.heard_at,
            "failed_beats": self.failures,
            "kept": sorted(self.kept),
            "warning": self.warning,
        }
