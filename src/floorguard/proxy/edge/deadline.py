"""`asyncio.timeout` on a loop the caller already holds.

`asyncio.timeout` asks for the running loop three times (the loop's time, the current task,
the timer), and CPython 3.11's `get_running_loop` checks the process id each time: three
`getpid` system calls for every timed wait, five a request with the pump's future and the
body's read (docs/benchmarks.md, "System calls a request"). `Deadline` keeps the same
contract on the loop it is given: the task is cancelled when the deadline passes and the
cancellation leaves the block as `TimeoutError`, while a cancellation from elsewhere
(the client gone, a drain) stays a `CancelledError`.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["Deadline"]


class Deadline:
    """`async with Deadline(loop, timeout_s):` as `async with asyncio.timeout(timeout_s):`,
    inside a task running on `loop`."""

    __slots__ = ("_cancelling", "_expired", "_handle", "_loop", "_task", "_timeout_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self._loop = loop
        self._timeout_s = timeout_s
        self._task: asyncio.Task[object] | None = None
        self._handle: asyncio.Handle | None = None
        self._expired = False
        self._cancelling = 0

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task(self._loop)  # this loop's: no process-id check
        if task is None:
            raise RuntimeError("a Deadline is kept inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if self._timeout_s <= 0:
            self._handle = self._loop.call_soon(self._expire)
        else:
            self._handle = self._loop.call_later(self._timeout_s, self._expire)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        # ours only where no other cancellation came since (asyncio.timeout's rule; the
        # task is uncancelled whatever leaves the block, as there)
        task = self._task
        if (
            self._expired
            and task is not None
            and task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc

    def _expire(self) -> None:
        self._handle = None
        if self._task is not None:
            self._task.cancel()
            self._expired = True

    @property
    def expired(self) -> bool:
        """Whether the deadline passed inside the block (as `asyncio.Timeout.expired`)."""
        return self._expired
