"""The guard: class binding, meter, learner, dispatcher, doom gate and monitors composed.

Pure: no I/O, no clock reads. It speaks the driver surface every stack shares
(`floorguard.core.surface`): arrival in two steps — `begin_arrival` says what it needs
(a floor charge from the credit store, or the learner's proposal for the surplus),
`continue_arrival` decides with the answer — then `poll` / `expire` / `requeue` and the
lifecycle calls. Every decision is returned as data and logged as a `TraceEvent` by the
`Ledger` it extends.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Final

from floorguard.core.contract import (
    CapacityAction,
    Contract,
    ContractClass,
    ExcessPolicy,
    GuardConfig,
)
from floorguard.core.dispatcher import Ticket, create_dispatcher
from floorguard.core.doom import DoomVerdict
from floorguard.core.events import EventKind, new_event
from floorguard.core.learner import Learner, consult
from floorguard.core.ledger import Ledger
from floorguard.core.meter import ReservationMeter
from floorguard.core.refusals import WINDOW_BOUND
from floorguard.core.request import Request, RequestId
from floorguard.core.stats import ClassStats, GuardStats
from floorguard.core.surface import (
    Admission,
    Answer,
    Dispatch,
    Drop,
    Pending,
    RejectReason,
    Sink,
    StoreCall,
    require_consultation,
    require_undecided,
)
from floorguard.errors import ProtocolError
from floorguard.store.base import CreditStore, Grant
from floorguard.store.memory import MemoryCreditStore

__all__ = [
    "Admission",
    "ClassStats",
    "Dispatch",
    "Drop",
    "Guard",
    "GuardStats",
    "RejectReason",
    "StoreCall",
]

ASSURED: Final = ContractClass.ASSURED
DROP: Final = DoomVerdict.DROP


class Guard(Ledger):
    def __init__(
        self,
        config: GuardConfig,
        *,
        learner: Learner | None,
        store: CreditStore | None = None,
        sink: Sink | None = None,
        started_at: float = 0.0,
    ) -> None:
        """`learner` None: the driver answers every learner ask itself (an HTTP callout)."""
        super().__init__(
            config,
            learner=learner,
            store=store if store is not None else MemoryCreditStore(),
            sink=sink,
            started_at=started_at,
        )
        self._meter = ReservationMeter(config.meter)
        self._queue = create_dispatcher(config.dispatch, config.surplus, config.upper_envelope)
        self._doom_heap: list[tuple[float, int, Ticket]] | None = None
        """(doomed after, seq, ticket) of queued tickets: `expire` drops them on time. Built
        at the first `next_doom_at` / `expire` (a driver that only drops at dispatch, as
        the simulator does, never pays for the timer), kept in step from then on."""
        self._reserved = config.kept_slots
        """`r`, the floor's reserved slots (docs/design.md §19), as many as its slots allow."""
        self._lowered: dict[str, tuple[int, int]] = {}
        """tenant -> (window, weight refused as floor_lowered in it)"""
        self._take_limits(config)

    def _take_limits(self, config: GuardConfig) -> None:
        limits = config.queue_limits
        self._surplus_limit = {cls: limits.for_class(cls) for cls in ContractClass}
        """The queue limit on each class's surplus (None: none); `per_tenant` beside it."""
        self._refuse_busy = limits.refuse_busy and config.lower_envelope is not None

    def reconfigure(self, config: GuardConfig, now: float, reason: str = "reload") -> int:
        """`Ledger.reconfigure`; the surplus queue limits change at once, and so do the
        reserved slots in force where the slots did (a fleet's shares)."""
        from_window = super().reconfigure(config, now, reason)
        self._take_limits(config)
        self._reserved = self.config.kept_slots
        return from_window

    # -- arrival --------------------------------------------------------------------------

    def begin_arrival(
        self, request: Request, now: float, scheduled_at: float | None = None
    ) -> Pending:
        """Bind the class from the tenant; an assured arrival then needs its floor charge
        (a `StoreCall`, or a cost-excess refusal), a surplus one the learner's proposal."""
        pending = self._arrive(request, now, scheduled_at)
        contract = pending.contract
        if contract is None:
            return self._reject(pending, RejectReason.UNKNOWN_TENANT, now)
        if self._kv_budgeted and not self.config.kv_fits_somewhere(
            self.config.kv_reservation(request.num_prompt_tokens, request.num_output_tokens)
        ):
            window = self.config.schedule.index_at(now) if contract.assured else None
            return self._reject(pending, RejectReason.KV_EXCESS, now, window)
        if contract.cls is not ASSURED:
            return self._ask(pending, now)
        weight = self._meter.weight(request)
        if self._meter.is_cost_excess(contract, weight):
            return self._refuse(
                pending, RejectReason.COST_EXCESS, self.config.schedule.index_at(now), now
            )
        pending.floor = self.effective_floor(contract)
        pending.need = StoreCall(contract.tenant, weight, pending.floor, now, contract.floor)
        return pending

    def on_arrival(
        self, request: Request, now: float, scheduled_at: float | None = None
    ) -> Admission:
        """Arrival with its needs answered by the guard's own store and learner (the
        simulator's path): `Ledger.on_arrival`, with the answering inlined — the same steps,
        without a generic dispatch per need on the hot path."""
        pending = self.begin_arrival(request, now, scheduled_at)
        need = pending.need
        if type(need) is StoreCall:
            grant = self._store.acquire(  # type: ignore[union-attr]  # the guard has one
                need.key, need.weight, need.capacity, self.config.schedule, now, floor=need.floor
            )
            pending = self._charged(pending, now, grant)
            need = pending.need
        if need is not None:  # a LearnerAsk
            answer = consult(self._learner, need.request, need.cls, need.load, now)  # type: ignore[arg-type, union-attr]
            pending = self._proposed(pending, now, answer)
        return pending.admission  # type: ignore[return-value]  # decided: need is None

    def continue_arrival(self, pending: Pending, now: float, answer: object) -> Pending:
        """Decide with the answer to `pending.need`; a demoted arrival needs the learner
        next (docs/design.md §4.1: entitled from the floor, else the excess policy). `answer` is
        checked here, whatever the driver passed (a compiled core would otherwise refuse a
        wrong type at the call with a TypeError, the pure one later)."""
        require_undecided(pending, answer)
        if type(pending.need) is StoreCall:
            if type(answer) is not Grant:
                raise ProtocolError(
                    f"request {pending.request.request_id!r}: a store call answered with "
                    f"{answer!r}, not a Grant"
                )
            return self._charged(pending, now, answer)
        return self._proposed(pending, now, require_consultation(pending, answer))

    def _charged(self, pending: Pending, now: float, grant: Grant) -> Pending:
        request, contract = pending.request, pending.known_contract
        window = grant.window_index
        pending.remaining = grant.remaining
        if grant.floor is not None and grant.floor != contract.floor:
            pending.pinned = grant.floor
        if grant.granted:
            if self._reserved:
                self._count_grant(window, self._meter.weight(request))
            self._enqueue(self._admit(pending, now, entitled=True, window_index=window))
            return pending
        reason = self._excess_reason(contract, request, pending.floor, grant)
        if reason is RejectReason.FLOOR_LOWERED or not self._may_demote(contract.excess_policy):
            return self._refuse(pending, reason, window, now)
        self.stats.per_class[ASSURED].demoted += 1
        pending.demoted = True
        if self._sink is not None:
            self._sink(
                new_event(
                    now,
                    EventKind.DEMOTE,
                    request.request_id,
                    request.tenant,
                    contract.cls,
                    window=window,
                    reason="burst_excess",
                    floor=pending.pinned,
                )
            )
        pending.window_index = window
        return self._ask(pending, now)

    def _may_demote(self, policy: ExcessPolicy) -> bool:
        """Whether an assured request past its floor goes on as surplus: always under
        `demote`, never under `reject`, and under `spare` while it would start at once (a
        slot free, nothing queued)."""
        if policy is ExcessPolicy.SPARE:
            return self._slots.num_free > 0 and self._queue.num_queued == 0 and self._surplus_room()
        return policy is ExcessPolicy.DEMOTE

    def _proposed(self, pending: Pending, now: float, answer: Answer) -> Pending:
        window = pending.window_index
        proposal = self._consulted(pending, now, answer)
        if proposal is None:
            return self._refuse(pending, RejectReason.LEARNER_FAULT, window, now)
        if not proposal.admit:
            return self._refuse(pending, RejectReason.LEARNER_REJECT, window, now)
        if self._surplus_queue_full(pending.known_contract):
            return self._refuse(pending, RejectReason.QUEUE_FULL, window, now)
        # design §2: a relabel reduces to a priority inside the surplus; the floor key is untouched.
        rank = 0 if proposal.proposed_class is ASSURED else 1
        hint = float(proposal.priority_hint)
        if self._refuse_busy:
            retry_at = self.cannot_start_in_time(pending, rank, hint, now)
            if retry_at is not None:
                return self._reject(pending, RejectReason.BUSY, now, window, retry_at)
        ticket = self._admit(
            pending, now, entitled=False, window_index=window, rank=rank, hint=hint
        )
        self._enqueue(ticket)
        return pending

    def _refuse(
        self, pending: Pending, reason: RejectReason, window: int | None, now: float
    ) -> Pending:
        """A refusal, with the instant a retry can succeed where the guard knows it."""
        retry_at = None
        if reason in WINDOW_BOUND:
            schedule = self.config.schedule
            retry_at = schedule.start_of(schedule.index_at(now) + 1)
        return self._reject(pending, reason, now, window, retry_at)

    def _excess_reason(
        self, contract: Contract, request: Request, floor: int, grant: Grant
    ) -> RejectReason:
        """`floor_lowered` while the refused weight still fits the window's `B` (the
        contract's, or as the shared store pinned it) counting this window's earlier
        lowered refusals (refused whatever the excess policy: docs/design.md §4.4);
        `floor_exhausted` beyond `B`, where the excess policy applies."""
        if floor >= contract.floor:
            return RejectReason.FLOOR_EXHAUSTED
        window, lowered = self._lowered.get(contract.tenant, (grant.window_index, 0))
        if window != grant.window_index:
            lowered = 0
        weight = self._meter.weight(request)
        governing = contract.floor if grant.floor is None else grant.floor
        used = min(floor, governing) - grant.remaining
        if used + lowered + weight > governing:
            return RejectReason.FLOOR_EXHAUSTED
        self._lowered[contract.tenant] = (grant.window_index, lowered + weight)
        return RejectReason.FLOOR_LOWERED

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

    def cannot_start_in_time(
        self, pending: Pending, rank: int, hint: float, now: float
    ) -> float | None:
        """docs/design.md §17: None if this surplus arrival (queued with `rank`, `hint`) may start
        before it is doomed, else the earliest instant a slot can free (its retry hint).

        It rests on what the doom gate rests on — each request holds its slot at least its
        own `L` — and on no request running or ahead of it leaving early (cancelled by its
        client, failed). It can start at some `S ≤ δ` (`δ = D − L(ℓ)`: when it is doomed)
        only if the tickets ahead of it still waiting at `S` (`A(S)`: those not doomed by
        `S`, each popped first) and it all start by `S`. Their starts on one slot are each
        at least the shortest `L` among them (`λ`) apart, the first no sooner than the slot
        can free (`r`: now, or a running request's dispatch + its `L`): at most
        `O(x) = Σ 1 + ⌊(x − r) / λ⌋` over the slots free by `x`. `O − A` never decreases,
        so `O(δ) ≤ A(δ)` proves it cannot start in time. A request doomed already is left
        to the gate, which says what `max_tokens` would have fit."""
        lower = self.config.lower_envelope
        assert lower is not None  # `_refuse_busy` needs the gate
        request = pending.request
        doomed_after = pending.deadline_at - lower.at(
            request.num_output_tokens, request.prompt_tokens_lower
        )
        queued = self._queue.num_queued
        free = self._total_slots - len(self._in_flight)
        if doomed_after < now or free > queued:
            return None
        waiting, step = 0, float("inf")
        for ticket in self._queue.ahead(request.tenant, rank, hint):
            held = ticket.lower_s or 0.0
            doomed_at = ticket.deadline_at - held
            if doomed_at >= now:  # waiting now: may start before this one, at λ apart
                step = min(step, held)
                waiting += doomed_at >= doomed_after
        releases = [now] * max(0, free)
        for ticket in self._in_flight.values():  # a leasing one may be denied: free now
            held = 0.0 if ticket.leasing else (ticket.lower_s or 0.0)
            releases.append(max(now, ticket.dispatched_at + held))
        starts = 0
        for released in releases:
            if released <= doomed_after:  # the slack stands for float rounding: more starts
                more = (doomed_after - released) / step + 1e-9 if step > 0 else queued
                starts += 1 + min(int(more), queued)
                if starts > waiting:
                    return None
        return min(releases)

    def _surplus_queue_full(self, contract: Contract) -> bool:
        by_class = self._surplus_limit[contract.cls]
        if by_class is not None and self._surplus_by_class.get(contract.cls, 0) >= by_class:
            return True
        per_tenant = self.config.queue_limits.per_tenant
        return (
            per_tenant is not None and self._surplus_by_tenant.get(contract.tenant, 0) >= per_tenant
        )

    # -- the queue ------------------------------------------------------------------------

    def _enqueue(self, ticket: Ticket, *, front: bool = False) -> None:
        """Queue a ticket (`front`: back in its old place, after a failed start) and keep the
        counts and the doom timer's heap in step. A ticket may stand in the heap twice after
        a requeue; `expire` skips whatever is not queued."""
        if front:
            self._queue.push_front(ticket)
        else:
            self._queue.push(ticket)
        self._queue_entry(ticket)
        if self._doom_heap is not None and ticket.lower_s is not None:
            heappush(self._doom_heap, _doom_entry(ticket))

    def _cancel(self, ticket: Ticket) -> None:
        self._queue.cancel(ticket)
        self._queue_exit(ticket)

    def _is_queued(self, ticket: Ticket) -> bool:
        return self._queued.get(ticket.request.request_id) is ticket

    def next_doom_at(self) -> float | None:
        """When the earliest queued request becomes doomed (call `expire` then); None if no
        queued request can become doomed (no lower envelope, or nothing queued)."""
        heap = self._doom_timer()
        while heap and not self._is_queued(heap[0][2]):
            heappop(heap)
        return heap[0][0] if heap else None

    def _doom_timer(self) -> list[tuple[float, int, Ticket]]:
        if self._doom_heap is None:
            queued = self._queued.values()
            self._doom_heap = [_doom_entry(t) for t in queued if t.lower_s is not None]
            heapify(self._doom_heap)
        return self._doom_heap

    def expire(self, now: float) -> list[Drop]:
        """Drop every queued request that is doomed at `now` (`now + L > D`, docs/design.md §4.3),
        without waiting for a slot to free (docs/design.md §12)."""
        out: list[Drop] = []
        heap = self._doom_timer()
        while heap:
            ticket = heap[0][2]
            if not self._is_queued(ticket):
                heappop(heap)
                continue
            if not _doomed(ticket, now):
                break
            heappop(heap)
            self._cancel(ticket)
            out.append(self._drop(ticket, now, "doomed"))
        return out

    def requeue(
        self, request_id: RequestId, now: float, reason: str = "backend_unreachable"
    ) -> None:
        """Its backend could not be reached before any byte was sent (or, `no_lease`, the
        fleet had no slot lease for it): free the slot and let the request wait again in its
        old place (ahead of everything admitted after it), to be placed again."""
        ticket = self._release(request_id)
        if self._sink is not None:
            self._emit(EventKind.REQUEUE, ticket, now, backend=ticket.backend, reason=reason)
        ticket.backend = -1
        ticket.dispatched_at = float("nan")
        self._enqueue(ticket, front=True)

    # -- dispatch -------------------------------------------------------------------------

    def poll(self, now: float) -> list[Dispatch | Drop]:
        """Fill free slots from the queue, dropping (only) the provably doomed."""
        out: list[Dispatch | Drop] = []
        slots, queue, verdict_of = self._slots, self._queue, self._doom.verdict
        if slots.held_until:
            slots.lift(now)
        while slots.num_free > 0:
            ticket = queue.pop()
            if ticket is None:
                break
            self._queue_exit(ticket)
            verdict = verdict_of(ticket.deadline_at, ticket.lower_s, ticket.upper_s, now)
            first = ticket.first_lower_s
            if verdict is DROP or (first is not None and now + first > ticket.first_by):
                out.append(self._drop(ticket, now, "doomed"))
                continue
            if self._reserved and not ticket.entitled and not self._may_take_slot(ticket, now):
                self._enqueue(ticket, front=True)  # the floor's slots: it waits, none overtakes
                break
            backend = slots.acquire(ticket.kv)
            if backend < 0:  # no room for it in any KV cache: it waits first, none overtakes
                self._enqueue(ticket, front=True)
                break
            if verdict is DoomVerdict.UNCERTAIN:
                self.stats.doom_uncertain += 1
            out.append(self._start(ticket, backend, now))
        return out

    # -- the floor's reserved slots (docs/design.md §19) ---------------------------------

    def _surplus_room(self) -> bool:
        """The surplus holds fewer than `C − r` slots: one more may start, whatever the floor."""
        return self.num_surplus_in_flight < self._total_slots - self._reserved

    def _count_grant(self, window: int, weight: int) -> None:
        """The floor granted `weight` in `window`: that much less of its demand is left."""
        if window != self._floor_window:
            self._floor_window, self._floor_granted = window, 0
        self._floor_granted += weight

    def _may_take_slot(self, ticket: Ticket, now: float) -> bool:
        """Whether a surplus ticket may start now under `reserved_slots = r`: while the
        surplus holds fewer than `C − r` slots; past that, on a reserved slot only if the
        floor cannot need it in this window (the surplus stays under `C − held`, `held =
        min(r, the floor's requests present + its weight not yet granted)`, which only falls
        until the window ends) and the ticket's ceiling gives it back by the window's end,
        when the floor's credits return."""
        if self._surplus_room():
            return True
        surplus, total, reserved = self.num_surplus_in_flight, self._total_slots, self._reserved
        if ticket.upper_s is None:
            return False
        schedule = self.config.schedule
        window = schedule.index_at(now)
        granted = self._floor_granted if window == self._floor_window else 0
        present = len(self._in_flight) - surplus + self._queue.num_queued_entitled
        held = min(reserved, present + max(self._total_floor - granted, 0))
        return surplus < total - held and now + ticket.upper_s <= schedule.start_of(window + 1)

    # -- views ----------------------------------------------------------------------------

    @property
    def num_queued_entitled(self) -> int:
        return self._queue.num_queued_entitled

    @property
    def num_waiting_entitled(self) -> int:
        """Entitled requests waiting for a slot: queued, or dispatched and waiting for
        their slot lease (what a replica shows on the fleet's waiting board)."""
        return self._queue.num_queued_entitled + self.num_leasing_entitled


def _doomed(ticket: Ticket, now: float) -> bool:
    """`now + L > D`, or its first token doomed: `now + L(0, p) > T` (docs/design.md §19)."""
    lower, first = ticket.lower_s, ticket.first_lower_s
    return (lower is not None and now + lower > ticket.deadline_at) or (
        first is not None and now + first > ticket.first_by
    )


def _doom_entry(ticket: Ticket) -> tuple[float, int, Ticket]:
    """The doom timer's key: the instant after which the ticket is doomed (`D − L`, or
    `T − L(0, p)` where its first token is doomed sooner)."""
    at = ticket.deadline_at - ticket.lower_s  # type: ignore[operator]
    if ticket.first_lower_s is not None:
        at = min(at, ticket.first_by - ticket.first_lower_s)
    return (at, ticket.seq, ticket)
