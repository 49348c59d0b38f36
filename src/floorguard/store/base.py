"""The `CreditStore` interface: the atomic part of the reservation meter (STYLE §3).

The meter decides policy; a store only performs one atomic operation per admission:
"in the window that holds this instant, take `weight` of `capacity` credits if they fit".
It answers granted/denied and the window index it used, so a remote store that reads its
own clock (Redis `TIME`, a later issue) slots in without the meter changing.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Generator
from typing import Any, NamedTuple, TypeVar

from floorguard.windows import WindowSchedule

__all__ = ["CreditStore", "Grant", "Plan", "StoreUnavailable", "run_plan", "run_plan_async"]

_T = TypeVar("_T")

Plan = Generator[Any, Any, _T]
"""A store policy's decision without I/O: it yields each store call and is sent the reply
(or the `StoreUnavailable` the call raised), or yields a backoff (a float, seconds) and is
sent None; it returns the decision. `run_plan` and `run_plan_async` are its shells."""


class StoreUnavailable(Exception):  # noqa: N818  # a state, as the policies name it
    """The store could not answer a call (unreachable, timed out, refused): the caller's
    fallback policy decides. The only store error the rest of floorguard catches; the
    Redis store turns its client's errors into it."""


class Grant(NamedTuple):
    granted: bool
    window_index: int
    """The window `k` the credits were taken from (or would have been)."""
    remaining: int
    """Credits left in that window after this call."""
    floor: int | None = None
    """The window's floor as a shared store pinned it at the window's first take (the
    `floor` of the replica that took first); None: the caller's own governs."""


class CreditStore(ABC):
    """Per-key, per-window credit counters with one atomic take-if-fits operation."""

    @abstractmethod
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
        """Take `weight` credits from `key`'s current window if `used + weight ≤ capacity`.

        `now` is the caller's clock; a store with an authoritative clock of its own may use
        that instead, and reports the window it used in the grant. `floor`: the contract's
        `B` (≥ `capacity`); a store several replicas share may pin the window's floor to
        the first caller's and judge later calls against it (`Grant.floor`).
        """

    @abstractmethod
    def remaining(self, key: str, capacity: int, schedule: WindowSchedule, now: float) -> int:
        """Credits left for `key` in the window that holds `now` (read-only)."""


def run_plan(
    plan: Plan[_T], call: Callable[[Any], Any], sleep: Callable[[float], None] = time.sleep
) -> _T:
    """Run `plan` with synchronous I/O: `call(step)` answers each store call."""
    answer: Any = None
    try:
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(step, float):
                sleep(step)
                answer = None
                continue
            try:
                answer = call(step)
            except StoreUnavailable as exc:
                answer = exc
    finally:
        plan.close()  # a call that raised anything else: the plan's cleanup still runs


async def run_plan_async(plan: Plan[_T], call: Callable[[Any], Awaitable[Any]]) -> _T:
    """Run `plan` on the event loop: `await call(step)` answers each store call. Cancelled
    mid-call, the plan is closed (its cleanup runs) and the cancellation goes on."""
    answer: Any = None
    try:
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(step, float):
                await asyncio.sleep(step)
                answer = None
                continue
            try:
                answer = await call(step)
            except StoreUnavailable as exc:
                answer = exc
    finally:
        plan.close()
