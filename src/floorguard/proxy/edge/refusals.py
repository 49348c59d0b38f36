"""The answers a pool gives a request it will not serve: a refusal on arrival and a drop
from the queue, each with the headers and the sentence a client acts on (docs/design.md §17)."""

from __future__ import annotations

import math

from aiohttp import web

from floorguard.core.contract import AffineEnvelope, Contract
from floorguard.core.refusals import REFUSALS, AfJudgement, Refusal, Retry
from floorguard.core.surface import Admission, Drop
from floorguard.proxy.edge.replies import NO_RETRY, json_error

__all__ = ["doomed", "refusal"]


def refusal(admission: Admission, now: float, limits: dict[str, str]) -> web.Response:
    """The answer to an arrival the guard refused, as `core/refusals.py`'s table says: its
    status, sentence and `Retry-After`, with the class, the window and the rate-limit
    headers (docs/design.md §17)."""
    reason = admission.reason or "rejected"
    row = REFUSALS.get(reason)  # type: ignore[call-overload]  # a StrEnum key is its str
    if row is None:  # a reason of a driver's own: refused, and no retry helps
        row = Refusal(429, Retry.NO, f"refused: {reason}", "", AfJudgement.VIOLATION)
    retry_s = 1
    if admission.retry_at is not None and row.retry is Retry.NEXT_WINDOW:
        retry_s = max(1, math.ceil(admission.retry_at - now))
    message = row.message.format(retry_s=retry_s)
    if row.status != 429:  # refused as not the guard's to serve (a tenant a reload removed)
        return json_error(row.status, reason, message)
    headers = {
        "x-floorguard-decision": "rejected",
        "x-floorguard-class": str(admission.cls),
        "Retry-After": str(retry_s),
        **limits,
    }
    if row.retry is not Retry.SOON:  # a retry is a new offer, not a fix
        headers |= NO_RETRY
    return json_error(429, reason, message, headers)


def _first_token_doomed(drop: Drop, contract: Contract, lower: AffineEnvelope | None) -> str | None:
    """Why the drop was its first token's (docs/design.md §19), or None: its end was doomed,
    or it has no TTFT."""
    request, ttft = drop.request, contract.ttft_budget_s
    if ttft is None or lower is None or lower.per_token_s <= 0:
        return None
    end = request.arrival_at + contract.deadline_for(request.num_output_tokens)
    if drop.at + lower.at(request.num_output_tokens, request.prompt_tokens_lower) > end:
        return None
    prefill = lower.at(0, request.prompt_tokens_lower)
    left = request.arrival_at + ttft - drop.at
    return f"{left * 1e3:.0f} ms were left, its prefill takes at least {prefill * 1e3:.0f} ms"


def doomed(
    drop: Drop,
    contract: Contract,
    lower: AffineEnvelope | None,
    headers: dict[str, str],
    *,
    entitled: bool,
) -> web.Response:
    """503 for the floor's own request, or for one too long for its deadline from the
    start (no retry helps); 429, retryable, for surplus that waited out its deadline
    behind other work — the guard was busy (docs/design.md §17)."""
    request = drop.request
    budget = contract.deadline_for(request.num_output_tokens)
    deadline_at = request.arrival_at + budget
    fit = (
        lower.max_output_tokens(deadline_at - drop.at, request.prompt_tokens_lower)
        if lower is not None
        else 0
    )
    headers = {**headers, "x-floorguard-decision": "dropped", "Retry-After": "1"}
    first = _first_token_doomed(drop, contract, lower)
    if first is not None:
        return json_error(
            503 if entitled else 429,
            "doomed",
            f"dropped: its first token could not come by its TTFT ({first})"
            + ("" if entitled else ": the guard was busy. Retry later"),
            headers if not entitled else headers | NO_RETRY,
        )
    waited_out = (
        not entitled
        and lower is not None
        and lower.at(request.num_output_tokens, request.prompt_tokens_lower) <= budget
    )
    if waited_out:
        return json_error(
            429,
            "doomed",
            "dropped: busy; it waited behind other work until it could no longer finish "
            f"by its deadline (at most max_tokens = {fit} would have fit then). Retry "
            "later",
            headers,
            param="max_tokens",
            max_tokens_that_fit=fit,
        )
    return json_error(
        503,
        "doomed",
        f"dropped: it could not finish by its deadline; at most max_tokens = {fit} "
        f"would have fit when it was dropped",
        headers | NO_RETRY,
        param="max_tokens",
        max_tokens_that_fit=fit,
    )
