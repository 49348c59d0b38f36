"""The access log's line per request (`access_log:`): what the edge saw, and how the guard
ended it — its outcome and reason, and the queue, first-byte, service and total times."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from aiohttp import web

from floorguard.core.events import TraceEvent
from floorguard.proxy.observe.metrics import Timing
from floorguard.proxy.observe.usage import USAGE

__all__ = ["DECISION", "access_line", "error_code"]

DECISION: web.RequestKey[str] = web.RequestKey("floorguard.decision", str)
"""How the pool decided a request (`entitled`, `surplus`, …), set at admission for the
access line, whatever becomes of the response."""


def access_line(
    request: web.Request,
    path: str,
    response: web.StreamResponse | None,
    *,
    status: int,
    ids: tuple[str, str],
    seen: dict[str, Any],
    now: float,
    ended: tuple[Timing, TraceEvent] | None,
) -> str:
    """The request's access-log line: what the edge saw, and how the guard ended it."""
    request_id, rid = ids
    line: dict[str, Any] = {
        "ts": round(now, 6),
        "request_id": request_id,
        "id": rid if ended is not None else None,
        "method": request.method,
        "path": path,
        "remote": request.remote,
        "status": status,
        **seen,
        "decision": (response.headers.get("x-floorguard-decision") if response else None)
        or request.get(DECISION)
        or "refused",
    }
    if ended is not None:
        timing, event = ended
        line["class"] = event.cls.value if event.cls is not None else None
        line["outcome"] = event.kind.value
        line["reason"] = event.reason
        line["backend"] = timing.backend or None

        def ms(since: float | None, until: float | None) -> float | None:
            return round((until - since) * 1e3, 3) if since and until else None

        line["queue_ms"] = ms(timing.admitted_at, timing.dispatched_at)
        line["ttft_ms"] = ms(timing.arrived_at, timing.first_token_at)
        line["service_ms"] = ms(timing.dispatched_at, event.at)
        line["total_ms"] = ms(timing.arrived_at, event.at)
        usage = request.get(USAGE)
        if usage is not None:  # what the backend reported it cost, or the guard's estimate
            line["usage"] = usage.as_line()
            decoded = usage.completion_tokens - 1
            if timing.first_token_at is not None and decoded > 0 and line["ttft_ms"]:
                # time per output token after the first (a streamed reply's)
                line["tpot_ms"] = round((event.at - timing.first_token_at) * 1e3 / decoded, 3)
    elif response is not None and response.status >= 400:
        line["reason"] = error_code(response)
    return str(orjson.dumps({k: v for k, v in line.items() if v is not None}).decode())


def error_code(response: web.StreamResponse) -> str | None:
    """The `error.code` of a JSON error answer (OpenAI's shape); None for anything else."""
    if not isinstance(response, web.Response):
        return None
    with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
        return str(orjson.loads(response.body)["error"]["code"])  # type: ignore[arg-type]
    return None
