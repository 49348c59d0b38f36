"""`ServerStack`: the shape every comparison stack shares (SPEC §7).

A stack decides admission its own way, then hands requests to backends that behave like
vLLM: each keeps its own waiting queue — FIFO, or ordered by `(priority, arrival)` under
`--scheduling-policy priority` — and starts the head whenever one of its `C` slots frees.
A running request is never preempted. Stacks may hold requests in a queue of their own
first (flow control). The driver surface and the trace schema are the guard's, so the
simulator, the metrics and the checker treat every stack alike.

A stack has no floor and no doom gate: its trace's config carries no lower envelope, and its
admissions are never `entitled`.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, NamedTuple

from floorguard.core.contract import Contract, ContractClass, GuardConfig
from floorguard.core.dispatcher import SlotPool
from floorguard.core.events import EventKind, TraceEvent, arrive_event, config_to_dict
from floorguard.core.guard import Admission, Completion, Dispatch, Drop, GuardStats
from floorguard.core.learner import LoadSnapshot
from floorguard.core.monitors import BacklogMonitor, EnvelopeMonitor
from floorguard.core.request import Request, RequestId

__all__ = ["Decision", "Job", "ServerOrder", "ServerStack"]

Sink = Callable[[TraceEvent], None]
ASSURED = ContractClass.ASSURED


class ServerOrder(StrEnum):
    FIFO = "fifo"
    PRIORITY = "priority"
    """vLLM `--scheduling-policy priority`: lowest priority value first, then arrival."""


class Decision(NamedTuple):
    reason: str | None
    """None admits; otherwise the rejection reason."""
    priority: float = 0.0
    """The per-request priority handed to the backend (lower first)."""


@dataclass(slots=True, eq=False)
class Job:
    request: Request
    contract: Contract
    deadline_at: float
    seq: int
    priority: float
    backend: int = -1
    dispatched_at: float = math.nan
    running: bool = False
    at_backend: bool = False
    cancelled: bool = False


class ServerStack(ABC):
    name = "server"
    server_order = ServerOrder.FIFO

    def __init__(
        self, config: GuardConfig, *, sink: Sink | None = None, started_at: float = 0.0
    ) -> None:
        self.config = replace(config, lower_envelope=None)
        self._contracts = {c.tenant: c for c in config.contracts}
        self._sink = sink
        self._slots = SlotPool(config.slots)
        self._waiting: list[list[tuple[float, int, Job]]] = [[] for _ in config.slots]
        self._num_waiting = [0] * len(config.slots)
        self._jobs: dict[RequestId, Job] = {}
        self._seq = 0
        self._max_assured_tokens = 0
        self.stats = GuardStats()
        self.envelope = EnvelopeMonitor(None, config.upper_envelope)
        self.backlog = BacklogMonitor(config.total_floor)
        """Assured requests admitted and not yet started (a stack has no entitlement)."""
        if sink is not None:
            sink(TraceEvent(started_at, EventKind.CONFIG, data=config_to_dict(self.config)))

    # -- what a stack decides -------------------------------------------------------------

    @abstractmethod
    def _decide(self, request: Request, contract: Contract, now: float) -> Decision:
        """Admit (reason None, with a backend priority) or reject with a reason."""

    def _accept(self, job: Job, now: float) -> None:
        """Where an admitted job goes first; by default straight to a backend's queue."""
        self._forward(job)

    def _release(self, now: float) -> list[Drop]:
        """Hook run at every poll before slots are filled (flow control forwards here)."""
        return []

    # -- the driver surface ---------------------------------------------------------------

    def on_arrival(
        self, request: Request, now: float, scheduled_at: float | None = None
    ) -> Admission:
        contract = self._contracts.get(request.tenant)
        if self._sink is not None:
            self._sink(arrive_event(now, request, contract, scheduled_at))
        if contract is None:
            self.stats.unknown_tenant += 1
            return self._reject(request, None, "unknown_tenant", now)
        stats = self.stats.per_class[contract.cls]
        stats.offered += 1
        if contract.cls is ASSURED:
            self._max_assured_tokens = max(self._max_assured_tokens, request.num_output_tokens)
        decision = self._decide(request, contract, now)
        if decision.reason is not None:
            return self._reject(request, contract, decision.reason, now)
        stats.admitted += 1
        deadline_at = request.arrival_at + contract.deadline_budget_s
        self._seq += 1
        job = Job(request, contract, deadline_at, self._seq, decision.priority)
        self._jobs[request.request_id] = job
        if contract.cls is ASSURED:
            self.backlog.on_enqueue()
        if self._sink is not None:
            self._emit(EventKind.ADMIT, job, now, entitled=False, deadline_at=deadline_at)
            self._emit(EventKind.ENQUEUE, job, now)
        self._accept(job, now)
        return Admission(request.request_id, True, contract.cls, False, False, None, deadline_at)

    def poll(self, now: float) -> list[Dispatch | Drop]:
        out: list[Dispatch | Drop] = list(self._release(now))
        for backend, waiting in enumerate(self._waiting):
            while waiting and self._slots.in_flight(backend) < self._slots.capacity[backend]:
                job = heapq.heappop(waiting)[2]
                if not job.cancelled:
                    out.append(self._start(job, backend, now))
        return out

    def on_first_token(self, request_id: RequestId, now: float) -> None:
        job = self._jobs.get(request_id)
        if job is not None and job.running and self._sink is not None:
            self._emit(EventKind.FIRST_TOKEN, job, now)

    def on_complete(self, request_id: RequestId, now: float) -> Completion:
        job = self._finish(request_id)
        service_s = now - job.dispatched_at
        late = now > job.deadline_at
        stats = self.stats.per_class[job.contract.cls]
        stats.completed += 1
        stats.late += late
        self.envelope.observe(job.request.num_output_tokens, service_s)
        if self._sink is not None:
            self._emit(EventKind.COMPLETE, job, now, backend=job.backend)
        return Completion(request_id, now, service_s, late)

    def on_fail(self, request_id: RequestId, now: float, reason: str) -> None:
        job = self._finish(request_id)
        self.stats.per_class[job.contract.cls].failed += 1
        if self._sink is not None:
            self._emit(EventKind.FAIL, job, now, reason=reason, backend=job.backend)

    def on_abort(self, request_id: RequestId, now: float, reason: str) -> bool:
        job = self._jobs.get(request_id)
        if job is None:
            return False
        if job.running:
            self._finish(request_id)
        else:
            self._dequeue(job)
        self.stats.per_class[job.contract.cls].aborted += 1
        if self._sink is not None:
            self._emit(
                EventKind.ABORT,
                job,
                now,
                reason=reason,
                backend=job.backend if job.running else None,
            )
        return True

    @property
    def num_in_flight(self) -> int:
        return sum(self._slots.in_flight(b) for b in range(len(self.config.slots)))

    @property
    def num_queued(self) -> int:
        return len(self._jobs) - self.num_in_flight

    @property
    def max_assured_tokens(self) -> int:
        return self._max_assured_tokens

    def in_flight_on(self, backend: int) -> int:
        return self._slots.in_flight(backend)

    def num_waiting_on(self, backend: int) -> int:
        """Requests in this backend's own waiting queue (forwarded, not started)."""
        return self._num_waiting[backend]

    def load(self) -> LoadSnapshot:
        """What a learner in front of this stack sees: everything admitted is queued somewhere."""
        queued_assured = sum(
            1 for j in self._jobs.values() if not j.running and j.contract.cls is ASSURED
        )
        return LoadSnapshot(
            self.num_in_flight,
            queued_assured,
            self.num_queued - queued_assured,
            self.config.total_slots,
        )

    # -- internals ------------------------------------------------------------------------

    def _forward(self, job: Job) -> None:
        """To the backend with the fewest requests (running + waiting), into its queue."""
        backend = min(
            range(len(self._waiting)), key=lambda b: self._slots.in_flight(b) + self._num_waiting[b]
        )
        key = job.priority if self.server_order is ServerOrder.PRIORITY else 0.0
        job.backend = backend
        job.at_backend = True
        self._num_waiting[backend] += 1
        heapq.heappush(self._waiting[backend], (key, job.seq, job))

    def _start(self, job: Job, backend: int, now: float) -> Dispatch:
        self._slots.acquire_on(backend)
        self._num_waiting[backend] -= 1
        job.running = True
        job.dispatched_at = now
        if job.contract.cls is ASSURED:
            self.backlog.on_dequeue()
        if self._sink is not None:
            self._emit(EventKind.DISPATCH, job, now, backend=backend, entitled=False)
        return Dispatch(job.request, backend, now, False, job.deadline_at)

    def _finish(self, request_id: RequestId) -> Job:
        job = self._jobs.get(request_id)
        if job is None or not job.running:
            raise KeyError(f"request {request_id!r} is not in flight")
        del self._jobs[request_id]
        self._slots.release(job.backend)
        return job

    def _dequeue(self, job: Job) -> None:
        """Remove a job that has not started (lazily from the backend heaps)."""
        job.cancelled = True
        if job.at_backend:
            self._num_waiting[job.backend] -= 1
        del self._jobs[job.request.request_id]
        if job.contract.cls is ASSURED:
            self.backlog.on_dequeue()

    def _drop(self, job: Job, now: float, reason: str) -> Drop:
        self._dequeue(job)
        self.stats.per_class[job.contract.cls].dropped += 1
        if self._sink is not None:
            self._emit(
                EventKind.DROP,
                job,
                now,
                reason=reason,
                deadline_at=job.deadline_at,
                num_output_tokens=job.request.num_output_tokens,
            )
        return Drop(job.request, now, reason)

    def _reject(
        self, request: Request, contract: Contract | None, reason: str, now: float
    ) -> Admission:
        cls = contract.cls if contract is not None else None
        if cls is not None:
            self.stats.per_class[cls].rejected += 1
        if self._sink is not None:
            self._sink(
                TraceEvent(
                    now, EventKind.REJECT, request.request_id, request.tenant, cls, reason=reason
                )
            )
        return Admission(request.request_id, False, cls, False, False, None, None, reason)

    def _emit(self, kind: EventKind, job: Job, now: float, **fields: Any) -> None:
        assert self._sink is not None
        request = job.request
        self._sink(
            TraceEvent(now, kind, request.request_id, request.tenant, job.contract.cls, **fields)
        )
