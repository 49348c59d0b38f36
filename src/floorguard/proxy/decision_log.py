"""The guard server's decision log: the simulator's JSONL trace schema, written off the
request path.

Events are kept as tuples while a request is served and serialized in batches: every
`flush_s` by the server's timer, when `max_pending` pile up, and at shutdown. A crash loses
at most the last `flush_s` of lines; a clean stop loses none (`floorguard verify` then sees
every request end).
"""

from __future__ import annotations

from pathlib import Path

from floorguard.core.events import TraceEvent, to_json

__all__ = ["DecisionLog"]


class DecisionLog:
    def __init__(self, path: Path, *, max_pending: int = 4096) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._pending: list[TraceEvent] = []
        self._max_pending = max_pending

    def append(self, event: TraceEvent) -> None:
        self._pending.append(event)
        if len(self._pending) >= self._max_pending:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._file.write("".join(to_json(event) + "\n" for event in pending))
        self._file.flush()

    def close(self) -> None:
        self.flush()
        self._file.close()
