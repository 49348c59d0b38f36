"""Trace events: every decision of the guard as one JSONL line (schema in docs/trace.md).

One schema serves the simulator and the HTTP proxy, so `floorguard verify` and the metrics
read either. Events are plain tuples for speed; `to_json`/`from_json` map them to the wire
names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from enum import StrEnum
from os import PathLike
from typing import Any, NamedTuple

import orjson

from floorguard.core.contract import (
    AffineEnvelope,
    CapacityAction,
    Contract,
    ContractClass,
    DispatchOrder,
    ExcessPolicy,
    GuardConfig,
    MeterKind,
    SurplusOrder,
    WindowSchedule,
)
from floorguard.core.learner import Consultation
from floorguard.core.request import Request, RequestId
from floorguard.errors import TraceError

__all__ = [
    "TERMINAL_KINDS",
    "EventKind",
    "TraceEvent",
    "arrive_event",
    "config_from_dict",
    "config_to_dict",
    "first_token_due",
    "new_event",
    "propose_event",
    "read_jsonl",
    "write_jsonl",
]


class EventKind(StrEnum):
    CONFIG = "config"
    """First line of a trace: the guard configuration the checker verifies against."""
    ARRIVE = "arrive"
    PROPOSE = "propose"
    ADMIT = "admit"
    REJECT = "reject"
    DEMOTE = "demote"
    ENQUEUE = "enqueue"
    DISPATCH = "dispatch"
    DROP = "drop"
    FIRST_TOKEN = "first_token"
    COMPLETE = "complete"
    ABORT = "abort"
    FAIL = "fail"
    REQUEUE = "requeue"
    """A dispatched request whose backend could not be reached before any byte was sent:
    its slot is freed and it waits again, in its old place (docs/design.md §12)."""
    LEASE = "lease"
    """With fleet-wide slot leases: the fleet granted this dispatched request a slot on
    `backend`; it reaches the backend from here (the fleet checker counts from it)."""
    STORE = "store"
    """The shared floor's state changed (`reason`: `shared`, or the fallback policy while
    Redis is unreachable): decisions until the next one were made on that state."""


TERMINAL_KINDS = frozenset(
    {EventKind.REJECT, EventKind.DROP, EventKind.COMPLETE, EventKind.ABORT, EventKind.FAIL}
)
"""Every offered request ends in exactly one of these."""


class TraceEvent(NamedTuple):
    at: float  # t: seconds on the driver's clock
    kind: EventKind  # event
    request_id: RequestId | None = None  # id
    tenant: str | None = None  # tenant (authenticated)
    cls: ContractClass | None = None  # class: the true contract class
    window: int | None = None  # window: meter window index k
    entitled: bool | None = None  # entitled: admitted from the floor
    reason: str | None = None  # reason: why rejected / dropped / failed / aborted
    backend: int | None = None  # backend: index of the backend dispatched to
    deadline_at: float | None = None  # deadline: D(R)
    num_output_tokens: int | None = None  # tokens: ℓ
    num_prompt_tokens: int | None = None  # prompt_tokens: as metered (exact or upper bound)
    min_prompt_tokens: int | None = None  # prompt_tokens_min: lower bound, when not exact
    scheduled_at: float | None = None  # scheduled: the workload's intended fire time
    admit: bool | None = None  # admit: the learner's proposal
    proposed_cls: str | None = None  # proposed_class: the learner's relabel, if any
    hint: float | None = None  # hint: the learner's priority hint
    data: Mapping[str, Any] | None = None  # config: the guard configuration (config only)
    pool: str | None = None  # pool: the model whose pool's guard logged it (`models:`)
    floor: int | None = None  # floor: the window's floor as the shared store pinned it,
    # where it is not the replica's own (a reload that reached the replicas one by one)


def new_event(  # noqa: PLR0917  # one parameter a field, as TraceEvent has
    at: float,
    kind: EventKind,
    request_id: RequestId | None = None,
    tenant: str | None = None,
    cls: ContractClass | None = None,
    window: int | None = None,
    entitled: bool | None = None,
    reason: str | None = None,
    backend: int | None = None,
    deadline_at: float | None = None,
    num_output_tokens: int | None = None,
    num_prompt_tokens: int | None = None,
    min_prompt_tokens: int | None = None,
    scheduled_at: float | None = None,
    admit: bool | None = None,
    proposed_cls: str | None = None,
    hint: float | None = None,
    data: Mapping[str, Any] | None = None,
    pool: str | None = None,
    floor: int | None = None,
) -> TraceEvent:
    """`TraceEvent(...)`, built without the NamedTuple's `__new__`, which is interpreted
    Python even in a compiled build: ≈ 8,000 instructions an event with keywords, five
    events a request on the HTTP path (docs/benchmarks.md). The core builds its events
    here, as `tuple.__new__` (C) from the whole tuple (what the NamedTuple's `_make`, also
    interpreted, does)."""
    return tuple.__new__(
        TraceEvent,
        (
            at,
            kind,
            request_id,
            tenant,
            cls,
            window,
            entitled,
            reason,
            backend,
            deadline_at,
            num_output_tokens,
            num_prompt_tokens,
            min_prompt_tokens,
            scheduled_at,
            admit,
            proposed_cls,
            hint,
            data,
            pool,
            floor,
        ),
    )


_WIRE_NAMES = {
    "at": "t",
    "kind": "event",
    "request_id": "id",
    "cls": "class",
    "deadline_at": "deadline",
    "num_output_tokens": "tokens",
    "num_prompt_tokens": "prompt_tokens",
    "min_prompt_tokens": "prompt_tokens_min",
    "scheduled_at": "scheduled",
    "proposed_cls": "proposed_class",
    "data": "config",
}
_FIELD_NAMES = {wire: name for name, wire in _WIRE_NAMES.items()}
_WIRE = tuple(_WIRE_NAMES.get(name, name) for name in TraceEvent._fields)


def arrive_event(
    now: float, request: Request, contract: Contract | None, scheduled_at: float | None
) -> TraceEvent:
    """The `arrive` event: the class and deadline come from the tenant's contract."""
    return new_event(
        now,
        EventKind.ARRIVE,
        request.request_id,
        request.tenant,
        contract.cls if contract else None,
        deadline_at=request.arrival_at + contract.deadline_for(request.num_output_tokens)
        if contract
        else None,
        num_output_tokens=request.num_output_tokens,
        num_prompt_tokens=request.num_prompt_tokens,
        min_prompt_tokens=request.min_prompt_tokens,
        scheduled_at=scheduled_at,
    )


