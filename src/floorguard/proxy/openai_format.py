"""The few OpenAI-compatible shapes the guard and the emulator produce themselves."""

from __future__ import annotations

import json
import time
from typing import Any

__all__ = ["completion_body", "error_body", "stream_chunk"]


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
