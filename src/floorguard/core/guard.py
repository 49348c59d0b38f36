"""The guard: class binding, meter, learner, dispatcher, doom gate and monitors composed.

Pure: no I/O, no clock reads. A driver (the simulator, the HTTP proxy) calls

    on_arrival(request, now)      -> Admission
    poll(now)                     -> [Dispatch | Drop, ...]   (fill free slots)
    expire(now)                   -> [Drop, ...]   (queued requests doomed by now;
                                                     next_doom_at() says when to call)
    requeue(id, now)              (its backend was unreachable: wait again, in place)
    on_first_token(id, now)
    on_complete(id, now)          -> Completion
    on_fail(id, now, reason) / on_abort(id, now, reason)

and gets decisions back as data; every decision is also a `TraceEvent` given to `sink`.
Decision records are NamedTuples: immutable values, and cheaper to build than frozen
dataclasses on the per-request hot path (docs/benchmarks.md).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from floorguard.core.contract import (
    CapacityAction,
    Contract,
    ContractClass,
    ExcessPolicy,
    GuardConfig,
)
from floorguard.core.dispatcher import SlotPool, Ticket, create_dispatcher
from floorguard.core.doom import DoomGate, DoomVerdict
from floorguard.core.events import (
    EventKind,
    TraceEvent,
    arrive_event,
    config_to_dict,
    propose_event,
)
from floorguard.core.learner import Learner, LoadSnapshot, Proposal, consult
from floorguard.core.meter import MeterDecision, MeterVerdict, ReservationMeter
from floorguard.core.monitors import (
    AssumptionReport,
    BacklogMonitor,
    CapacityMonitor,
    EnvelopeMonitor,
    assumption_report,
)
from floorguard.core.request import Request, RequestId
from floorguard.store.base import CreditStore, Grant
from floorguard.store.memory import MemoryCreditStore

__all__ = [
    "Admission",
    "Completion",
    "Dispatch",
    "Drop",
    "Guard",
    "GuardStats",
    "RejectReason",
    "StoreCall",
]

ASSURED = ContractClass.ASSURED
Sink = Callable[[TraceEvent], None]


class RejectReason(StrEnum):
    UNKNOWN_TENANT = "unknown_tenant"
    FLOOR_EXHAUSTED = "floor_exhausted"
    FLOOR_LOWERED = "floor_lowered"
    """Beyond the effective floor lowered by the capacity action, within the contract's B."""
    COST_EXCESS = "cost_excess"
    LEARNER_REJECT = "learner_reject"
    LEARNER_FAULT = "learner_fault"
    QUEUE_FULL = "queue_full"
    """A surplus request over a queue limit (`QueueLimits`); never a floor-entitled one."""


class StoreCall(NamedTuple):
    """One credit-store call: take `weight` of `capacity` credits from `key`'s window."""

    key: str
    weight: int
    capacity: int


class Admission(NamedTuple):
    request_id: RequestId
    admitted: bool
    cls: ContractClass | None
    entitled: bool
    """Admitted from the floor (AF); SF applies."""
    demoted: bool
    window_index: int | None
    deadline_at: float | None
    reason: str | None = None
    """A `RejectReason` from the guard; comparison stacks add their own (`rate_limited`, …)."""


class Dispatch(NamedTuple):
    request: Request
    backend: int
    at: float
    entitled: bool
    deadline_at: float


class Drop(NamedTuple):
    request: Request
    at: float
    reason: str


class Completion(NamedTuple):
    request_id: RequestId
    at: float
    service_s: float
    late: bool


@dataclass(slots=True)
class ClassStats:
    offered: int = 0
    admitted: int = 0
    entitled: int = 0
    demoted: int = 0
    rejected: int = 0
    dropped: int = 0
    completed: int = 0
    late: int = 0
    failed: int = 0
    aborted: int = 0


@dataclass(slots=True)
class GuardStats:
    per_class: dict[ContractClass, ClassStats] = field(
        default_factory=lambda: {c: ClassStats() for c in ContractClass}
    )
    rejected_by_reason: dict[RejectReason, int] = field(
        default_factory=lambda: dict.fromkeys(RejectReason, 0)
    )
    learner_calls: int = 0
    learner_faults: int = 0
    doom_uncertain: int = 0
    unknown_tenant: int = 0


