"""The seam between the shared floor's policy and a store that runs `acquire.lua`'s
semantics: `ScriptStore`, one `call` per take or peek carrying back what the caller granted
and answering with the grant, the tenant's generation and the clock it used. Two implement
it: `redis_store.RedisCreditStore` (the script on a real Redis, and the only module that
knows Redis's exception types: it raises `StoreUnavailable`) and `simulated.SimulatedClient`
(the same semantics on the caller's clock, for the fleet simulator), held against each other
by the parametrized store suite. `shared.SharedFloor` is written against this seam only."""

from __future__ import annotations

from abc import abstractmethod
from importlib import resources
from typing import Literal, NamedTuple

from floorguard.store.base import CreditStore, Grant
from floorguard.windows import WindowSchedule

__all__ = ["NO_CARRY", "Carry", "Mode", "Reply", "ScriptStore", "lua_script"]

Mode = Literal["take", "peek"]


def lua_script(name: str) -> str:
    """A script of this package as Redis runs it: `generation.lua` (the generation marker
    that names the server that wrote it) in front of the script `name`."""
    here = resources.files("floorguard.store")
    return here.joinpath("generation.lua").read_text() + here.joinpath(name).read_text()


class Carry(NamedTuple):
    """What a call carries back to the tenant's count, for window `window` only."""

    window: int = -1
    shared: int = 0
    """Granted through Redis earlier in the window: re-forced if Redis lost its state."""
    local: int = 0
    """Granted locally while Redis was unreachable: handed back before the take."""
    grants: tuple[tuple[str, int], ...] = ()
    """Those local grants one by one, as (id, weight): a grant whose id the window has
    counted already is not counted again, so a hand-back resent after a call that timed out
    once Redis had run it is counted once (empty: `local` counts as it is)."""

    def encoded(self) -> str:
        """`grants` as the script reads them: `id=weight` pairs, space-separated."""
        return " ".join(f"{grant}={weight}" for grant, weight in self.grants)


NO_CARRY = Carry()


class Reply(NamedTuple):
    grant: Grant
    generation: str
    clock_s: float
    """The clock the script used (Redis `TIME`, or the caller's `now`)."""
    restored: int
    """Credits re-forced because the generation had changed."""
    closed: bool
    """The window is closed to fresh takes: Redis lost the tenant's state in it."""
    replayed: bool = False
    """The call's id was applied before (a retry after a timeout Redis had run): this is
    that first answer, nothing charged again."""
    unsure: bool = False
    """A retry whose first attempt fell in a window that is gone: granted uncharged, in
    that window (the grant's `window_index`)."""


class ScriptStore(CreditStore):
    """A credit store whose every operation is one `acquire.lua` call."""

    url: str
    """Where it is (for the status page and the log); never with a password."""

    @abstractmethod
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
        """One call, blocking; `StoreUnavailable` when the store cannot answer. `op`: the
        call's id (a take with one is applied once: the same id again gets its first
        answer); `retry_of`: for a retry of `op`, the window its first attempt was sent in
        (`acquire.lua`)."""

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
        """One call, awaited; a store with no I/O of its own answers as `call` does."""
        return self.call(
            key,
            weight,
            capacity,
            schedule,
            now,
            mode=mode,
            seen=seen,
            carry=carry,
            floor=floor,
            op=op,
            retry_of=retry_of,
        )

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
        return self.call(key, weight, capacity, schedule, now, floor=floor).grant

    def remaining(self, key: str, capacity: int, schedule: WindowSchedule, now: float) -> int:
        return self.call(key, 0, capacity, schedule, now, mode="peek").grant.remaining
