"""A discrete-event engine on a virtual clock.

Events are kept in a heap keyed `(time, priority, seq)`: earlier time first; at the same
time, lower priority first; at the same time and priority, the order they were scheduled
(`seq` is this engine's own counter, never shared). The simulator's priorities are the
`Priority` constants: at one instant backend completions are handled before arrivals, so a
slot freed at `t` is visible to a request arriving at `t`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from enum import IntEnum
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
        self.now = 0.0
        self.num_handled = 0

    def schedule(self, at: float, priority: int, handler: Handler, payload: Any = None) -> None:
        if at < self.now:
            raise ValueError(f"at = {at!r}: cannot schedule before now ({self.now!r})")
        heapq.heappush(self._heap, (at, priority, next(self._seq), handler, payload))

    def run(self, until: float = float("inf")) -> int:
        """Handle events in order until none is left or the next is after `until`."""
        heap = self._heap
        handled = 0
        while heap and heap[0][0] <= until:
            at, _, _, handler, payload = heapq.heappop(heap)
            self.now = at
            handler(payload, at)
            handled += 1
        self.num_handled += handled
        return handled

    def __len__(self) -> int:
        return len(self._heap)
