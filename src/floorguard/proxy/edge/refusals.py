"""The answers a pool gives a request it will not serve: a refusal on arrival and a drop
from the queue, each with the headers and the sentence a client acts on (docs/design.md §17)."""

from __future__ import annotations

import math

from aiohttp import web

from floorguard.core.contract import AffineEnvelope, Contract
from floorguard.core.surface import AUTO_RETRY, WINDOW_BOUND, Admission, Drop, RejectReason
from floorguard.proxy.edge.replies import NO_RETRY, json_error

__all__ = ["doomed", "refusal"]


def refusal(admission: Admission, now: float, limits: dict[str, str]) -> web.Response:
    """429 (or 403 for a tenant a reload removed) for an arrival the guard refused, with
    `Retry-After`, the class, the window and the rate-limit headers (docs/design.md §17)."""
    reason = admission.reason or "rejected"
    retry_s = 1  # `busy`: when a slot frees is other tenants' business, never said
    if admission.retry_at is not None and reason != RejectReason.BUSY:
        retry_s = max(1, math.ceil(admission.retry_at - now))
    if reason == RejectReason.UNKNOWN_TENANT:  # removed by a reload since it passed the edge
        return json_error(403, reason, "refused: this tenant has no contract (any more)")
    headers = {
        "x-floorguard-decision": "rejected",
        "x-floorguard-class": str(admission.cls),
        "Retry-After": str(retry_s),
        **limits,
    }
    if reason not in AUTO_RETRY:  # a retry is a new offer, not a fix
        headers |= NO_RETRY
    if reason in WINDOW_BOUND:
        message = f"refused: {reason}; the next window starts in {retry_s} s"
    elif reason == RejectReason.QUEUE_FULL:
        message = "refused: the guard's queue for this class or tenant is full"
    elif reason == RejectReason.KV_EXCESS:
        message = (
            "refused: kv_excess; its prompt and max_tokens need more KV cache than any "
            "backend has: send a shorter prompt or a smaller max_tokens"
        )
    elif reason == RejectReason.BUSY:
        message = (
            "refused: busy; the requests ahead of this one leave no slot for it before "
            "its deadline. Retry later"
        )
    else:
        message = f"refused: {reason}"
    return json_error(429, reason, message, headers)


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
    deadline_at = request.arrival_at + contract.deadline_budget_s
    fit = (
        lower.max_output_tokens(deadline_at - drop.at, request.prompt_tokens_lower)
        if lower is not None
        else 0
    )
    headers = {**headers, "x-floorguard-decision": "dropped", "Retry-After": "1"}
    waited_out = (
        not entitled
        and lower is not None
        and lower.at(request.num_output_tokens, request.prompt_tokens_lower)
        <= contract.deadline_budget_s
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
