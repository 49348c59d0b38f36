"""Fold a trace into one record per offered request. Metrics and the checker read these, so
a simulator trace and a proxy decision log are measured the same way."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from floorguard.core.contract import ContractClass, GuardConfig
from floorguard.core.events import EventKind, TraceEvent, config_from_dict
from floorguard.core.request import RequestId
from floorguard.errors import TraceError

__all__ = ["RequestRecord", "TraceRecords", "fold_trace"]

_OUTCOME = {
    EventKind.REJECT: "rejected",
    EventKind.DROP: "dropped",
    EventKind.COMPLETE: "completed",
    EventKind.FAIL: "failed",
    EventKind.ABORT: "aborted",
}
NAN = math.nan


@dataclass(slots=True)
class RequestRecord:
    request_id: RequestId
    tenant: str
    cls: ContractClass | None
    arrival_at: float
    scheduled_at: float
    deadline_at: float
    num_output_tokens: int
    num_prompt_tokens: int
    admitted: bool = False
    entitled: bool = False
    window: int | None = None
    outcome: str | None = None
    """completed | rejected | dropped | failed | aborted; None while open."""
    reason: str | None = None
    dispatched_at: float = NAN
    first_token_at: float = NAN
    ended_at: float = NAN

    @property
    def late(self) -> bool:
        return self.outcome == "completed" and self.ended_at > self.deadline_at

    @property
    def on_time(self) -> bool:
        return self.outcome == "completed" and self.ended_at <= self.deadline_at

    @property
    def service_s(self) -> float:
        return self.ended_at - self.dispatched_at

    @property
    def sojourn_s(self) -> float:
        return self.ended_at - self.arrival_at

    @property
    def queue_wait_s(self) -> float:
        return self.dispatched_at - self.arrival_at


@dataclass
class TraceRecords:
    config: GuardConfig
    records: list[RequestRecord]
    """In arrival order."""

    def of_class(self, cls: ContractClass) -> list[RequestRecord]:
        return [r for r in self.records if r.cls is cls]


def fold_trace(events: Iterable[TraceEvent]) -> TraceRecords:
    config: GuardConfig | None = None
    by_id: dict[RequestId, RequestRecord] = {}
    for event in events:
        kind = event.kind
        if kind is EventKind.CONFIG:
            if event.data is None:
                raise TraceError("config event without a configuration")
            config = config_from_dict(event.data)
            continue
        if kind is EventKind.ARRIVE:
            by_id[event.request_id] = RequestRecord(  # type: ignore[index]
                event.request_id,  # type: ignore[arg-type]
                event.tenant or "",
                event.cls,
                event.at,
                event.scheduled_at if event.scheduled_at is not None else event.at,
                event.deadline_at if event.deadline_at is not None else math.inf,
                event.num_output_tokens or 0,
                event.num_prompt_tokens or 0,
            )
            continue
        record = by_id.get(event.request_id)  # type: ignore[arg-type]
        if record is None:
            continue
        _apply(record, event)
    if config is None:
        raise TraceError("trace has no config event: it cannot be measured or verified")
    return TraceRecords(config, list(by_id.values()))


def _apply(record: RequestRecord, event: TraceEvent) -> None:
    kind = event.kind
    if kind is EventKind.ADMIT:
        record.admitted = True
        record.entitled = bool(event.entitled)
        record.window = event.window
        if event.deadline_at is not None:
            record.deadline_at = event.deadline_at
    elif kind is EventKind.DISPATCH:
        record.dispatched_at = event.at
    elif kind is EventKind.FIRST_TOKEN:
        record.first_token_at = event.at
    elif kind in _OUTCOME and record.outcome is None:
        record.outcome = _OUTCOME[kind]
        record.reason = event.reason
        record.ended_at = event.at
