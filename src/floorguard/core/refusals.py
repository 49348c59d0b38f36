"""The one table of the core's refusals: for each `RejectReason`, the HTTP status and the
sentence a client gets, whether a retry can help and when, how `verify` judges it when it
refuses a floor-entitled request, and its line in docs/trace.md. The HTTP edge
(`proxy/edge/refusals.py`), the checker, the metrics' reason labels and docs/trace.md's
generated section all read it; adding a reason means adding its row here, and
`tests/unit/test_refusal_table.py` fails until every reader knows it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from floorguard.core.surface import RejectReason

__all__ = [
    "AUTO_RETRY",
    "REFUSALS",
    "WINDOW_BOUND",
    "AfJudgement",
    "Refusal",
    "Retry",
    "trace_table",
]


class Retry(StrEnum):
    NEXT_WINDOW = "next window"
    """No retry in this window can succeed: `Retry-After` is the next window's start, and a
    client's automatic retry is told not to (`x-should-retry: false`)."""
    SOON = "soon"
    """An automatic retry may succeed (the queue drains): `Retry-After: 1`, never more (when
    a slot frees is other tenants' business)."""
    NO = "no"
    """A decision a retry does not change: `Retry-After: 1`, `x-should-retry: false`."""


class AfJudgement(StrEnum):
    VIOLATION = "AF violation"
    """Refusing a floor-entitled request this way breaks the floor."""
    LOWERED_FLOOR = "AF violation, unless `capacity_action: lower-floor`"
    """Allowed where the configuration lowers the floor under measured capacity loss
    (docs/design.md §4.4): the refused request still counts against `B`."""


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    """The HTTP status at the edge (the OpenAI-style error's `code` is the reason)."""
    retry: Retry
    message: str
    """The client's sentence; `{retry_s}` is the `Retry-After` in seconds."""
    who: str
    """Which requests can get it."""
    af: AfJudgement
    """How `verify` judges it when it refused a floor-entitled request."""


REFUSALS: Mapping[RejectReason, Refusal] = {
    RejectReason.UNKNOWN_TENANT: Refusal(
        403,
        Retry.NO,
        "refused: this tenant has no contract (any more)",
        "a tenant a reload removed after its request passed the edge",
        AfJudgement.VIOLATION,
    ),
    RejectReason.FLOOR_EXHAUSTED: Refusal(
        429,
        Retry.NEXT_WINDOW,
        "refused: floor_exhausted; the next window starts in {retry_s} s",
        "assured beyond its `B` this window, under `excess_policy: reject` (or `spare`, "
        "with no spare slot)",
        AfJudgement.VIOLATION,
    ),
    RejectReason.FLOOR_LOWERED: Refusal(
        429,
        Retry.NEXT_WINDOW,
        "refused: floor_lowered; measured capacity lowered the floor, and the next window "
        "starts in {retry_s} s",
        "assured beyond the floor the capacity action lowered, within its `B`",
        AfJudgement.LOWERED_FLOOR,
    ),
    RejectReason.COST_EXCESS: Refusal(
        429,
        Retry.NEXT_WINDOW,
        "refused: cost_excess; its metered weight can never fit the window's budget (the "
        "next window starts in {retry_s} s)",
        "a request heavier than its tenant's whole token budget (token meter)",
        AfJudgement.VIOLATION,
    ),
    RejectReason.LEARNER_REJECT: Refusal(
        429,
        Retry.NO,
        "refused: learner_reject; the admission policy did not admit it to the surplus",
        "surplus: the learner proposed reject",
        AfJudgement.VIOLATION,
    ),
    RejectReason.LEARNER_FAULT: Refusal(
        429,
        Retry.NO,
        "refused: learner_fault; the admission policy failed, which refuses the surplus",
        "surplus: the learner raised, timed out or answered malformed",
        AfJudgement.VIOLATION,
    ),
    RejectReason.QUEUE_FULL: Refusal(
        429,
        Retry.SOON,
        "refused: the guard's queue for this class or tenant is full",
        "surplus over a queue limit (`queue:`)",
        AfJudgement.VIOLATION,
    ),
    RejectReason.KV_EXCESS: Refusal(
        429,
        Retry.NO,
        "refused: kv_excess; its prompt and max_tokens need more KV cache than any backend "
        "has: send a shorter prompt or a smaller max_tokens",
        "a request whose metered prompt + output fits no backend's KV budget",
        AfJudgement.VIOLATION,
    ),
    RejectReason.BUSY: Refusal(
        429,
        Retry.SOON,
        "refused: busy; the requests ahead of this one leave no slot for it before its "
        "deadline. Retry later",
        "surplus that cannot start before it is doomed (`queue.refuse_busy`)",
        AfJudgement.VIOLATION,
    ),
}


WINDOW_BOUND = frozenset(r for r, row in REFUSALS.items() if row.retry is Retry.NEXT_WINDOW)
"""Refusals no retry inside the same window can turn around: `retry_at` is the next
window's start."""
AUTO_RETRY = frozenset(r for r, row in REFUSALS.items() if row.retry is Retry.SOON)
"""Refusals a client's automatic retry may turn around; every other one is a decision a retry
does not change (`x-should-retry: false` at the HTTP edge)."""


def trace_table() -> str:
    """docs/trace.md's generated table of the `reject` event's reasons."""
    lines = [
        "| reason | who gets it | HTTP | retry | refusing a floor-entitled request |",
        "|---|---|---|---|---|",
    ]
    for reason, row in REFUSALS.items():
        lines.append(f"| `{reason}` | {row.who} | {row.status} | {row.retry} | {row.af} |")
    return "\n".join(lines) + "\n"
