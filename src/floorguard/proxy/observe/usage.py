"""Usage as the backend reports it: the prompt and completion tokens of each
reply, for the access log, the `floorguard_tokens_total` counter and `floorguard usage`.

A JSON reply carries `usage`. A stream carries it only when asked: the guard asks the
backend for it on every stream (`stream_options.include_usage`, normalize.py) and, where the
client did not ask, takes the usage-only event out of the client's stream (`UsageTap`), so
a client sees the stream it asked for and the operator still counts what it cost.

A reply that ends without usage still cost tokens, and is billed an **estimate**, marked as
one (`Usage.estimated`): a stream that ended before its usage event (the client left, the
backend broke, the guard cut it) is billed the prompt as metered and one completion token
per event read from the backend (vLLM sends one a token; a chat stream's opening role
event counts too); a backend that finishes a reply without usage (`unreported`) the same,
or the metered cap `ℓ` for a whole JSON reply — and the guard warns about that backend.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson
from aiohttp import web

__all__ = ["USAGE", "MalformedReplyError", "Usage", "UsageTap", "is_sse", "reply_usage", "usage_of"]


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int
    estimated: str | None = None
    """None: the backend reported it; `cut` (the reply ended before its usage) or
    `unreported` (the backend finished without one): the guard's estimate."""

    def as_line(self) -> dict[str, Any]:
        """For the access log: the reported counts, and `estimated` only where it is one."""
        line: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }
        if self.estimated is not None:
            line["estimated"] = self.estimated
        return line


USAGE: web.RequestKey[Usage] = web.RequestKey("floorguard.usage", Usage)
"""The request's usage, once its reply gave one (the access log reads it)."""

_MARK = b'"usage"'
_EVENT_END = b"\n\n"


def usage_of(data: Any) -> Usage | None:
    """The `usage` of a decoded reply or chunk; None where it has none or a malformed one
    (a backend's bad number is not counted, never a failure of the request)."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    # an embedding's usage has no completion_tokens: it produced none
    embedding = isinstance(data.get("data"), list) and "choices" not in data
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens", 0 if embedding else None)
    if type(prompt) is not int or type(completion) is not int or min(prompt, completion) < 0:
        return None
    return tuple.__new__(Usage, (prompt, completion, None))  # not its interpreted `__new__`


class MalformedReplyError(ValueError):
    """A backend's 200 whose body is not its endpoint's reply (a 502 to the client)."""


def reply_usage(body: bytes) -> Usage | None:
    """A whole reply's usage (None where it reports none, or a malformed one);
    `MalformedReplyError` where the body is not a reply at all: a JSON object with a
    `choices` list, as both completion endpoints answer, or a `data` list (embeddings)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise MalformedReplyError("not JSON") from None
    if not isinstance(data, dict) or not (
        isinstance(data.get("choices"), list) or isinstance(data.get("data"), list)
    ):
        raise MalformedReplyError("no choices")
    return usage_of(data)


_SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")


def is_sse(first: bytes) -> bool:
    """Whether a stream's first chunk opens a server-sent event stream (its first line a
    field or a comment), not an error page or plain text."""
    return first.lstrip(b"\r\n").startswith(_SSE_FIELDS)


class UsageTap:
    """Reads a server-sent event stream on its way to the client: keeps the last usage it
    carries and, with `strip`, drops the events that carry only usage (no choices) — the
    ones the guard asked for on the client's behalf. Whole events are passed on (a partial
    one waits for its end); a chunk of whole events without usage passes as it came."""

    __slots__ = ("_pending", "ended", "events", "strip", "usage")

    def __init__(self, *, strip: bool) -> None:
        self.strip = strip
        self.usage: Usage | None = None
        self.events = 0
        """Whole events read from the backend (the estimate's completion tokens)."""
        self.ended = False
        """The backend finished the stream (set by its reader)."""
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of `chunk` (and what was held before it) goes to the client now."""
        if not self._pending and chunk.endswith(_EVENT_END) and _MARK not in chunk:
            self.events += chunk.count(_EVENT_END)  # JSON data holds no raw newline
            return chunk  # the common case: whole events, no usage
        data = self._pending + chunk
        self.events += data.count(_EVENT_END)  # what is held has no event end
        cut = data.rfind(_EVENT_END)
        if cut < 0:
            self._pending = data
            return b""
        whole, self._pending = data[: cut + 2], data[cut + 2 :]
        if _MARK not in whole:
            return whole
        return b"".join(self._read(event) for event in whole.split(_EVENT_END)[:-1])

    def flush(self) -> bytes:
        """At the end of the stream: what is still held (a last event without its end)."""
        rest, self._pending = self._pending, b""
        return self._read(rest)[:-2] if _MARK in rest else rest

    def _read(self, event: bytes) -> bytes:
        """One event (without its blank line), back with it — or nothing, if stripped."""
        if _MARK in event:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                try:
                    data = orjson.loads(line[5:])
                except orjson.JSONDecodeError:
                    continue
                usage = usage_of(data)
                if usage is not None:
                    self.usage = usage
                    if self.strip and isinstance(data, dict) and not data.get("choices"):
                        return b""
        return event + _EVENT_END