def first_token_due(event: TraceEvent, contract: Contract) -> float:
    """`T` of an `arrive` event's request: its arrival — the instant its deadline counts
    from, which the event's own `t` may follow (the HTTP guard logs it once the body is
    read) — plus the contract's TTFT."""
    assert contract.ttft_budget_s is not None
    if event.deadline_at is None:
        return event.at + contract.ttft_budget_s
    arrived = event.deadline_at - contract.deadline_for(event.num_output_tokens or 0)
    return arrived + contract.ttft_budget_s


def propose_event(
    now: float, request: Request, cls: ContractClass, consultation: Consultation
) -> TraceEvent:
    """The `propose` event for a learner consultation: the proposal, or the fault."""
    proposal, fault = consultation.proposal, consultation.fault
    rid, tenant = request.request_id, request.tenant
    if proposal is None:
        return new_event(now, EventKind.PROPOSE, rid, tenant, cls, reason=fault)
    relabel = proposal.proposed_class
    return new_event(
        now,
        EventKind.PROPOSE,
        rid,
        tenant,
        cls,
        admit=proposal.admit,
        hint=float(proposal.priority_hint),
        proposed_cls=relabel.value if relabel else None,
    )


def to_json(event: TraceEvent) -> str:  # noqa: PLR0912  # one branch a field, on purpose
    """One JSONL line (no newline): the wire names of `_WIRE_NAMES`, absent fields omitted.
    Written out field by field: the guard serializes five of these a request, and this
    costs about half a generic zip over the fields (`test_events.py` holds it to `_WIRE`)."""
    rid, tenant, cls = event.request_id, event.tenant, event.cls
    line: dict[str, Any]
    if rid is not None and tenant is not None and cls is not None:  # a request's: one build
        line = {"t": event.at, "event": event.kind, "id": rid, "tenant": tenant, "class": cls}
    else:
        line = {"t": event.at, "event": event.kind}
        if rid is not None:
            line["id"] = rid
        if tenant is not None:
            line["tenant"] = tenant
        if cls is not None:
            line["class"] = cls
    if event.window is not None:
        line["window"] = event.window
    if event.entitled is not None:
        line["entitled"] = event.entitled
    if event.reason is not None:
        line["reason"] = event.reason
    if event.backend is not None:
        line["backend"] = event.backend
    if event.deadline_at is not None:
        line["deadline"] = event.deadline_at
    if event.num_output_tokens is not None:
        line["tokens"] = event.num_output_tokens
    if event.num_prompt_tokens is not None:
        line["prompt_tokens"] = event.num_prompt_tokens
    if event.min_prompt_tokens is not None:
        line["prompt_tokens_min"] = event.min_prompt_tokens
    if event.scheduled_at is not None:
        line["scheduled"] = event.scheduled_at
    if event.admit is not None:
        line["admit"] = event.admit
    if event.proposed_cls is not None:
        line["proposed_class"] = event.proposed_cls
    if event.hint is not None:
        line["hint"] = event.hint
    if event.data is not None:
        line["config"] = event.data
    if event.pool is not None:
        line["pool"] = event.pool
    if event.floor is not None:
        line["floor"] = event.floor
    return orjson.dumps(line).decode()


