"""`Deadline` keeps `asyncio.timeout`'s contract on a loop it is given: each case runs
under both and must end alike."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from floorguard.proxy.edge.deadline import Deadline

Timed = Callable[[asyncio.AbstractEventLoop, float], AbstractAsyncContextManager[Any]]

BOTH: dict[str, Timed] = {
    "asyncio.timeout": lambda _loop, s: asyncio.timeout(s),
    "Deadline": Deadline,
}


def _outcome(timed: Timed, body: Callable[[Timed], Any]) -> tuple[str, int]:
    """What the task's body ended with, and the task's count of cancellations left."""

    async def main() -> tuple[str, int]:
        async def task_body() -> str:
            try:
                return str(await body(timed))
            except TimeoutError:
                return "TimeoutError"

        task = asyncio.ensure_future(task_body())
        try:
            said = await task
        except asyncio.CancelledError:
            said = "CancelledError"
        return said, task.cancelling()

    return asyncio.run(main())


async def _expires(timed: Timed) -> str:
    async with timed(asyncio.get_running_loop(), 0.01) as deadline:
        await asyncio.sleep(1)
    return f"not expired ({deadline})"


async def _in_time(timed: Timed) -> str:
    async with timed(asyncio.get_running_loop(), 1.0):
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.02)  # a timer left armed would cancel this
    return "done"


async def _already_past(timed: Timed) -> str:
    async with timed(asyncio.get_running_loop(), 0.0):
        await asyncio.sleep(0)
    return "not expired"


async def _cancelled_from_outside(timed: Timed) -> str:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().call_later(0.01, task.cancel)
    async with timed(asyncio.get_running_loop(), 1.0):
        await asyncio.sleep(1)
    return "not cancelled"


async def _expired_and_cancelled_at_once(timed: Timed) -> str:
    """The deadline passes and another cancellation comes before the task runs: the other
    cancellation is not turned into a TimeoutError."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    async with timed(loop, 0.01):
        loop.call_later(0.01, task.cancel)
        await asyncio.sleep(1)
    return "neither"


async def _inner_expires(timed: Timed) -> str:
    loop = asyncio.get_running_loop()
    async with timed(loop, 1.0):
        try:
            async with timed(loop, 0.01):
                await asyncio.sleep(1)
        except TimeoutError:
            await asyncio.sleep(0.001)
            return "inner TimeoutError, outer untouched"
    return "no timeout"


CASES = [_expires, _in_time, _already_past, _cancelled_from_outside,
         _expired_and_cancelled_at_once, _inner_expires]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_a_deadline_ends_as_asyncio_timeout_ends(case: Callable[[Timed], Any]) -> None:
    """Each case ends the same way, with the same cancellations left, under both."""
    reference = _outcome(BOTH["asyncio.timeout"], case)
    assert _outcome(BOTH["Deadline"], case) == reference
    assert reference[0] in {"TimeoutError", "done", "CancelledError",
                            "inner TimeoutError, outer untouched"}  # fmt: skip


def test_a_deadline_says_it_expired_and_needs_a_task() -> None:
    """`expired` as asyncio's; outside a task it refuses, as asyncio's does."""

    async def expired() -> bool:
        deadline = Deadline(asyncio.get_running_loop(), 0.0)
        with pytest.raises(TimeoutError):
            async with deadline:
                await asyncio.sleep(1)
        return deadline.expired

    assert asyncio.run(expired())
    loop = asyncio.new_event_loop()
    entering = Deadline(loop, 1.0).__aenter__()
    try:
        with pytest.raises(RuntimeError, match="inside a task"):
            entering.send(None)  # stepped by hand: no task
    finally:
        entering.close()
        loop.close()