class Guard:
    def __init__(
        self,
        config: GuardConfig,
        *,
        learner: Learner,
        store: CreditStore | None = None,
        sink: Sink | None = None,
        started_at: float = 0.0,
    ) -> None:
        self.config = config
        self._learner = learner
        self._contracts = {c.tenant: c for c in config.contracts}
        self._meter = ReservationMeter(
            config.schedule, store if store is not None else MemoryCreditStore(), config.meter
        )
        self._queue = create_dispatcher(config.dispatch)
        self._slots = SlotPool(config.slots)
        self._doom = DoomGate(config.lower_envelope, config.upper_envelope)
        self.envelope = EnvelopeMonitor(config.lower_envelope, config.upper_envelope)
        self.backlog = BacklogMonitor(config.total_floor)
        self.capacity = CapacityMonitor(config.schedule, config.total_floor)
        self.stats = GuardStats()
        self._in_flight: dict[RequestId, Ticket] = {}
        self._queued: dict[RequestId, Ticket] = {}
        self._doom_heap: list[tuple[float, int, Ticket]] = []
        """(doomed after, seq, ticket) of queued tickets: `expire` drops them on time."""
        self._surplus_by_class: Counter[ContractClass] = Counter()
        self._surplus_by_tenant: Counter[str] = Counter()
        self._seq = 0
        self._max_assured_tokens = 0
        self._lowered: dict[str, tuple[int, int]] = {}
        """tenant -> (window, weight refused as floor_lowered in it)"""
        self._sink = sink
        if sink is not None:
            sink(TraceEvent(started_at, EventKind.CONFIG, data=config_to_dict(config)))

    # -- arrival --------------------------------------------------------------------------

    def on_arrival(
        self,
        request: Request,
        now: float,
        scheduled_at: float | None = None,
        *,
        grant: Grant | None = None,
    ) -> Admission:
        """Bind the class from the tenant, charge the floor, ask the learner for the surplus.

        `grant`: the answer to `store_call(request, now)`, made by the driver itself (a
        remote store awaited without blocking); None lets the guard call its store."""
        contract = self._contracts.get(request.tenant)
        if self._sink is not None:
            self._sink(arrive_event(now, request, contract, scheduled_at))
        if contract is None:
            self.stats.unknown_tenant += 1
            return self._reject(request, None, None, RejectReason.UNKNOWN_TENANT, now)
        self.stats.per_class[contract.cls].offered += 1
        deadline_at = request.arrival_at + contract.deadline_budget_s
        if contract.cls is ASSURED:
            return self._arrive_assured(request, contract, deadline_at, now, grant)
        return self._admit_surplus(request, contract, deadline_at, None, now, demoted=False)

    def _arrive_assured(
        self,
        request: Request,
        contract: Contract,
        deadline_at: float,
        now: float,
        grant: Grant | None,
    ) -> Admission:
        """SPEC §4.1: entitled from the floor, else cost-excess, else the excess policy."""
        self._max_assured_tokens = max(self._max_assured_tokens, request.num_output_tokens)
        floor = self.effective_floor(contract)
        charge = self._meter.charge(contract, request, now, floor, grant)
        window = charge.window_index
        if charge.verdict is MeterVerdict.ENTITLED:
            self.stats.per_class[ASSURED].entitled += 1
            return self._admit(request, contract, deadline_at, window, now, entitled=True)
        if charge.verdict is MeterVerdict.COST_EXCESS:
            return self._reject(request, contract, window, RejectReason.COST_EXCESS, now)
        reason = self._excess_reason(contract, request, floor, charge)
        if reason is RejectReason.FLOOR_LOWERED or contract.excess_policy is ExcessPolicy.REJECT:
            return self._reject(request, contract, window, reason, now)
        self.stats.per_class[ASSURED].demoted += 1
        if self._sink is not None:
            self._sink(
                TraceEvent(
                    now,
                    EventKind.DEMOTE,
                    request.request_id,
                    request.tenant,
                    contract.cls,
                    window=window,
                    reason="burst_excess",
                )
            )
        return self._admit_surplus(request, contract, deadline_at, window, now, demoted=True)

    def _excess_reason(
        self, contract: Contract, request: Request, floor: int, charge: MeterDecision
    ) -> RejectReason:
        """`floor_lowered` while the refused weight still fits the contract's `B` counting
        this window's earlier lowered refusals (refused whatever the excess policy: SPEC
        §4.4); `floor_exhausted` beyond `B`, where the excess policy applies."""
        lowered = self._lowered_weight(
            contract, request, floor, charge.window_index, charge.remaining
        )
        if lowered is None:
            return RejectReason.FLOOR_EXHAUSTED
        self._lowered[contract.tenant] = (charge.window_index, lowered)
        return RejectReason.FLOOR_LOWERED

    def _lowered_weight(
        self, contract: Contract, request: Request, floor: int, window_index: int, remaining: int
    ) -> int | None:
        """The window's lowered-refused weight with this request, if it is refused as
        `floor_lowered`; None if it is beyond `B` (floor exhausted)."""
        if floor >= contract.floor:
            return None
        window, lowered = self._lowered.get(contract.tenant, (window_index, 0))
        if window != window_index:
            lowered = 0
        weight = self._meter.weight(request)
        if floor - remaining + lowered + weight > contract.floor:
            return None
        return lowered + weight

    def effective_floor(self, contract: Contract) -> int:
        """`B`, or under `lower-floor` the share of `⌊μ̂·W⌋` capacity can serve (≥ 1)."""
        estimate = self.capacity.estimate_per_s
        if self.config.capacity_action is CapacityAction.ALARM or estimate is None:
            return contract.floor
        servable = int(estimate * self.config.schedule.window_s)
        total = self.config.total_floor
        if servable >= total:
            return contract.floor
        return max(1, contract.floor * servable // total)

    def _admit_surplus(
        self,
        request: Request,
        contract: Contract,
        deadline_at: float,
        window_index: int | None,
        now: float,
        *,
        demoted: bool,
    ) -> Admission:
        proposal = self._ask_learner(request, contract, now)
        if proposal is None:
            return self._reject(request, contract, window_index, RejectReason.LEARNER_FAULT, now)
        if not proposal.admit:
            return self._reject(request, contract, window_index, RejectReason.LEARNER_REJECT, now)
        if self._surplus_queue_full(contract):
            return self._reject(request, contract, window_index, RejectReason.QUEUE_FULL, now)
        # SPEC §2: a relabel reduces to a priority inside the surplus; the floor key is untouched.
        rank = 0 if proposal.proposed_class is ASSURED else 1
        return self._admit(
            request,
            contract,
            deadline_at,
            window_index,
            now,
            entitled=False,
            demoted=demoted,
            rank=rank,
            hint=float(proposal.priority_hint),
        )

    def _surplus_queue_full(self, contract: Contract) -> bool:
        limits = self.config.queue_limits
        by_class = limits.for_class(contract.cls)
        if by_class is not None and self._surplus_by_class[contract.cls] >= by_class:
            return True
        per_tenant = limits.per_tenant
        return per_tenant is not None and self._surplus_by_tenant[contract.tenant] >= per_tenant

    def _ask_learner(self, request: Request, contract: Contract, now: float) -> Proposal | None:
        """The learner's proposal, or None for a fault (exception or malformed answer)."""
        self.stats.learner_calls += 1
        consultation = consult(self._learner, request, contract.cls, self.load(), now)
        if consultation.fault is not None:
            self.stats.learner_faults += 1
        if self._sink is not None:
            self._sink(propose_event(now, request, contract.cls, consultation))
        return consultation.proposal

    def _admit(
        self,
        request: Request,
        contract: Contract,
        deadline_at: float,
        window_index: int | None,
        now: float,
        *,
        entitled: bool,
        demoted: bool = False,
        rank: int = 1,
        hint: float = 0.0,
    ) -> Admission:
        self._seq += 1
        ticket = Ticket(
            request, contract, deadline_at, entitled, window_index, self._seq, rank, hint
        )
        self.stats.per_class[contract.cls].admitted += 1
        self._enqueue(ticket)
        if self._sink is not None:
            self._sink(
                TraceEvent(
                    now,
                    EventKind.ADMIT,
                    request.request_id,
                    request.tenant,
                    contract.cls,
                    window=window_index,
                    entitled=entitled,
                    deadline_at=deadline_at,
                )
            )
            self._sink(
                TraceEvent(now, EventKind.ENQUEUE, request.request_id, request.tenant, contract.cls)
            )
        return Admission(
            request.request_id, True, contract.cls, entitled, demoted, window_index, deadline_at
        )

    def _reject(
        self,
        request: Request,
        contract: Contract | None,
        window_index: int | None,
        reason: RejectReason,
        now: float,
    ) -> Admission:
        cls = contract.cls if contract is not None else None
        if cls is not None:
            self.stats.per_class[cls].rejected += 1
        self.stats.rejected_by_reason[reason] += 1
        if self._sink is not None:
            self._sink(
                TraceEvent(
                    now,
                    EventKind.REJECT,
                    request.request_id,
                    request.tenant,
                    cls,
                    window=window_index,
                    reason=reason.value,
                )
            )
        return Admission(request.request_id, False, cls, False, False, window_index, None, reason)

    # -- the queue ------------------------------------------------------------------------

    def _enqueue(self, ticket: Ticket, *, front: bool = False) -> None:
        """Queue a ticket (`front`: back in its old place, after a failed start) and keep the
        counts and the doom timer's heap in step. A ticket may stand in the heap twice after
        a requeue; `expire` skips whatever is not queued."""
        request = ticket.request
        if front:
            self._queue.push_front(ticket)
        else:
            self._queue.push(ticket)
        self._queued[request.request_id] = ticket
        if ticket.entitled:
            self.backlog.on_enqueue()
        else:
            self._surplus_by_class[ticket.contract.cls] += 1
            self._surplus_by_tenant[request.tenant] += 1
        doomed_after = self._doom.doomed_after(
            ticket.deadline_at, request.num_output_tokens, request.prompt_tokens_lower
        )
        if doomed_after != float("inf"):
            heapq.heappush(self._doom_heap, (doomed_after, ticket.seq, ticket))

    def _dequeued(self, ticket: Ticket) -> None:
        """Bookkeeping for a ticket that left the queue (started, dropped or aborted)."""
        request = ticket.request
        del self._queued[request.request_id]
        if ticket.entitled:
            self.backlog.on_dequeue()
        else:
            self._surplus_by_class[ticket.contract.cls] -= 1
            self._surplus_by_tenant[request.tenant] -= 1

    def _is_queued(self, ticket: Ticket) -> bool:
        return self._queued.get(ticket.request.request_id) is ticket

    def next_doom_at(self) -> float | None:
        """When the earliest queued request becomes doomed (call `expire` then); None if no
        queued request can become doomed (no lower envelope, or nothing queued)."""
        heap = self._doom_heap
        while heap and not self._is_queued(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def expire(self, now: float) -> list[Drop]:
        """Drop every queued request that is doomed at `now` (`now + L > D`, SPEC §4.3),
        without waiting for a slot to free (SPEC §12)."""
        out: list[Drop] = []
        heap = self._doom_heap
        while heap:
            ticket = heap[0][2]
            if not self._is_queued(ticket):
                heapq.heappop(heap)
                continue
            request = ticket.request
            if not self._doom.is_doomed(
                ticket.deadline_at, request.num_output_tokens, now, request.prompt_tokens_lower
            ):
                break
            heapq.heappop(heap)
            self._queue.cancel(ticket)
            self._dequeued(ticket)
            out.append(self._drop(ticket, now))
        return out

    def requeue(self, request_id: RequestId, now: float) -> None:
        """Its backend could not be reached before any byte was sent: free the slot and
        let the request wait again in its old place (ahead of everything admitted after
        it), to be placed on a backend that answers."""
        ticket = self._in_flight.pop(request_id, None)
        if ticket is None:
            raise KeyError(f"request {request_id!r} is not in flight")
        self._slots.release(ticket.backend)
        if self._sink is not None:
            self._sink(
                TraceEvent(
                    now,
                    EventKind.REQUEUE,
                    request_id,
                    ticket.request.tenant,
                    ticket.contract.cls,
                    backend=ticket.backend,
                    reason="backend_unreachable",
                )
            )
        ticket.backend = -1
        ticket.dispatched_at = float("nan")
        self._enqueue(ticket, front=True)

    def set_backend_available(self, backend: int, available: bool) -> None:
        """Whether `backend` may get new requests (the driver's health probe says). A down
        backend's slots are not offered by `poll`; what runs there still ends normally."""
        self._slots.set_available(backend, available)

    def holds(self, request_id: RequestId) -> bool:
        """Whether the request is still queued or in flight (not yet ended)."""
        return request_id in self._queued or request_id in self._in_flight

    def in_flight_request(self, request_id: RequestId) -> Request | None:
        """The request if it is in flight (dispatched, not yet ended), else None."""
        ticket = self._in_flight.get(request_id)
        return ticket.request if ticket is not None else None

    # -- dispatch -------------------------------------------------------------------------

    def poll(self, now: float) -> list[Dispatch | Drop]:
        """Fill free slots from the queue, dropping (only) the provably doomed."""
        out: list[Dispatch | Drop] = []
        slots, queue = self._slots, self._queue
        while slots.num_free > 0:
            ticket = queue.pop()
            if ticket is None:
                break
            request = ticket.request
            self._dequeued(ticket)
            verdict = self._doom.check(
                ticket.deadline_at,
                request.num_output_tokens,
                now,
                prompt_lower=request.prompt_tokens_lower,
                prompt_upper=request.num_prompt_tokens,
            )
            if verdict is DoomVerdict.DROP:
                out.append(self._drop(ticket, now))
                continue
            if verdict is DoomVerdict.UNCERTAIN:
                self.stats.doom_uncertain += 1
            ticket.backend = slots.acquire()
            ticket.dispatched_at = now
            self._in_flight[request.request_id] = ticket
            if self._sink is not None:
                self._sink(
                    TraceEvent(
                        now,
                        EventKind.DISPATCH,
                        request.request_id,
                        request.tenant,
                        ticket.contract.cls,
                        backend=ticket.backend,
                        entitled=ticket.entitled,
                    )
                )
            out.append(Dispatch(request, ticket.backend, now, ticket.entitled, ticket.deadline_at))
        return out

    def _drop(self, ticket: Ticket, now: float) -> Drop:
        self.stats.per_class[ticket.contract.cls].dropped += 1
        request = ticket.request
        if self._sink is not None:
            self._sink(
                TraceEvent(
                    now,
                    EventKind.DROP,
                    request.request_id,
                    request.tenant,
                    ticket.contract.cls,
                    reason="doomed",
                    deadline_at=ticket.deadline_at,
                    num_output_tokens=request.num_output_tokens,
                )
            )
        return Drop(request, now, "doomed")

    # -- in flight ------------------------------------------------------------------------

    def on_first_token(self, request_id: RequestId, now: float) -> None:
        ticket = self._in_flight.get(request_id)
        if ticket is not None and self._sink is not None:
            self._sink(
                TraceEvent(
                    now,
                    EventKind.FIRST_TOKEN,
                    request_id,
                    ticket.request.tenant,
                    ticket.contract.cls,
                )
            )

    def on_complete(self, request_id: RequestId, now: float) -> Completion:
        ticket = self._release(request_id)
        service_s = now - ticket.dispatched_at
        late = now > ticket.deadline_at
        stats = self.stats.per_class[ticket.contract.cls]
        stats.completed += 1
        stats.late += late
        request = ticket.request
        self.envelope.observe(
            request.num_output_tokens,
            service_s,
            request.prompt_tokens_lower,
            request.num_prompt_tokens,
        )
        self.capacity.on_complete(now, self._queue.num_queued)
        if self._sink is not None:
            self._sink(
                TraceEvent(
                    now,
                    EventKind.COMPLETE,
                    request_id,
                    ticket.request.tenant,
                    ticket.contract.cls,
                    backend=ticket.backend,
                )
            )
        return Completion(request_id, now, service_s, late)

    def on_fail(self, request_id: RequestId, now: float, reason: str) -> None:
        """The backend failed an in-flight request (error, timeout): free its slot."""
        ticket = self._release(request_id)
        self.stats.per_class[ticket.contract.cls].failed += 1
        self._emit_end(EventKind.FAIL, ticket, now, reason)

    def on_abort(self, request_id: RequestId, now: float, reason: str) -> bool:
        """The client went away: dequeue it, or free its slot. False if it already ended."""
        ticket = self._queued.get(request_id)
        if ticket is not None:
            self._queue.cancel(ticket)
            self._dequeued(ticket)
        elif request_id in self._in_flight:
            ticket = self._release(request_id)
        else:
            return False
        self.stats.per_class[ticket.contract.cls].aborted += 1
        self._emit_end(EventKind.ABORT, ticket, now, reason)
        return True

    def _release(self, request_id: RequestId) -> Ticket:
        ticket = self._in_flight.pop(request_id, None)
        if ticket is None:
            raise KeyError(f"request {request_id!r} is not in flight")
        self._slots.release(ticket.backend)
        return ticket

    def _emit_end(self, kind: EventKind, ticket: Ticket, now: float, reason: str) -> None:
        if self._sink is not None:
            self._sink(
                TraceEvent(
                    now,
                    kind,
                    ticket.request.request_id,
                    ticket.request.tenant,
                    ticket.contract.cls,
                    reason=reason,
                    backend=ticket.backend if ticket.backend >= 0 else None,
                )
            )

    # -- views ----------------------------------------------------------------------------

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def num_queued(self) -> int:
        return self._queue.num_queued

    @property
    def num_queued_entitled(self) -> int:
        return self._queue.num_queued_entitled

    @property
    def max_assured_tokens(self) -> int:
        """The largest ℓ of any assured arrival so far (0 before the first)."""
        return self._max_assured_tokens

    def in_flight_on(self, backend: int) -> int:
        return self._slots.in_flight(backend)

    def load(self) -> LoadSnapshot:
        """What a learner is told about current load."""
        return LoadSnapshot(
            len(self._in_flight),
            self._queue.num_queued_entitled,
            self._queue.num_queued - self._queue.num_queued_entitled,
            self.config.total_slots,
        )

    def store_call(self, request: Request, now: float) -> StoreCall | None:
        """The credit-store call `on_arrival(request, now)` would make (None: it makes
        none — not an assured tenant, or cost-excess). A driver with a remote store makes
        it itself, asynchronously, and passes the grant to `on_arrival`."""
        contract = self._contracts.get(request.tenant)
        if contract is None or contract.cls is not ASSURED:
            return None
        weight = self._meter.weight(request)
        if weight > contract.floor:
            return None
        return StoreCall(contract.tenant, weight, self.effective_floor(contract))

    def consults_learner(self, request: Request, now: float, grant: Grant | None = None) -> bool:
        """Whether `on_arrival(request, now, grant=grant)` would ask the learner, changing
        nothing. A driver whose learner answers asynchronously (an HTTP callout) fetches a
        proposal first only for these, so a floor-entitled request never waits on it."""
        contract = self._contracts.get(request.tenant)
        if contract is None:
            return False
        if contract.cls is not ASSURED:
            return True
        weight = self._meter.weight(request)
        if contract.excess_policy is not ExcessPolicy.DEMOTE or weight > contract.floor:
            return False  # rejected, or cost-excess: no learner either way
        floor = self.effective_floor(contract)
        if grant is None:
            remaining = self._meter.remaining(contract, now) - (contract.floor - floor)
            window = self.config.schedule.index_at(now)
            if weight <= remaining:
                return False  # entitled
        elif grant.granted:
            return False
        else:
            remaining, window = grant.remaining, grant.window_index
        return self._lowered_weight(contract, request, floor, window, remaining) is None

    def credits_left(self, tenant: str, now: float) -> int | None:
        contract = self._contracts.get(tenant)
        if contract is None or not contract.assured:
            return None
        return self._meter.remaining(contract, now)

    def assumptions(self) -> AssumptionReport:
        """SPEC §6 for the largest assured ℓ seen so far (16 before any arrival)."""
        return assumption_report(
            self.config,
            num_output_tokens=self._max_assured_tokens or 16,
            max_service_s=self.envelope.max_service_s if self.envelope.num_observed else None,
            num_above_ceiling=self.envelope.num_above_upper,
            max_backlog=self.backlog.max_backlog,
        )
