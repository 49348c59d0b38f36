"""The wall-clock driver's pump: any `Stack` on an asyncio loop.

A waiting request awaits its turn (`turn`); whenever the stack's state changes the driver
calls `pump`, which fills freed slots (`poll`) and hands each decision to the request it
is about, and a timer fires at the stack's next wake-up (`next_wake_at`: `expire`, then
`poll`), so a queued request is dropped the moment it is doomed, not when a slot frees, and
a backend held off after a denied slot lease gets its next start when the hold-off ends.
The HTTP guard and the real-backend experiments run their stacks through this one loop.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

from floorguard.clock import Clock, Timer
from floorguard.core.request import RequestId
from floorguard.core.surface import PAST_DOOM_S, Dispatch, Drop, Stack

__all__ = ["CutError", "Pump"]


class CutError(Exception):
    """Raised in a request still waiting for its turn when the drain deadline cuts the
    queue (`Pump.cut_waiting`): its handler answers it (503 `draining`)."""


class Pump:
    def __init__(
        self, stack: Stack, clock: Clock, settle: Callable[[], None] | None = None
    ) -> None:
        self.stack = stack
        self.clock = clock
        self._settle = settle
        """Called after each pump (the fleet's leases hand on what nothing here will take)."""
        self._waiters: dict[RequestId, asyncio.Future[Dispatch | Drop]] = {}
        self._timer: Timer | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop of the first wait, held (`get_running_loop` is a `getpid` call)."""

    async def turn(
        self, request_id: RequestId, checkpoint: Callable[[], Awaitable[None]] | None = None
    ) -> Dispatch | Drop:
        """Wait until the stack starts (`Dispatch`) or drops (`Drop`) this queued request.
        `checkpoint` is awaited after the pump, before the wait (fault injection)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Dispatch | Drop] = loop.create_future()
        self._waiters[request_id] = waiter
        try:
            self.pump()
            if checkpoint is not None:
                await checkpoint()
            return await waiter
        finally:
            self._waiters.pop(request_id, None)

    def pump(self) -> None:
        """Hand freed slots to waiting requests (the stack decides who) and keep the timer
        on the stack's next wake-up."""
        self._resolve(self.stack.poll(self.clock.now()))
        self._arm()
        if self._settle is not None:
            self._settle()

    def cut_waiting(self) -> int:
        """The drain deadline: every request still waiting for its turn gets `CutError` (its
        handler ends it and answers); how many there were."""
        waiters = [w for w in self._waiters.values() if not w.done()]
        for waiter in waiters:
            waiter.set_exception(CutError())
        return len(waiters)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf

    def _resolve(self, decisions: list[Dispatch | Drop] | list[Drop]) -> None:
        for decision in decisions:
            waiter = self._waiters.pop(decision.request.request_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(decision)

    def _arm(self) -> None:
        at = self.stack.next_wake_at()
        if at is None or at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.clock.call_at(at + PAST_DOOM_S, self._on_timer)
        self._timer_at = at

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self._resolve(self.stack.expire(self.clock.now()))
        self.pump()