def from_json(line: str, line_no: int = 0) -> TraceEvent:
    try:
        record = orjson.loads(line)
        fields = {_FIELD_NAMES.get(k, k): v for k, v in record.items()}
        fields["kind"] = EventKind(fields["kind"])
        if fields.get("cls") is not None:
            fields["cls"] = ContractClass(fields["cls"])
        return TraceEvent(**fields)
    except (ValueError, KeyError, TypeError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise TraceError(
            f"trace line {line_no}: not a trace event ({exc}): {line[:120]!r}"
        ) from exc


def write_jsonl(events: Iterable[TraceEvent], path: str | PathLike[str]) -> int:
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for event in events:
            f.write(to_json(event))
            f.write("\n")
            count += 1
    return count


def read_jsonl(path: str | PathLike[str], torn: list[int] | None = None) -> Iterator[TraceEvent]:
    """A decision log's events. A line a writer left half-written as it died — the file's
    last, or the one just before a new life's `config` line — is skipped (its number added
    to `torn`, where given); any other unreadable line is a `TraceError`."""
    with open(path, encoding="utf-8") as f:
        pending: tuple[int, str, TraceError] | None = None
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                event = from_json(line, line_no)
            except TraceError as exc:
                if pending is not None:
                    raise pending[2] from None
                pending = (line_no, line, exc)
                continue
            if pending is not None:
                if event.kind is not EventKind.CONFIG or event.window is not None:
                    raise pending[2]
                if torn is not None:
                    torn.append(pending[0])
                pending = None
            yield event
        if pending is not None and torn is not None:
            torn.append(pending[0])


def config_to_dict(config: GuardConfig) -> dict[str, Any]:
    def envelope(e: AffineEnvelope | None) -> dict[str, float] | None:
        if e is None:
            return None
        out = {"base_s": e.base_s, "per_token_s": e.per_token_s}
        if e.per_prompt_token_s:
            out["per_prompt_token_s"] = e.per_prompt_token_s
        return out

    return {
        "window_s": config.schedule.window_s,
        "origin_at": config.schedule.origin_at,
        "slots": list(config.slots),
        "dispatch": config.dispatch.value,
        "surplus": config.surplus.value,
        "meter": config.meter.value,
        "lower_envelope": envelope(config.lower_envelope),
        "upper_envelope": envelope(config.upper_envelope),
        "capacity_action": config.capacity_action.value,
        "slot_leases": config.slot_leases,
        **({"reserved_slots": config.reserved_slots} if config.reserved_slots else {}),
        **(
            {"kv_tokens": list(config.kv_tokens), "kv_block_tokens": config.kv_block_tokens}
            if config.kv_budgeted
            else {}
        ),
        "backends": [
            {
                "id": config.backend_ids[i] if config.backend_ids else None,
                "capacity": config.backend_capacity[i] if config.backend_capacity else None,
            }
            for i in range(len(config.slots))
        ],
        "contracts": [
            {
                "tenant": c.tenant,
                "class": c.cls.value,
                "deadline_budget_s": c.deadline_budget_s,
                "floor": c.floor,
                "excess_policy": c.excess_policy.value,
                **({"ttft_budget_s": c.ttft_budget_s} if c.ttft_budget_s is not None else {}),
                **({"tpot_budget_s": c.tpot_budget_s} if c.tpot_budget_s is not None else {}),
            }
            for c in config.contracts
        ],
    }


def _backends_from(backends: Any, num_slots: int) -> dict[str, Any]:
    """`backend_ids` / `backend_capacity` from a config event's `backends` (older logs have
    none: by position, no capacity)."""
    if not isinstance(backends, list) or len(backends) != num_slots:
        return {}
    ids = tuple(str(b.get("id")) if b.get("id") is not None else "" for b in backends)
    capacity = tuple(b.get("capacity") for b in backends)
    return {
        "backend_ids": ids if any(ids) else (),
        "backend_capacity": capacity if any(c is not None for c in capacity) else (),
    }


def config_from_dict(data: Mapping[str, Any]) -> GuardConfig:
    def envelope(e: Mapping[str, float] | None) -> AffineEnvelope | None:
        if e is None:
            return None
        return AffineEnvelope(e["base_s"], e["per_token_s"], e.get("per_prompt_token_s", 0.0))

    try:
        return GuardConfig(
            contracts=tuple(
                Contract(
                    tenant=c["tenant"],
                    cls=ContractClass(c["class"]),
                    deadline_budget_s=c["deadline_budget_s"],
                    floor=c["floor"],
                    excess_policy=ExcessPolicy(c["excess_policy"]),
                    ttft_budget_s=c.get("ttft_budget_s"),
                    tpot_budget_s=c.get("tpot_budget_s"),
                )
                for c in data["contracts"]
            ),
            schedule=WindowSchedule(data["window_s"], data["origin_at"]),
            slots=tuple(data["slots"]),
            dispatch=DispatchOrder(data["dispatch"]),
            surplus=SurplusOrder(data.get("surplus", "learner")),  # a log from before it
            meter=MeterKind(data["meter"]),
            lower_envelope=envelope(data.get("lower_envelope")),
            upper_envelope=envelope(data.get("upper_envelope")),
            capacity_action=CapacityAction(data.get("capacity_action", "alarm")),
            **_backends_from(data.get("backends"), len(data["slots"])),
            slot_leases=bool(data.get("slot_leases", False)),
            kv_tokens=tuple(data.get("kv_tokens", ())),
            kv_block_tokens=int(data.get("kv_block_tokens", 16)),
            reserved_slots=int(data.get("reserved_slots", 0)),
        )
    except (KeyError, TypeError) as exc:
        raise TraceError(f"config event is missing or mistypes {exc}") from exc
