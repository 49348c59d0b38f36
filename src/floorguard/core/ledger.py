"""The ledger every stack keeps the same way: who is queued, who is in flight on which
slot, the per-class counts, the decision log, the monitors and the §6 report.

`Ledger` is the base of the `Guard` and of every comparison stack (`ServerStack`): a stack
adds only its decision rule (admission) and its queue (the core's `Dispatcher`). Every
trace event of the request lifecycle is written here, once, so every stack's decision log
has the same schema and the checker and the metrics read them alike.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from mypy_extensions import mypyc_attr

from floorguard.core.contract import Contract, ContractClass, GuardConfig, reload_refusals
from floorguard.core.dispatcher import SlotPool, Ticket
from floorguard.core.doom import DoomGate
from floorguard.core.events import (
    EventKind,
    arrive_event,
    config_to_dict,
    new_event,
    propose_event,
)
from floorguard.core.learner import Consultation, Learner, LoadSnapshot, Proposal, consult
from floorguard.core.monitors import (
    AssumptionReport,
    BacklogMonitor,
    CapacityMonitor,
    EnvelopeMonitor,
    assumptions_of,
)
from floorguard.core.request import Request, RequestId
from floorguard.core.stats import ClassStats, GuardStats
from floorguard.core.surface import (
    LEASE_HOLD_OFF_MAX_S,
    LEASE_HOLD_OFF_S,
    LOCAL_LEASE,
    NO_LEASE,
    Admission,
    Answer,
    Dispatch,
    Drop,
    LearnerAsk,
    Need,
    Pending,
    Sink,
    StoreCall,
)
from floorguard.errors import ConfigError, ProtocolError
from floorguard.store.base import CreditStore

__all__ = ["ClassStats", "GuardStats", "Ledger"]

ASSURED: Final = ContractClass.ASSURED
_OUTCOMES: Final = frozenset({"complete", "fail", "abort"})
"""What `finish` ends a request with."""
_NO_WINDOW: Final = -(2**62)
"""`_floor_window` before the floor granted anything."""


@mypyc_attr(allow_interpreted_subclasses=True)  # the comparison stacks extend it
class Ledger:
    """The shared bookkeeping; subclasses decide (`begin_arrival`, `continue_arrival`,
    `poll`) and call the `_`-methods here for every state change."""

    def __init__(
        self,
        config: GuardConfig,
        *,
        learner: Learner | None = None,
        store: CreditStore | None = None,
        sink: Sink | None = None,
        started_at: float = 0.0,
        backlog_counts_class: bool = False,
    ) -> None:
        self.config = config
        self.stats = GuardStats()
        self.envelope = EnvelopeMonitor(config.lower_envelope, config.upper_envelope)
        self.backlog = BacklogMonitor(config.total_floor)
        """`Q_A`: floor-entitled requests queued; with `backlog_counts_class` (a stack with no
        entitlement), every assured request admitted and not yet started."""
        self.capacity = CapacityMonitor(config.schedule, config.total_floor)
        """`μ̂` from busy windows (design §4.4); the guard's `lower-floor` action reads it."""
        self._backlog_counts_class = backlog_counts_class
        self._contracts = {c.tenant: c for c in config.contracts}
        self._learner = learner
        self._store = store
        self._slots = SlotPool(config.slots, config.kv_tokens)
        self._doom = DoomGate(config.lower_envelope, config.upper_envelope)
        """`L` and `s_max` of each admitted request (its ticket keeps them); the guard's
        doom gate."""
        self._queued: dict[RequestId, Ticket] = {}
        self._in_flight: dict[RequestId, Ticket] = {}
        self._surplus_by_class: dict[ContractClass, int] = {}
        """Queued tickets not entitled, by class and by tenant (the queue limits)."""
        self._surplus_by_tenant: dict[str, int] = {}
        self._seq = 0
        self._max_assured_tokens = 0
        self._max_assured_prompt = 0
        self._total_slots = config.total_slots
        self._slot_leases = config.slot_leases
        self.num_leasing_entitled = 0
        """Entitled requests dispatched whose slot lease is not answered yet: out of the
        queue, not started, so still waiting (the fleet's waiting board counts them)."""
        self._kv_budgeted = config.kv_budgeted
        self.num_surplus_in_flight = 0
        """In flight and not floor-entitled: what the reserved slots bound (docs/design.md §19)."""
        self._total_floor = config.total_floor
        self._floor_window = _NO_WINDOW
        self._floor_granted = 0
        """The floor's weight granted by this guard in window `_floor_window` (the
        reservation's view of the floor's demand left in the window)."""
        self._reloaded: tuple[float, GuardConfig] | None = None
        """A reload's configuration and the instant its contracts govern from."""
        self._sink = sink
        if sink is not None:
            sink(new_event(started_at, EventKind.CONFIG, data=config_to_dict(config)))

    # -- reload -----------------------------------------------------------------------------

    def reconfigure(self, config: GuardConfig, now: float, reason: str = "reload") -> int:
        """A reload (docs/design.md §14): `config`'s slots and queue limits govern at once, its
        contracts (floors, deadlines, classes, tenants) from the start of the next window —
        a window already open keeps the floors it opened with, so no reload over-grants
        one, and what is queued or in flight keeps its contract. Returns that window; the
        `config` event it logs carries it (`window`). A reload made before an earlier one
        took effect replaces it. `ConfigError` where `config` cannot replace the running
        one (`reload_refusals`), and nothing changes. `reason`: what changed it (a `reload`,
        or the live fleet's `membership` resizing this replica's share of slots)."""
        refusals = reload_refusals(self.config, config)
        if refusals:
            raise ConfigError("reload", "the new configuration", "; ".join(refusals))
        self.roll(now)
        schedule = self.config.schedule
        from_window = schedule.index_at(now) + 1
        self._slots.resize(config.slots, config.kv_tokens)
        self._total_slots = config.total_slots
        self.config = replace(
            self.config,
            slots=config.slots,
            kv_tokens=config.kv_tokens,
            backend_ids=config.backend_ids,
            backend_capacity=config.backend_capacity,
            queue_limits=config.queue_limits,
        )
        self._reloaded = (schedule.start_of(from_window), config)
        if self._sink is not None:
            self._sink(
                new_event(
                    now,
                    EventKind.CONFIG,
                    window=from_window,
                    reason=reason,
                    data=config_to_dict(config),
                )
            )
        return from_window

    def roll(self, now: float) -> None:
        """Let a reloaded configuration's contracts govern once their window has begun."""
        pending = self._reloaded
        if pending is None or now < pending[0]:
            return
        self._reloaded = None
        config = self.config = pending[1]
        self._contracts = {c.tenant: c for c in config.contracts}
        self._total_floor = config.total_floor
        self.backlog.total_floor = config.total_floor
        self.capacity.total_floor = config.total_floor

    @property
    def latest_config(self) -> GuardConfig:
        """The configuration the next window opens with: a reload's not yet in force, else
        the running one."""
        return self._reloaded[1] if self._reloaded is not None else self.config

    @property
    def governs_from(self) -> float | None:
        """When a reloaded configuration's contracts begin to govern (None: none waits)."""
        return self._reloaded[0] if self._reloaded is not None else None

    # -- arrival, answered by the stack's own store and learner -----------------------------

    def begin_arrival(
        self, request: Request, now: float, scheduled_at: float | None = None
    ) -> Pending:
        raise NotImplementedError

    def continue_arrival(self, pending: Pending, now: float, answer: Answer) -> Pending:
        raise NotImplementedError

    def poll(self, now: float) -> list[Dispatch | Drop]:
        """Fill free slots: the stack's dispatch rule."""
        raise NotImplementedError

    def on_arrival(
        self, request: Request, now: float, scheduled_at: float | None = None
    ) -> Admission:
        """Arrival with every need answered here, synchronously (the simulator's path)."""
        pending = self.begin_arrival(request, now, scheduled_at)
        need = pending.need
        while need is not None:
            pending = self.continue_arrival(pending, now, self.answer(need, now))
            need = pending.need
        return pending.admission  # type: ignore[return-value]  # decided: need is None

    def answer(self, need: Need, now: float) -> Answer:
        """Answer a need with this stack's own store or learner (never raises: a learner's
        failure is a fault in the `Consultation`). Each need is answered for the instant it
        was made at (`StoreCall.at`, `LearnerAsk.now`), not `now`."""
        if type(need) is StoreCall:
            assert self._store is not None, "a stack without a store asked for a store call"
            return self._store.acquire(
                need.key,
                need.weight,
                need.capacity,
                self.config.schedule,
                need.at,
                floor=need.floor,
            )
        assert type(need) is LearnerAsk and self._learner is not None
        return consult(self._learner, need.request, need.cls, need.load, need.now)

    def abandon_arrival(self, pending: Pending, now: float, reason: str) -> Admission:
        """End an arrival the driver cannot finish (the client left, or the driver failed,
        while a need was outstanding): its terminal outcome is `abort`. A store call already
        sent may still take its credit; the floor only ever loses by it (AF counts what was
        admitted)."""
        if pending.admission is not None:
            return pending.admission
        request, contract = pending.request, pending.contract
        cls = contract.cls if contract is not None else None
        if cls is not None:
            self.stats.per_class[cls].aborted += 1
        if self._sink is not None:
            self._sink(
                new_event(
                    now, EventKind.ABORT, request.request_id, request.tenant, cls, reason=reason
                )
            )
        pending.need = None
        pending.admission = Admission(
            request.request_id,
            False,
            cls,
            False,
            pending.demoted,
            pending.window_index,
            None,
            reason,
        )
        return pending.admission

    # -- state changes: each writes its trace event ----------------------------------------

    def _arrive(self, request: Request, now: float, scheduled_at: float | None) -> Pending:
        """The `arrive` event and the counts; the tenant's contract fixes class and deadline
        (the pending arrival's `contract` stays None for an unknown tenant)."""
        if self._reloaded is not None:
            self.roll(now)
        contract = self._contracts.get(request.tenant)
        if self._sink is not None:
            self._sink(arrive_event(now, request, contract, scheduled_at))
        if contract is None:
            self.stats.unknown_tenant += 1
            return Pending(request, None, 0.0)
        deadline_at = request.arrival_at + contract.deadline_for(request.num_output_tokens)
        pending = Pending(request, contract, deadline_at)
        self.stats.per_class[contract.cls].offered += 1
        if contract.cls is ASSURED and request.num_output_tokens > self._max_assured_tokens:
            self._max_assured_tokens = request.num_output_tokens
        if contract.cls is ASSURED and request.num_prompt_tokens > self._max_assured_prompt:
            self._max_assured_prompt = request.num_prompt_tokens
        return pending

    def _ask(self, pending: Pending, now: float) -> Pending:
        """Wait on the learner for this arrival."""
        pending.need = LearnerAsk(pending.request, pending.known_contract.cls, self.load(), now)
        return pending

    def _consulted(self, pending: Pending, now: float, answer: Answer) -> Proposal | None:
        """The learner's answer counted and logged: the proposal, or None for a fault."""
        assert type(answer) is Consultation, f"a learner ask answered with {answer!r}"
        self.stats.learner_calls += 1
        if answer.fault is not None:
            self.stats.learner_faults += 1
        if self._sink is not None:
            self._sink(propose_event(now, pending.request, pending.known_contract.cls, answer))
        return answer.proposal

    def _reject(
        self,
        pending: Pending,
        reason: str,
        now: float,
        window_index: int | None = None,
        retry_at: float | None = None,
    ) -> Pending:
        request, contract = pending.request, pending.contract
        cls = contract.cls if contract is not None else None
        if cls is not None:
            self.stats.per_class[cls].rejected += 1
        by_reason = self.stats.rejected_by_reason
        by_reason[reason] = by_reason.get(reason, 0) + 1
        if self._sink is not None:
            self._sink(
                new_event(
                    now,
                    EventKind.REJECT,
                    request.request_id,
                    request.tenant,
                    cls,
                    window=window_index,
                    reason=str(reason),
                    floor=pending.pinned,
                )
            )
        pending.need = None
        pending.admission = Admission(
            request.request_id, False, cls, False, False, window_index, None, reason, retry_at
        )
        return pending

    def _admit(
        self,
        pending: Pending,
        now: float,
        *,
        entitled: bool,
        window_index: int | None = None,
        rank: int = 1,
        hint: float = 0.0,
    ) -> Ticket:
        """Admit the arrival: its ticket (not yet queued: the stack queues it)."""
        request, contract = pending.request, pending.known_contract
        self._seq += 1
        lower_s, upper_s = self._doom.bounds(  # once per request: the ticket keeps them
            request.num_output_tokens, request.prompt_tokens_lower, request.num_prompt_tokens
        )
        ticket = Ticket(
            request,
            contract,
            pending.deadline_at,
            entitled,
            window_index,
            self._seq,
            rank,
            hint,
            lower_s,
            upper_s,
        )
        if self._kv_budgeted:
            ticket.kv = self.config.kv_reservation(
                request.num_prompt_tokens, request.num_output_tokens
            )
        if contract.ttft_budget_s is not None:
            ticket.first_by = request.arrival_at + contract.ttft_budget_s
            ticket.first_lower_s = self._doom.first_token_lower(request.prompt_tokens_lower)
        stats = self.stats.per_class[contract.cls]
        stats.admitted += 1
        if entitled:
            stats.entitled += 1
        if self._sink is not None:
            self._sink(
                new_event(
                    now,
                    EventKind.ADMIT,
                    request.request_id,
                    request.tenant,
                    contract.cls,
                    window=window_index,
                    entitled=entitled,
                    deadline_at=pending.deadline_at,
                    floor=pending.pinned,
                )
            )
            self._sink(  # the hot path builds its events inline (docs/benchmarks.md)
                new_event(now, EventKind.ENQUEUE, request.request_id, request.tenant, contract.cls)
            )
        pending.need = None
        pending.admission = Admission(
            request.request_id,
            True,
            contract.cls,
            entitled,
            pending.demoted,
            window_index,
            pending.deadline_at,
        )
        return ticket

    def _queue_entry(self, ticket: Ticket) -> None:
        """The ticket is waiting (in the stack's queue)."""
        request = ticket.request
        self._queued[request.request_id] = ticket
        if ticket.entitled:
            self.backlog.on_enqueue()
            return
        # plain dicts, not Counters: a Counter's item assignment is a Python-level call
        cls, tenant = ticket.contract.cls, request.tenant
        by_class, by_tenant = self._surplus_by_class, self._surplus_by_tenant
        by_class[cls] = by_class.get(cls, 0) + 1
        by_tenant[tenant] = by_tenant.get(tenant, 0) + 1
        if self._backlog_counts_class and cls is ASSURED:
            self.backlog.on_enqueue()

    def _queue_exit(self, ticket: Ticket) -> None:
        """The ticket left the stack's queue (started, dropped or aborted)."""
        request = ticket.request
        del self._queued[request.request_id]
        if ticket.entitled:
            self.backlog.on_dequeue()
            return
        cls = ticket.contract.cls
        self._surplus_by_class[cls] -= 1
        self._surplus_by_tenant[request.tenant] -= 1
        if self._backlog_counts_class and cls is ASSURED:
            self.backlog.on_dequeue()

    def _start(self, ticket: Ticket, backend: int, now: float) -> Dispatch:
        """Start a ticket that left the queue on `backend`, whose slot the caller took."""
        request = ticket.request
        ticket.backend = backend
        ticket.dispatched_at = now
        ticket.leasing = leasing = self._slot_leases
        if leasing and ticket.entitled:
            self.num_leasing_entitled += 1
        if not ticket.entitled:
            self.num_surplus_in_flight += 1
        self._in_flight[request.request_id] = ticket
        if self._sink is not None:
            self._sink(
                new_event(
                    now,
                    EventKind.DISPATCH,
                    request.request_id,
                    request.tenant,
                    ticket.contract.cls,
                    backend=backend,
                    entitled=ticket.entitled,
                )
            )
        return Dispatch(request, backend, now, ticket.entitled, ticket.deadline_at, leasing)

    def _release(self, request_id: RequestId) -> Ticket:
        """Take an in-flight ticket off its slot."""
        ticket = self._in_flight.pop(request_id, None)
        if ticket is None:
            state = (
                "queued" if request_id in self._queued else "not held (ended, or never admitted)"
            )
            raise ProtocolError(f"request {request_id!r} is not in flight: it is {state}")
        if ticket.leasing and ticket.entitled:
            self.num_leasing_entitled -= 1
        if not ticket.entitled:
            self.num_surplus_in_flight -= 1
        self._slots.release(ticket.backend, ticket.kv)
        return ticket

    def _drop(self, ticket: Ticket, now: float, reason: str) -> Drop:
        """Drop a ticket that left the queue."""
        self.stats.per_class[ticket.contract.cls].dropped += 1
        request = ticket.request
        if self._sink is not None:
            self._emit(
                EventKind.DROP,
                ticket,
                now,
                reason=reason,
                deadline_at=ticket.deadline_at,
                num_output_tokens=request.num_output_tokens,
            )
        return Drop(request, now, reason)

    def _emit(self, kind: EventKind, ticket: Ticket, now: float, **fields: Any) -> None:
        assert self._sink is not None
        request = ticket.request
        self._sink(
            new_event(now, kind, request.request_id, request.tenant, ticket.contract.cls, **fields)
        )

    # -- in flight --------------------------------------------------------------------------

    def on_first_token(self, request_id: RequestId, now: float) -> None:
        ticket = self._in_flight.get(request_id)
        if ticket is not None and self._sink is not None:
            self._sink(
                new_event(
                    now,
                    EventKind.FIRST_TOKEN,
                    request_id,
                    ticket.request.tenant,
                    ticket.contract.cls,
                )
            )

    def finish(self, request_id: RequestId, now: float, outcome: str, reason: str = "") -> bool:
        """End a request exactly once, whatever the path (the one terminal call, as vLLM's
        scheduler has): `complete` or `fail` one in flight, `abort` one queued or in
        flight. True if this call ended it; False if it had already ended (or was never
        admitted), and nothing changes — so every exit of a driver may call it.
        `ProtocolError` for an outcome its state cannot take (a queued request cannot
        complete or fail) or an unknown one, before any change."""
        ticket = self._in_flight.get(request_id)
        if ticket is not None:
            if outcome == "complete":
                if ticket.leasing:
                    raise ProtocolError(
                        f"complete of request {request_id!r}: its start waits for its slot "
                        "lease (answer lease_granted or lease_denied first)"
                    )
                self._complete(request_id, ticket, now)
            elif outcome == "fail":
                self._fail(request_id, now, reason)
            elif outcome == "abort":
                self._abort(request_id, now, reason)
            else:
                raise ProtocolError(f"finish({request_id!r}): unknown outcome {outcome!r}")
            return True
        if outcome not in _OUTCOMES:
            raise ProtocolError(f"finish({request_id!r}): unknown outcome {outcome!r}")
        if request_id in self._queued:
            if outcome != "abort":
                raise ProtocolError(
                    f"{outcome} of request {request_id!r}: it is queued, not in flight"
                )
            self._abort(request_id, now, reason)
            return True
        return False

    def _complete(self, request_id: RequestId, ticket: Ticket, now: float) -> None:
        """The backend finished an in-flight request: free its slot, and let the monitors
        see its service time."""
        del self._in_flight[request_id]
        if not ticket.entitled:
            self.num_surplus_in_flight -= 1
        self._slots.release(ticket.backend, ticket.kv)
        service_s = now - ticket.dispatched_at
        stats = self.stats.per_class[ticket.contract.cls]
        stats.completed += 1
        stats.late += now > ticket.deadline_at
        self.envelope.observe_bounds(service_s, ticket.lower_s, ticket.upper_s)
        self.capacity.on_complete(now, len(self._queued))
        if self._sink is not None:
            self._sink(
                new_event(
                    now,
                    EventKind.COMPLETE,
                    request_id,
                    ticket.request.tenant,
                    ticket.contract.cls,
                    backend=ticket.backend,
                )
            )

    def _fail(self, request_id: RequestId, now: float, reason: str) -> None:
        """The backend failed an in-flight request (error, timeout): free its slot."""
        ticket = self._release(request_id)
        self.stats.per_class[ticket.contract.cls].failed += 1
        if self._sink is not None:
            self._emit(EventKind.FAIL, ticket, now, reason=reason, backend=ticket.backend)

    def _abort(self, request_id: RequestId, now: float, reason: str) -> None:
        """The client went away: dequeue it, or free its slot (it is held: `finish` asked)."""
        ticket = self._queued.get(request_id)
        if ticket is not None:
            self._cancel(ticket)
            backend = None
        else:
            ticket = self._release(request_id)
            backend = ticket.backend
        self.stats.per_class[ticket.contract.cls].aborted += 1
        if self._sink is not None:
            self._emit(EventKind.ABORT, ticket, now, reason=reason, backend=backend)

    def _cancel(self, ticket: Ticket) -> None:
        """Take a queued ticket out of the stack's queue, and out of its counts (its
        `_queue_exit`)."""
        raise NotImplementedError

    # -- what a stack without a doom gate or health does ------------------------------------

    def expire(self, now: float) -> list[Drop]:
        return []

    def next_doom_at(self) -> float | None:
        return None

    def requeue(
        self, request_id: RequestId, now: float, reason: str = "backend_unreachable"
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot place a request again")

    def next_wake_at(self) -> float | None:
        """When the driver must call again without being asked: the next doom instant
        (call `expire`), or the end of a hold-off (call `poll`); None: neither waits."""
        doom = self.next_doom_at()
        held = self._slots.next_lift_at()
        if doom is None or held is None:
            return held if doom is None else doom
        return min(doom, held)

    def lease_denied(
        self,
        request_id: RequestId,
        now: float,
        *,
        until: float | None = None,
        full: tuple[int, ...] = (),
    ) -> None:
        """The fleet had no slot lease for the request's start (leased slots, design §13): it
        waits again at the front of its queue (`no_lease`) and its backend is held off —
        `LEASE_HOLD_OFF_S`, doubled for each denial there in a row up to
        `LEASE_HOLD_OFF_MAX_S`, lifted when one of this guard's requests there ends — so
        the fleet's replicas do not spin on a full backend (`next_wake_at` says when to
        poll again). `until`: the fleet hands this guard a slot there when one frees (the
        denial put it on the backend's waiting board): held off until then at most, or
        until the hand-over comes (`lease_handed`). `full`: the pool's other backends the
        fleet found full too (as of their last call): held off one period longer, so
        the next start does not ask each in turn — when the hold ends, one start asks the
        denied backend again, and its answer names the others still full. (Held off as
        long as the denied one, every backend came back at once and each replica asked
        them all: at 8 replicas × 64 backends, 2,000 denials a second, 3 per request.)"""
        backend = self._leasing(request_id, "lease_denied").backend
        self.requeue(request_id, now, NO_LEASE)
        if until is not None:
            self._slots.hold_until(backend, until)
            self._slots.hold_full(full, until + max(until - now, 0.0))
        else:
            self._slots.hold_off(backend, now, LEASE_HOLD_OFF_S, LEASE_HOLD_OFF_MAX_S)

    def lease_handed(self, backend: int, now: float) -> None:
        """The fleet handed this guard a slot lease on `backend` (a slot freed there while
        it waited): the backend is offered again at once, its next start takes that lease
        (`poll` dispatches there)."""
        self._slots.handed(backend)

    def set_backend_available(self, backend: int, available: bool) -> None:
        """Whether `backend` may get new requests (the driver's health probe says). A down
        backend's slots are not offered; what runs there still ends normally."""
        self._slots.set_available(backend, available)

    # -- what the driver tells the log about the fleet's shared parts ------------------------

    def lease_granted(self, request_id: RequestId, now: float, *, local: bool = False) -> None:
        """The fleet granted the in-flight request's slot lease: it starts (a `lease`
        event; with leased slots, the fleet's SLOTS count starts here, not at dispatch).
        `local`: granted by the fallback while the store was unreachable (the event says
        so; `verify` judges fleet ORDER there conditionally)."""
        ticket = self._leasing(request_id, "lease_granted")
        ticket.leasing = False
        if ticket.entitled:
            self.num_leasing_entitled -= 1
        self._slots.leased(ticket.backend)
        if self._sink is not None:
            self._emit(
                EventKind.LEASE,
                ticket,
                now,
                backend=ticket.backend,
                entitled=ticket.entitled,
                reason=LOCAL_LEASE if local else None,
            )

    def _leasing(self, request_id: RequestId, call: str) -> Ticket:
        """The in-flight ticket whose start waits for its lease, or a `ProtocolError`."""
        ticket = self._in_flight.get(request_id)
        if ticket is None:
            raise ProtocolError(f"{call} for {request_id!r}, which is not in flight")
        if not ticket.leasing:
            why = "was answered already" if self._slot_leases else "needs none (slots not leased)"
            raise ProtocolError(f"{call} for {request_id!r}, whose start {why}")
        return ticket

    def store_changed(
        self, now: float, state: str, tenant: str | None = None, window: int | None = None
    ) -> None:
        """The shared floor's state changed (`shared`, a fallback policy's name, or
        `lost-state` for one tenant's window): a `store` event (`verify` judges AF in the
        degraded periods as conditional on the store)."""
        if self._sink is not None:
            self._sink(new_event(now, EventKind.STORE, tenant=tenant, window=window, reason=state))

    # -- views ------------------------------------------------------------------------------

    def holds(self, request_id: RequestId) -> bool:
        """Whether the request is still queued or in flight (not yet ended)."""
        return request_id in self._queued or request_id in self._in_flight

    def awaits_lease(self, request_id: RequestId) -> bool:
        """Whether the request is in flight and its start waits for its slot lease's
        answer (`lease_granted` or `lease_denied`)."""
        ticket = self._in_flight.get(request_id)
        return ticket is not None and ticket.leasing

    def in_flight_request(self, request_id: RequestId) -> Request | None:
        """The request if it is in flight (dispatched, not yet ended), else None."""
        ticket = self._in_flight.get(request_id)
        return ticket.request if ticket is not None else None

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def num_queued(self) -> int:
        return len(self._queued)

    @property
    def max_assured_tokens(self) -> int:
        """The largest ℓ of any assured arrival so far (0 before the first)."""
        return self._max_assured_tokens

    @property
    def max_assured_prompt_tokens(self) -> int:
        """The largest prompt (its upper count) of any assured arrival so far."""
        return self._max_assured_prompt

    def in_flight_on(self, backend: int) -> int:
        return self._slots.in_flight(backend)

    def load(self) -> LoadSnapshot:
        """What a learner is told about current load."""
        queued, first = len(self._queued), self.backlog.backlog
        return LoadSnapshot(len(self._in_flight), first, queued - first, self._total_slots)

    def credits_left(self, tenant: str, now: float) -> int | None:
        self.roll(now)
        contract = self._contracts.get(tenant)
        if contract is None or not contract.assured or self._store is None:
            return None
        return self._store.remaining(tenant, contract.floor, self.config.schedule, now)

    def contract_of(self, tenant: str) -> Contract | None:
        return self._contracts.get(tenant)

    def assumptions(self) -> AssumptionReport:
        """docs/design.md §6 for the largest assured ℓ seen so far, with what was observed."""
        return assumptions_of(self.config, [self])
