"""`ServerStack`: the shape every comparison stack shares (docs/design.md §7).

A stack decides admission its own way, then hands requests to backends that behave like
vLLM: each keeps its own waiting queue — FIFO, or ordered by `(priority, arrival)` under
`--scheduling-policy priority` — and starts the head whenever one of its `C` slots frees.
A running request is never preempted. Stacks may hold requests in a queue of their own
first (flow control).

A stack is only its decision rule (`_decide`) on the core's `Ledger` (the driver surface,
the trace, the stats and the monitors: the guard's) and the core's `Dispatcher` (one per
backend: the backend's waiting queue, where no ticket is floor-entitled). A stack has no
floor and no doom gate: its trace's config carries no lower envelope, and its admissions
are never `entitled`.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import replace
from enum import StrEnum
from typing import NamedTuple

from floorguard.core.contract import Contract, GuardConfig
from floorguard.core.dispatcher import AssuredFirstDispatcher, Ticket
from floorguard.core.learner import Learner, Proposal
from floorguard.core.ledger import Ledger
from floorguard.core.request import Request
from floorguard.core.surface import (
    Dispatch,
    Drop,
    Pending,
    RejectReason,
    Sink,
    require_consultation,
    require_undecided,
)

__all__ = ["Decision", "ServerOrder", "ServerStack"]


class ServerOrder(StrEnum):
    FIFO = "fifo"
    PRIORITY = "priority"
    """vLLM `--scheduling-policy priority`: lowest priority value first, then arrival."""


class Decision(NamedTuple):
    reason: str | None
    """None admits; otherwise the rejection reason."""
    priority: float = 0.0
    """The per-request priority handed to the backend (lower first)."""


class ServerStack(Ledger, ABC):
    name = "server"
    server_order = ServerOrder.FIFO
    consults_learner = False
    """Whether each arrival waits on the learner's proposal (`_decide` gets it)."""

    def __init__(
        self,
        config: GuardConfig,
        *,
        learner: Learner | None = None,
        sink: Sink | None = None,
        started_at: float = 0.0,
    ) -> None:
        super().__init__(
            replace(config, lower_envelope=None),
            learner=learner,
            sink=sink,
            started_at=started_at,
            backlog_counts_class=True,
        )
        self._waiting = [AssuredFirstDispatcher() for _ in config.slots]
        """Each backend's waiting queue: no ticket is entitled, so the dispatcher orders
        them all by (priority, arrival at the backend)."""
        self._forwarded = itertools.count()
        """Arrival order at the backends: a ticket's `seq` is renumbered when it is
        forwarded, so a request a stack held first queues behind those forwarded before it
        (a backend knows when a request reached it, not when a stack admitted it)."""

    # -- what a stack decides -------------------------------------------------------------

    @abstractmethod
    def _decide(
        self, request: Request, contract: Contract, now: float, proposal: Proposal | None
    ) -> Decision:
        """Admit (reason None, with a backend priority) or reject with a reason; `proposal`
        is the learner's (None for a fault) where the stack `consults_learner`."""

    def _accept(self, ticket: Ticket, now: float) -> None:
        """Where an admitted ticket goes first; by default straight to a backend's queue."""
        self._forward(ticket)

    def _release_held(self, now: float) -> list[Drop]:
        """Hook run at every poll before slots are filled (flow control forwards here)."""
        return []

    # -- the driver surface ---------------------------------------------------------------

    def begin_arrival(
        self, request: Request, now: float, scheduled_at: float | None = None
    ) -> Pending:
        pending = self._arrive(request, now, scheduled_at)
        if pending.contract is None:
            return self._reject(pending, RejectReason.UNKNOWN_TENANT, now)
        if self.consults_learner:
            return self._ask(pending, now)
        return self._decided(pending, now, None)

    def continue_arrival(self, pending: Pending, now: float, answer: object) -> Pending:
        require_undecided(pending, answer)
        consultation = require_consultation(pending, answer)
        return self._decided(pending, now, self._consulted(pending, now, consultation))

    def _decided(self, pending: Pending, now: float, proposal: Proposal | None) -> Pending:
        decision = self._decide(pending.request, pending.known_contract, now, proposal)
        if decision.reason is not None:
            return self._reject(pending, decision.reason, now)
        ticket = self._admit(pending, now, entitled=False, hint=decision.priority)
        self._queue_entry(ticket)
        self._accept(ticket, now)
        return pending

    def poll(self, now: float) -> list[Dispatch | Drop]:
        out: list[Dispatch | Drop] = list(self._release_held(now))
        slots = self._slots
        for backend, waiting in enumerate(self._waiting):
            while slots.in_flight(backend) < slots.capacity[backend]:
                ticket = waiting.pop()
                if ticket is None:
                    break
                self._queue_exit(ticket)
                slots.acquire_on(backend)
                out.append(self._start(ticket, backend, now))
        return out

    def num_waiting_on(self, backend: int) -> int:
        """Requests in this backend's own waiting queue (forwarded, not started)."""
        return self._waiting[backend].num_queued

    # -- internals ------------------------------------------------------------------------

    def _forward(self, ticket: Ticket) -> None:
        """To the backend with the fewest requests (running + waiting), into its queue."""
        slots, waiting = self._slots, self._waiting
        backend = min(range(len(waiting)), key=lambda b: slots.in_flight(b) + waiting[b].num_queued)
        if self.server_order is ServerOrder.FIFO:
            ticket.hint = 0.0  # a FIFO backend ignores the priority: arrival order
        ticket.seq = next(self._forwarded)
        ticket.backend = backend
        waiting[backend].push(ticket)

    def _cancel(self, ticket: Ticket) -> None:
        if ticket.backend >= 0:
            self._waiting[ticket.backend].cancel(ticket)
        else:
            ticket.cancelled = True  # held by the stack itself (flow control): lazily
        self._queue_exit(ticket)
