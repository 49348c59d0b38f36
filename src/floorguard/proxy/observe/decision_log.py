"""The guard server's decision log (the simulator's JSONL trace schema) and access log (one
JSON line per request), written off the request path.

Lines are kept while a request is served and written in batches: every `flush_s` by the
server's timer, when `max_pending` pile up, and at shutdown. A crash loses at most the
last `flush_s` of lines; a clean stop loses none (`floorguard verify` then sees every
request end).

Rotation (`decision_log_rotate`): when the file has grown past `max_bytes`, or was opened
more than `max_age_s` ago, it is renamed `FILE.<UTC time>-<n>` at a batch boundary and a
new FILE begins. The segments are one log: `floorguard verify FILE --rotated` reads them
in order, then FILE (only the first segment holds the `config` line).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import IO

from floorguard.clock import Clock, WallClock
from floorguard.core.events import TraceEvent, to_json

__all__ = ["DecisionLog", "LineLog", "rotated_segments"]


_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}
"""What `str.splitlines` (and JavaScript) break a line at beyond `\\n` and the control
characters JSON escapes anyway, written as JSON escapes: same strings, one line each."""


def _line_safe(text: str) -> str:
    """JSON lines safe for any line splitter: a client's U+2028 in a model name split a
    line for readers that use `splitlines`. One scan of the batch when absent."""
    if "\u2028" in text or "\u2029" in text or "\x85" in text:
        return text.translate(_LINE_BREAKS)
    return text


def _ends_torn(path: Path) -> bool:
    """Whether the file's last line lacks its newline (its writer died mid-write)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


class LineLog:
    """Lines to a file (appended) or to stdout (`-`), in batches, optionally rotated."""

    def __init__(
        self,
        path: Path | str,
        *,
        max_pending: int = 4096,
        max_bytes: int | None = None,
        max_age_s: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._path = None if str(path) == "-" else Path(path)
        self._clock: Clock = WallClock() if clock is None else clock
        """Seconds since the epoch: a segment's age and its rotated file's name."""
        self._pending: list[str] = []
        self._max_pending = max_pending
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._rotations = 0
        self._file: IO[str] = sys.stdout
        self._opened_at = 0.0
        self._open()

    def _open(self) -> None:
        if self._path is not None:
            torn = _ends_torn(self._path)
            self._file = self._path.open("a", encoding="utf-8")
            if torn:  # a writer killed mid-line: end its line, so ours start on their own
                self._file.write("\n")
        self._opened_at = self._clock.now()

    def append_line(self, line: str) -> None:
        self._pending.append(line)
        if len(self._pending) >= self._max_pending:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._file.write(_line_safe("".join(line + "\n" for line in pending)))
        self._file.flush()
        if self._path is not None and self._due():
            self._rotate()

    def _due(self) -> bool:
        if self._max_bytes is not None and self._file.tell() >= self._max_bytes:
            return True
        age_s = self._clock.now() - self._opened_at
        return self._max_age_s is not None and age_s >= self._max_age_s

    def _rotate(self) -> None:
        assert self._path is not None
        self._file.close()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock.now()))
        while True:  # never over an older segment (another run's, in the same second)
            self._rotations += 1
            target = Path(f"{self._path}.{stamp}-{self._rotations:04d}")
            if not target.exists():
                break
        os.replace(self._path, target)
        self._open()

    def close(self) -> None:
        self.flush()
        if self._path is not None:
            self._file.close()


class DecisionLog(LineLog):
    """Trace events, serialized only when a batch is written."""

    def __init__(
        self,
        path: Path | str,
        *,
        max_pending: int = 4096,
        max_bytes: int | None = None,
        max_age_s: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            path, max_pending=max_pending, max_bytes=max_bytes, max_age_s=max_age_s, clock=clock
        )  # spelled out: a compiled build's `super().__init__(**options)` takes the dict
        # for the first keyword (mypyc: "int object expected; got dict")
        self._events: list[TraceEvent] = []

    def append(self, event: TraceEvent) -> None:
        self._events.append(event)
        if len(self._events) >= self._max_pending:
            self.flush()

    def flush(self) -> None:
        if self._events:
            events, self._events = self._events, []
            self._pending.extend(to_json(event) for event in events)
        super().flush()


def rotated_segments(path: Path | str) -> list[Path]:
    """The rotated segments of the log at `path`, oldest first (their names sort by time,
    then by rotation number), then `path` itself if it exists."""
    path = Path(path)
    segments = sorted(
        p for p in path.parent.glob(path.name + ".*") if p.name[len(path.name) + 1 :][:1].isdigit()
    )
    return [*segments, *([path] if path.exists() else [])]
