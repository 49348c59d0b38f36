"""A discrete-event engine on a virtual clock.

Events are kept in a heap keyed `(time, priority, seq)`: earlier time first; at the same
time, lower priority first; at the same time and priority, the order they were scheduled
(`seq` is this engine's own counter, never shared). The simulator's priorities are the
`Priority` constants: at one instant backend completions are handled before arrivals, so a
slot freed at `t` is visible to a request arriving at `t`.

A run's arrivals are known before it starts and come sorted: `preload` takes them as one
sorted stream (their times and payloads, one handler and priority) that `run` merges with
the heap, instead of pushing every one through it: the heap then holds only what handlers
schedule, a few events per backend, and nothing is allocated per arrival. The order is the
heap's own: a preloaded event counts as scheduled before any other.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from enum import IntEnum
from heapq import heappop, heappush
from typing import Any

__all__ = ["Engine", "Priority"]

Handler = Callable[[Any, float], None]


class Priority(IntEnum):
    FIRST_TOKEN = 0
    COMPLETION = 1
    ARRIVAL = 2


class Engine:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Handler, Any]] = []
        self._seq = itertools.count()
        self._stream: tuple[int, Handler | None, Sequence[float], Sequence[Any]] = (0, None, (), ())
        """Preloaded: (priority, handler, times, payloads)."""
        self._next = 0
        """The first preloaded event not yet handled."""
        self.now = 0.0
        self.num_handled = 0

    def schedule(self, at: float, priority: int, handler: Handler, payload: Any = None) -> None:
        if at < self.now:
            raise ValueError(f"at = {at!r}: cannot schedule before now ({self.now!r})")
        heappush(self._heap, (at, priority, next(self._seq), handler, payload))

    def preload(
        self, priority: int, handler: Handler, times: Sequence[float], payloads: Sequence[Any]
    ) -> None:
        """Schedule `handler(payloads[i], times[i])` for each `i` (`times` sorted), ahead of
        anything scheduled later: the same order as `schedule` on each in turn, before any
        other call. Nothing is allocated per event."""
        if len(self) or self.num_handled:
            raise ValueError("preload() comes before any other event is scheduled or run")
        if len(times) != len(payloads):
            raise ValueError(f"{len(times)} times for {len(payloads)} payloads")
        if len(times) and (times[0] < self.now or any(a > b for a, b in itertools.pairwise(times))):
            raise ValueError("preloaded times must be sorted, from now on")
        self._stream = (priority, handler, times, payloads)

    def run(self, until: float = float("inf")) -> int:
        """Handle events in order until none is left or the next is after `until`."""
        heap = self._heap
        priority, stream_handler, times, payloads = self._stream
        i, n = self._next, len(times)
        handled = 0
        while True:
            if i < n:
                at = times[i]
                # the preloaded event first unless the heap's is strictly earlier in
                # (time, priority): on a tie it was scheduled first (a lower seq)
                if heap and (heap[0][0] < at or (heap[0][0] == at and heap[0][1] < priority)):
                    at, _, _, handler, payload = heap[0]
                    if at > until:
                        break
                    heappop(heap)
                else:
                    if at > until:
                        break
                    handler, payload = stream_handler, payloads[i]  # type: ignore[assignment]
                    i += 1
            elif heap and heap[0][0] <= until:
                at, _, _, handler, payload = heappop(heap)
            else:
                break
            self.now = at
            handler(payload, at)
            handled += 1
        if i == n and n:  # all handled: let go of the handler (it refers back to its owner)
            self._stream, i = (0, None, (), ()), 0
        self._next = i
        self.num_handled += handled
        return handled

    def __len__(self) -> int:
        return len(self._heap) + len(self._stream[2]) - self._next
