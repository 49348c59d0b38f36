"""The few OpenAI-compatible shapes the guard and the emulator produce themselves."""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "completion_body",
    "error_body",
    "error_type",
    "sse_error",
    "stream_chunk",
    "usage_chunk",
]


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    """The OpenAI error `type` for an HTTP status (`server_error` for 5xx)."""
    return _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(
    code: str, message: str, *, status: int = 400, param: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The OpenAI error shape: `message`, `type` (the category, from the status), `code`
    (floorguard's machine-readable reason) and `param` (the body field, where one is at
    fault)."""
    return {
        "error": {
            "message": message,
            "type": error_type(status),
            "code": code,
            "param": param,
            **extra,
        }
    }


def sse_error(code: str, message: str) -> bytes:
    """The SSE event that ends a stream which failed after its response started."""
    return b"data: " + json.dumps(error_body(code, message, status=502)).encode() + b"\n\n"


def completion_body(
    request_id: str,
    model: str,
    chat: bool,
    text: str,
    *,
    completion_tokens: int,
    prompt_tokens: int = 0,
    created_at: float,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(created_at),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def stream_chunk(
    request_id: str,
    model: str,
    chat: bool,
    text: str,
    finish_reason: str | None = None,
    *,
    created_at: float,
) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    body = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(created_at),
        "model": model,
        "choices": [choice],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def usage_chunk(
    request_id: str,
    model: str,
    chat: bool,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    created_at: float,
) -> bytes:
    """The last chunk of a stream asked for `stream_options.include_usage`: no choices,
    the usage (as vLLM and OpenAI send it)."""
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(created_at),
        "model": model,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"
