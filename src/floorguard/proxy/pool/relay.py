"""Reply bytes held for clients, bounded (a slow reader must not hold a slot).

The backend is read at the backend's pace into a `ReplyBox`, one per request; the client
is written from it. A slot's lifetime therefore ends when the backend's work ends, whatever
the client does. What the client has not taken yet is bounded twice:

* per request (`limits.max_buffered_reply_bytes` for a stream; a non-streamed reply is held
  whole, up to `limits.max_response_bytes`): a client that falls further behind is cut,
  `client_too_slow`;
* across the edge (`limits.max_held_reply_bytes`): past it, the box holding the most is cut,
  `reply_buffer_full` (the slowest reader pays, not the request that happened to arrive).

Cutting aborts the client's connection, so a writer blocked on it wakes at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["HeldReplies", "ReplyBox"]


class HeldReplies:
    """The edge's count of reply bytes held for clients, and its bound."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self.num_cut = 0
        """Boxes cut since start (either bound)."""
        self._boxes: set[ReplyBox] = set()

    def __len__(self) -> int:
        """Replies open now."""
        return len(self._boxes)

    def box(self, limit_bytes: int, on_cut: Callable[[], None] | None = None) -> ReplyBox:
        """A box for one reply; `on_cut` runs once if it is cut (abort the client)."""
        box = ReplyBox(self, limit_bytes, on_cut)
        self._boxes.add(box)
        return box

    def stop_all(self, code: str, message: str) -> None:
        """End every reply now with `code` (the drain deadline): what is buffered is
        dropped, each writer ends its stream with the error event."""
        for box in list(self._boxes):
            box.stop(code, message)

    def _grew(self, box: ReplyBox) -> None:
        while self.held_bytes > self.limit_bytes and self._boxes:
            max(self._boxes, key=lambda b: b.held_bytes).cut("reply_buffer_full")
        if box.held_bytes > box.limit_bytes:
            box.cut("client_too_slow")

    def _forget(self, box: ReplyBox) -> None:
        self._boxes.discard(box)
        self.held_bytes -= box.held_bytes
        box.held_bytes = 0


class ReplyBox:
    """One reply's bytes between the backend and its client: `put` at the backend's pace,
    `get` at the client's; `finish` marks the end (with an error, if the backend failed)."""

    def __init__(
        self, owner: HeldReplies, limit_bytes: int, on_cut: Callable[[], None] | None
    ) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self.cut_reason: str | None = None
        """Why the client was cut (`client_too_slow`, `reply_buffer_full`); None: not cut."""
        self.failure: tuple[str, str] | None = None
        """The backend's failure (code, message) that ends the reply, if any."""
        self._owner = owner
        self._on_cut = on_cut
        self._chunks: deque[bytes] = deque()
        self._finished = False
        self._stopped = False
        self._ready: asyncio.Event | None = None
        """Set when there is news for a writer waiting in `get`; made by the first such
        wait (a non-streamed reply is never waited on: an Event costs ≈ 3,000 instructions
        a request to make and set)."""

    @property
    def finished(self) -> bool:
        return self._finished

    def put(self, chunk: bytes) -> bool:
        """Hold `chunk` for the client; False once the box is cut or stopped (stop
        reading)."""
        if self.cut_reason is not None or self._stopped:
            return False
        self._chunks.append(chunk)
        self.held_bytes += len(chunk)
        self._owner.held_bytes += len(chunk)
        self._wake()
        self._owner._grew(self)
        return self.cut_reason is None

    def stop(self, code: str, message: str) -> None:
        """End the reply here, whatever the backend is still sending (`put` refuses more)."""
        self._stopped = True
        self._chunks.clear()
        self._owner._forget(self)
        self.finish((code, message))

    def finish(self, failure: tuple[str, str] | None = None) -> None:
        self.failure = failure
        self._finished = True
        self._wake()

    def _wake(self) -> None:
        if self._ready is not None:
            self._ready.set()

    def finish_with(self, reading: asyncio.Future[Any]) -> None:
        """The reading task's done callback: end the box if the reading ended without
        saying so (a fault inside it; the writer re-raises it)."""
        if not self._finished:
            self.finish()

    async def get(self) -> bytes | None:
        """The next chunk for the client; None at the end (or once cut)."""
        while not self._chunks:
            if self._finished or self.cut_reason is not None:
                return None
            if self._ready is None:
                self._ready = asyncio.Event()
            self._ready.clear()
            await self._ready.wait()
        chunk = self._chunks.popleft()
        self.held_bytes -= len(chunk)
        self._owner.held_bytes -= len(chunk)
        return chunk

    def whole(self) -> bytes:
        """Everything held, joined once and kept as one chunk (`take_all` then costs
        nothing more)."""
        if len(self._chunks) > 1:
            joined = b"".join(self._chunks)
            self._chunks.clear()
            self._chunks.append(joined)
        return self._chunks[0] if self._chunks else b""

    def take_all(self) -> bytes:
        """Everything held, at once (a non-streamed reply, read whole); still counted
        until `close`."""
        return b"".join(self._chunks)

    def cut(self, reason: str) -> None:
        if self.cut_reason is not None:
            return
        self.cut_reason = reason
        self._owner.num_cut += 1
        self._chunks.clear()
        self._owner._forget(self)
        self._wake()
        if self._on_cut is not None:
            self._on_cut()

    def close(self) -> None:
        """The reply is done with: its bytes are no longer held."""
        self._chunks.clear()
        self._owner._forget(self)
