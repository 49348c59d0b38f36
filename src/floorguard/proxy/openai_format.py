"""The few OpenAI-compatible shapes the guard and the emulator produce themselves."""

from __future__ import annotations

import json
import time
from typing import Any

import orjson

__all__ = ["BadRequestError", "completion_body", "error_body", "parse_body", "stream_chunk"]


def error_body(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    """OpenAI-style error object with a machine-readable `type`."""
    return {"error": {"type": kind, "message": message, **extra}}


def completion_body(
    request_id: str,
    model: str,
    chat: bool,
    text: str,
    *,
    completion_tokens: int,
    prompt_tokens: int = 0,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def stream_chunk(
    request_id: str, model: str, chat: bool, text: str, finish_reason: str | None = None
) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    body = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class BadRequestError(Exception):
    """A request body the guard refuses before it reaches the core (400/413)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def parse_body(
    raw: bytes, *, max_tokens_cap: int, default_max_tokens: int
) -> tuple[dict[str, Any], int]:
    """The body as a JSON object and its output-token cap (`max_tokens`, else
    `max_completion_tokens`, else the default; null means the default). Anything else is a
    BadRequestError naming what is wrong; nothing else is ever raised."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(400, "invalid_json", f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequestError(400, "invalid_request", "the body must be a JSON object")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens
    if type(max_tokens) is not int or not 1 <= max_tokens <= max_tokens_cap:
        raise BadRequestError(
            400,
            "invalid_max_tokens",
            f"max_tokens = {max_tokens!r:.40}: must be an integer in [1, {max_tokens_cap}]",
        )
    if not isinstance(body.get("stream", False), bool):
        raise BadRequestError(400, "invalid_request", "stream must be true or false")
    return body, max_tokens
