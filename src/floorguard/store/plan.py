"""A store policy's decision as a plan without I/O, and the two shells that run one: the
synchronous (a simulation, the core's own calls) and the asyncio one (the HTTP guard).
`SharedFloor` and `SlotLeases` decide this way, so the simulator and the server run the
same policy code (a module of its own: the simulator never imports asyncio)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from floorguard.store.base import StoreUnavailable

__all__ = ["Plan", "run_plan", "run_plan_async"]

_T = TypeVar("_T")

Plan = Generator[Any, Any, _T]
"""A store policy's decision without I/O: it yields each store call and is sent the reply
(or the `StoreUnavailable` the call raised), or yields a backoff (a float, seconds) and is
sent None; it returns the decision. `run_plan` and `run_plan_async` are its shells."""


def run_plan(
    plan: Plan[_T],
    call: Callable[[Any], Any],
    sleep: Callable[[float], None] = time.sleep,
    *,
    answer: Any = None,
) -> _T:
    """Run `plan` with synchronous I/O: `call(step)` answers each store call. `answer`: the
    reply to a call the plan already asked for (a driver that answered it itself)."""
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


async def run_plan_async(
    plan: Plan[_T],
    call: Callable[[Any], Awaitable[Any]],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> _T:
    """Run `plan` on the event loop: `await call(step)` answers each store call, `sleep`
    (a driver's clock's) each backoff. Cancelled mid-call, the plan is closed (its cleanup
    runs) and the cancellation goes on."""
    answer: Any = None
    try:
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(step, float):
                await sleep(step)
                answer = None
                continue
            try:
                answer = await call(step)
            except StoreUnavailable as exc:
                answer = exc
    finally:
        plan.close()
