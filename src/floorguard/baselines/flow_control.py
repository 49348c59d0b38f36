"""`flow-control`: a GAIE-style flow controller in front of FIFO backends.

* A request→objective mapping picks each request's objective from its class; the objective's
  priority is its band (higher first). Bands are served strictly: a lower band dispatches
  only when every higher band is empty.
* Within a band, round-robin over a fairness id (the tenant).
* A saturation detector holds dispatch while every backend is saturated: all `C` slots busy
  and at least `queue_depth_threshold` waiting there (GAIE's queue-depth signal), read
  without staleness. Requests of a negative-priority (sheddable) band are rejected on
  arrival while saturated.
* A queue TTL evicts requests that waited too long in the controller (`ttl_expired`).

The mapping is a configuration, and can be wrong: `MappingFault.SWAP` gives each class the
other's objective (docs/design.md §7 fault injection), which flips which class goes first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from floorguard.baselines.server import Decision, ServerOrder, ServerStack
from floorguard.core.contract import Contract, ContractClass, GuardConfig
from floorguard.core.dispatcher import Ticket
from floorguard.core.learner import Proposal
from floorguard.core.request import Request
from floorguard.core.surface import Drop, Sink
from floorguard.errors import require

__all__ = ["FlowControlOptions", "FlowControlStack", "MappingFault", "Objective"]


class MappingFault(StrEnum):
    NONE = "none"
    SWAP = "swap"
    """Each class gets the other class's objective."""


@dataclass(frozen=True)
class Objective:
    name: str
    priority: int
    """Higher is served first; negative is sheddable under saturation (GAIE)."""


@dataclass(frozen=True)
class FlowControlOptions:
    objectives: dict[ContractClass, Objective] = field(
        default_factory=lambda: {
            ContractClass.ASSURED: Objective("premium", 10),
            ContractClass.OPPORTUNISTIC: Objective("sheddable", -1),
        }
    )
    mapping_fault: MappingFault = MappingFault.NONE
    queue_depth_threshold: int = 5
    """GAIE's default queue-depth saturation threshold."""
    queue_ttl_s: float | None = None
    """None: each request's own deadline budget."""

    def __post_init__(self) -> None:
        require(
            self.queue_depth_threshold >= 0,
            "queue_depth_threshold",
            self.queue_depth_threshold,
            "must be ≥ 0",
        )
        require(
            self.queue_ttl_s is None or self.queue_ttl_s > 0,
            "queue_ttl_s",
            self.queue_ttl_s,
            "must be > 0",
        )

    def objective_for(self, cls: ContractClass) -> Objective:
        if self.mapping_fault is MappingFault.SWAP:
            cls = (
                ContractClass.OPPORTUNISTIC
                if cls is ContractClass.ASSURED
                else ContractClass.ASSURED
            )
        return self.objectives[cls]


class _Band:
    """One priority band: a FIFO per fairness id, served round-robin."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[Ticket]] = {}
        self.turn: deque[str] = deque()

    def push(self, fairness_id: str, job: Ticket) -> None:
        if fairness_id not in self.queues:
            self.queues[fairness_id] = deque()
            self.turn.append(fairness_id)
        self.queues[fairness_id].append(job)

    def pop(self) -> Ticket | None:
        while self.turn:
            fairness_id = self.turn.popleft()
            queue = self.queues[fairness_id]
            while queue and queue[0].cancelled:
                queue.popleft()
            if not queue:
                del self.queues[fairness_id]
                continue
            job = queue.popleft()
            if queue:
                self.turn.append(fairness_id)
            else:
                del self.queues[fairness_id]
            return job
        return None

    def expired(self, now: float, ttl_of: Callable[[Ticket], float]) -> list[Ticket]:
        out = []
        for queue in self.queues.values():
            while queue and (
                queue[0].cancelled or now - queue[0].request.arrival_at > ttl_of(queue[0])
            ):
                job = queue.popleft()
                if not job.cancelled:
                    out.append(job)
        return out


class FlowControlStack(ServerStack):
    name = "flow-control"
    server_order = ServerOrder.FIFO

    def __init__(
        self,
        config: GuardConfig,
        *,
        options: FlowControlOptions | None = None,
        sink: Sink | None = None,
        started_at: float = 0.0,
    ) -> None:
        super().__init__(config, sink=sink, started_at=started_at)
        self.options = options if options is not None else FlowControlOptions()
        self._bands: dict[int, _Band] = {}

    def saturated(self) -> bool:
        threshold = self.options.queue_depth_threshold
        return all(
            self.in_flight_on(b) + self.num_waiting_on(b) >= c + threshold
            for b, c in enumerate(self.config.slots)
        )

    def _decide(
        self, request: Request, contract: Contract, now: float, proposal: Proposal | None
    ) -> Decision:
        objective = self.options.objective_for(contract.cls)
        if objective.priority < 0 and self.saturated():
            return Decision("shed_saturated")
        return Decision(None, -objective.priority)

    def _accept(self, ticket: Ticket, now: float) -> None:
        band = -int(ticket.hint)
        self._bands.setdefault(band, _Band()).push(ticket.request.tenant, ticket)

    def _ttl_s(self, job: Ticket) -> float:
        ttl = self.options.queue_ttl_s
        if ttl is not None:
            return ttl
        return job.contract.deadline_for(job.request.num_output_tokens)

    def _release_held(self, now: float) -> list[Drop]:
        drops = []
        for band in self._bands.values():
            for ticket in band.expired(now, self._ttl_s):
                self._queue_exit(ticket)
                drops.append(self._drop(ticket, now, "ttl_expired"))
        while not self.saturated():
            job = self._next()
            if job is None:
                break
            self._forward(job)
        return drops

    def _next(self) -> Ticket | None:
        for priority in sorted(self._bands, reverse=True):
            job = self._bands[priority].pop()
            if job is not None:
                return job
        return None
