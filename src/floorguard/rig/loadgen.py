"""`floorguard load`: an open-loop load generator. Each request fires at its timestamp
whatever the target does; timings are taken on the client. The results fold into the same
per-request records the simulator's trace gives, so miss, unmet, floor-entitled attainment,
fire-time CV and lag are computed by the same code (`analysis.metrics`).

Statuses map to outcomes: 200 completed, 429 rejected, 503 dropped, any other failed; a
completed request is late if it ended after arrival + the tenant's deadline budget.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import aiohttp
import orjson

from floorguard.analysis.metrics import RunMetrics, measure
from floorguard.analysis.records import RequestRecord, TraceRecords
from floorguard.core.contract import GuardConfig
from floorguard.core.request import Request

__all__ = [
    "Answer",
    "ClientResult",
    "client_records",
    "measure_client",
    "post_completion",
    "refusals",
    "replay",
]

OUTCOMES = {200: "completed", 429: "rejected", 503: "dropped"}
PROMPT_TOKEN_ID = 7
"""The token a request's prompt of `num_prompt_tokens` repeats (any vocabulary has it)."""


@dataclass(frozen=True)
class ClientResult:
    request: Request
    scheduled_at: float
    fired_at: float
    ended_at: float
    status: int
    """HTTP status, or 0 when the connection itself failed."""
    window: int | None = None
    """The guard's window for it (`x-floorguard-window`, on admissions and refusals): the
    floor is counted in the guard's windows where it says, not by the client's clock — a
    request sent at x.999 s reaches the guard in window x+1."""
    reason: str | None = None
    """A refusal's or failure's `error.code` (the guard's, or the backend's), where the
    answer is a JSON error; `connection` when the connection itself failed."""
    first_token_at: float | None = None
    """A streamed answer's first chunk (wall clock); None: not streamed, or no chunk."""


class Answer(NamedTuple):
    status: int
    """HTTP status, 0 when the connection failed."""
    window: int | None
    """The guard's window for it, where it names one (`x-floorguard-window`)."""
    code: str | None
    """The error code of an answer that is not a 200."""
    first_at: float | None = None
    """A streamed answer's first chunk (wall clock)."""


def _error_code(body: bytes) -> str | None:
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code)[:64] if code is not None else None


async def post_completion(
    session: aiohttp.ClientSession,
    url: str,
    request: Request,
    *,
    model: str,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, object] | None = None,
    exact_prompts: bool = False,
) -> Answer:
    """POST `request` as a completion with its output length pinned (`max_tokens` =
    `min_tokens`, `ignore_eos`) and, with `exact_prompts` where it has prompt tokens, a
    prompt of exactly that many (token ids, which an OpenAI-compatible server counts as
    sent; otherwise a short text). With `stream: true` in `extra` the answer is read chunk
    by chunk and its first chunk's instant kept."""
    prompt: str | list[int] = (
        [PROMPT_TOKEN_ID] * request.num_prompt_tokens
        if exact_prompts and request.num_prompt_tokens
        else "floorguard load"
    )
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": request.num_output_tokens,
        "min_tokens": request.num_output_tokens,
        "ignore_eos": True,
        **(extra or {}),
    }
    try:
        async with session.post(url, json=body, headers=dict(headers or {})) as response:
            window = response.headers.get("x-floorguard-window", "")
            first_at = None
            if body.get("stream") and response.status == 200:
                async for line in response.content:
                    if first_at is None and line.startswith(b"data:"):
                        first_at = time.time()
                code = None
            else:
                answer = await response.read()
                code = _error_code(answer) if response.status != 200 else None
            return Answer(
                response.status,
                int(window) if window.lstrip("-").isdigit() else None,
                code,
                first_at,
            )
    except (aiohttp.ClientError, TimeoutError):
        return Answer(0, None, "connection")


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    request: Request,
    scheduled_at: float,
    headers: Mapping[str, str],
    *,
    model: str,
    extra: Mapping[str, object],
    exact_prompts: bool,
) -> ClientResult:
    await asyncio.sleep(max(0.0, scheduled_at - time.time()))
    fired = time.time()
    answer = await post_completion(
        session, url, request, model=model, headers=headers, extra=extra,
        exact_prompts=exact_prompts,
    )  # fmt: skip
    return ClientResult(
        request, scheduled_at, fired, time.time(), *answer[:3], first_token_at=answer.first_at
    )


def refusals(results: Sequence[ClientResult]) -> dict[str, int]:
    """The answers that were not a 200, by `status reason` (`401 invalid_token`, `429
    floor_exhausted`, `0 connection`), most first."""
    counts = Counter(f"{r.status} {r.reason or '-'}" for r in results if r.status != 200)
    return dict(counts.most_common())


async def replay(
    requests: Sequence[Request],
    target: str,
    headers_for: Mapping[str, Mapping[str, str]],
    *,
    start_in_s: float = 0.5,
    start_at: float | None = None,
    model: str = "floorguard",
    body_for: Mapping[str, Mapping[str, object]] | None = None,
    exact_prompts: bool = False,
) -> list[ClientResult]:
    """Fire every request at `start + arrival_at` (wall clock; `start_at`, or `start_in_s`
    from now) against `target`, asking for `model` (a real backend serves only the model
    names it knows); `body_for[tenant]` adds fields to that tenant's bodies (vLLM's
    `priority`, say); `exact_prompts`: see `post_completion`."""
    url = target.rstrip("/") + "/v1/completions"
    start = start_at if start_at is not None else time.time() + start_in_s
    body_for = body_for or {}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        fired = (
            _one(
                session,
                url,
                r,
                start + r.arrival_at,
                headers_for.get(r.tenant, {}),
                model=model,
                extra=body_for.get(r.tenant, {}),
                exact_prompts=exact_prompts,
            )
            for r in requests
        )
        return await asyncio.gather(*fired)


def measure_client(results: Sequence[ClientResult], config: GuardConfig) -> RunMetrics:
    """The client's view as records, measured with the simulator's metrics."""
    return measure(client_records(results, config))


def client_records(results: Sequence[ClientResult], config: GuardConfig) -> TraceRecords:
    """The client's view as the simulator's per-request records (arrival = fired)."""
    contracts = {c.tenant: c for c in config.contracts}
    records = []
    for res in sorted(results, key=lambda r: r.fired_at):
        contract = contracts[res.request.tenant]
        outcome = OUTCOMES.get(res.status, "failed")
        records.append(
            RequestRecord(
                res.request.request_id,
                res.request.tenant,
                contract.cls,
                res.fired_at,
                res.scheduled_at,
                res.fired_at + contract.deadline_for(res.request.num_output_tokens),
                res.request.num_output_tokens,
                0,
                admitted=res.status == 200,
                window=res.window,
                outcome=outcome,
                ended_at=res.ended_at,
                dispatched_at=math.nan,
                first_token_at=res.first_token_at if res.first_token_at is not None else math.nan,
            )
        )
    return TraceRecords(config, records)
