"""The driver surface every stack shares — the guard and each comparison stack (docs/design.md §7).

A driver (the simulator, the HTTP proxy, a real-backend run) speaks only this surface:

    begin_arrival(request, now)          -> Pending   (pending.need: what it waits on)
    continue_arrival(pending, now, ans)  -> Pending   (until pending.admission is set)
    on_arrival(request, now)             -> Admission (the two above, needs answered by
                                                       the stack's own store and learner)
    poll(now)                            -> [Dispatch | Drop, ...]
    expire(now) / next_doom_at()         (queued requests doomed by now, and when next)
    next_wake_at()                       (when to call again unasked: a doom instant, or
                                          a held-off backend's return)
    requeue(id, now, reason)             (its backend was unreachable: wait again)
    lease_granted / lease_denied(id, now) (leased slots: the fleet's answer for a start;
                                          denied, it waits again and the backend is held off)
    store_changed(now, state, …)         (the shared floor's state, for the log)
    on_first_token(id, now)
    finish(id, now, outcome, reason)     (the one terminal call: complete / fail / abort;
                                          True if it ended the request, False if it had
                                          ended; a ProtocolError for what its state forbids)

Arrival is sans-IO: a stack never calls a remote store or a remote learner itself. It says
what it needs — a `StoreCall` (charge the floor) or a `LearnerAsk` (a proposal for the
surplus) — and the driver answers it, synchronously (the simulator) or awaited (the proxy),
so both run the same decision code. Decision records are slotted dataclasses with their own
`__init__`: values with `==` and a repr, built per request by the compiled core with a
compiled constructor (a NamedTuple's or a generated dataclass `__init__` runs as
interpreted Python, several times the cost). Treat them as read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from floorguard.core.contract import Contract, ContractClass, GuardConfig
from floorguard.core.events import TraceEvent
from floorguard.core.learner import Consultation, LoadSnapshot
from floorguard.core.request import Request, RequestId
from floorguard.errors import ProtocolError
from floorguard.store.base import Grant

if TYPE_CHECKING:
    from floorguard.core.monitors import AssumptionReport, BacklogMonitor, EnvelopeMonitor
    from floorguard.core.stats import GuardStats

__all__ = [
    "LEASE_HOLD_OFF_MAX_S",
    "LEASE_HOLD_OFF_S",
    "LOCAL_LEASE",
    "NO_LEASE",
    "PAST_DOOM_S",
    "SLOTS_LOST",
    "SLOTS_RECOVERING",
    "SLOTS_SHARED",
    "SLOTS_UNREACHABLE",
    "Admission",
    "Answer",
    "Dispatch",
    "Drop",
    "LearnerAsk",
    "Need",
    "Pending",
    "RejectReason",
    "Sink",
    "Stack",
    "StoreCall",
    "require_consultation",
    "require_undecided",
]

Sink = Callable[[TraceEvent], None]
"""Where a stack writes its decision log, one `TraceEvent` per decision."""


class RejectReason(StrEnum):
    """Why the core refused an arrival; each reason's row in `core/refusals.py`'s table says
    what a client is answered and how `verify` judges it."""

    UNKNOWN_TENANT = "unknown_tenant"
    FLOOR_EXHAUSTED = "floor_exhausted"
    FLOOR_LOWERED = "floor_lowered"
    """Beyond the effective floor lowered by the capacity action, within the contract's B."""
    COST_EXCESS = "cost_excess"
    LEARNER_REJECT = "learner_reject"
    LEARNER_FAULT = "learner_fault"
    QUEUE_FULL = "queue_full"
    """A surplus request over a queue limit (`QueueLimits`); never a floor-entitled one."""
    KV_EXCESS = "kv_excess"
    """Its metered prompt + output can never fit any backend's KV cache (docs/design.md §16)."""
    BUSY = "busy"
    """A surplus request that cannot start before it is doomed (`QueueLimits.refuse_busy`,
    docs/design.md §17): refused on arrival instead of dropped at the end of its wait."""


PAST_DOOM_S = 1e-4
"""How long after a doom instant `next_wake_at` names a driver calls `expire`: just past it,
so `now + L > D` holds (at the instant itself the request is not doomed yet)."""

NO_LEASE = "no_lease"
"""A `requeue` event's reason when the fleet had no slot lease for the request: its
`dispatch` never reached the backend."""
LEASE_HOLD_OFF_S = 0.005
"""How long a backend gets no new start after the fleet had no slot lease there; it
doubles with each denial there in a row, up to `LEASE_HOLD_OFF_MAX_S`; a lease granted
there resets it, and one of the guard's own requests ending there lifts it (docs/replicas.md
measures the choice on the fleet simulator)."""
LEASE_HOLD_OFF_MAX_S = 0.02
LOCAL_LEASE = "local"
"""A `lease` event's reason when the lease was granted locally (the store unreachable)."""

SLOTS_UNREACHABLE = "slots-unreachable"
"""A `store` event's reason: the slot leases' store stopped answering this replica (it
keeps to the slots it held; its waiting requests are not on the pool's board)."""
SLOTS_LOST = "slots-lost-state"
"""A `store` event's reason: the leases' store answers with its state lost (its waiting
board went with it: this replica's waiting requests were not on it until this call)."""
SLOTS_RECOVERING = "slots-recovering"
"""A `store` event's reason: the leases' store answers again; this replica put its leases
back and keeps to the slots it held for two renewals."""
SLOTS_SHARED = "slots-shared"
"""A `store` event's reason: the slot leases are the fleet's count again."""


@dataclass(slots=True)
class StoreCall:
    """One credit-store call: take `weight` of `capacity` credits from `key`'s window."""

    key: str
    weight: int
    capacity: int
    at: float
    """The arrival's instant: the window it is judged in is charged (`capacity` is that
    window's), however late the call is answered — a call sent as a window ends must not
    open the next one with this window's floor."""
    floor: int | None = None
    """The contract's `B` (`capacity` is less while the floor is lowered): a store the
    replicas share pins the floor of a window at its first take, so the fleet judges the
    window against one floor even while a reload reaches the replicas one by one."""

    def __init__(
        self, key: str, weight: int, capacity: int, at: float, floor: int | None = None
    ) -> None:
        self.key = key
        self.weight = weight
        self.capacity = capacity
        self.at = at
        self.floor = floor


@dataclass(slots=True)
class LearnerAsk:
    """Ask the untrusted learner about one surplus request (answer: a `Consultation`)."""

    request: Request
    cls: ContractClass
    """Its true, authenticated class."""
    load: LoadSnapshot
    now: float

    def __init__(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> None:
        self.request = request
        self.cls = cls
        self.load = load
        self.now = now


Need = StoreCall | LearnerAsk
Answer = Grant | Consultation


@dataclass(slots=True)
class Admission:
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
    retry_at: float | None = None
    """For a refusal: the earliest instant a retry can be admitted where the stack knows it
    (the next window, for a floor refusal); None where it cannot say."""

    def __init__(  # noqa: PLR0917
        self,
        request_id: RequestId,
        admitted: bool,
        cls: ContractClass | None,
        entitled: bool,
        demoted: bool,
        window_index: int | None,
        deadline_at: float | None,
        reason: str | None = None,
        retry_at: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.admitted = admitted
        self.cls = cls
        self.entitled = entitled
        self.demoted = demoted
        self.window_index = window_index
        self.deadline_at = deadline_at
        self.reason = reason
        self.retry_at = retry_at


class Pending:
    """One arrival between `begin_arrival` and its decision: `need` is what the stack waits
    on (None once decided), `admission` the decision (None until then)."""

    __slots__ = (
        "admission",
        "contract",
        "deadline_at",
        "demoted",
        "floor",
        "need",
        "pinned",
        "remaining",
        "request",
        "window_index",
    )

    def __init__(self, request: Request, contract: Contract | None, deadline_at: float) -> None:
        self.request = request
        self.need: Need | None = None
        self.admission: Admission | None = None
        self.contract = contract
        """None: an unknown tenant (refused before anything else)."""
        self.deadline_at = deadline_at
        self.floor = 0
        """The effective floor the store call was made against (assured arrivals)."""
        self.pinned: int | None = None
        """The window's floor as a shared store pinned it, where it is not the contract's
        own (another replica's configuration took the window first); logged with the
        decision."""
        self.remaining: int | None = None
        """Credits left in the window after the store call (None: no call was made); what
        the HTTP guard's `x-ratelimit-remaining-*` header says."""
        self.demoted = False
        self.window_index: int | None = None
        """The window a demoted arrival was charged in (it is admitted or refused there)."""

    @property
    def known_contract(self) -> Contract:
        """The tenant's contract, once an unknown tenant has been refused."""
        if self.contract is None:
            raise ProtocolError(f"request {self.request.request_id!r}: its tenant is unknown")
        return self.contract


def require_consultation(pending: Pending, answer: object) -> Consultation:
    """A learner ask's answer must be the `Consultation` that `consult` returns."""
    if type(answer) is not Consultation:
        raise ProtocolError(
            f"request {pending.request.request_id!r}: a learner ask answered with "
            f"{answer!r}, not a Consultation"
        )
    return answer


def require_undecided(pending: Pending, answer: object) -> None:
    """`continue_arrival`'s precondition: the arrival still waits on a need. Answering a
    decided arrival again would admit it twice (two tickets for one request)."""
    if pending.need is None:
        raise ProtocolError(
            f"continue_arrival on request {pending.request.request_id!r}, already decided "
            f"({pending.admission!r}); answered with {answer!r}"
        )


@dataclass(slots=True)
class Dispatch:
    request: Request
    backend: int
    at: float
    entitled: bool
    deadline_at: float
    lease: bool = False
    """The start needs the fleet's slot lease on `backend` first (leased slots, docs/design.md §13):
    the driver takes one and answers `lease_granted` (it runs) or `lease_denied` (it waits
    again); until then it may fail or abort, not complete."""

    def __init__(  # noqa: PLR0917
        self,
        request: Request,
        backend: int,
        at: float,
        entitled: bool,
        deadline_at: float,
        lease: bool = False,
    ) -> None:
        self.request = request
        self.backend = backend
        self.at = at
        self.entitled = entitled
        self.deadline_at = deadline_at
        self.lease = lease


@dataclass(slots=True)
class Drop:
    request: Request
    at: float
    reason: str

    def __init__(self, request: Request, at: float, reason: str) -> None:
        self.request = request
        self.at = at
        self.reason = reason


class Stack(Protocol):
    """The driver surface of the guard and of every comparison stack."""

    config: GuardConfig
    stats: GuardStats
    envelope: EnvelopeMonitor
    backlog: BacklogMonitor

    def begin_arrival(
        self, request: Request, now: float, scheduled_at: float | None = None
    ) -> Pending: ...
    def continue_arrival(self, pending: Pending, now: float, answer: Answer) -> Pending: ...
    def answer(self, need: Need, now: float) -> Answer: ...
    def on_arrival(
        self, request: Request, now: float, scheduled_at: float | None = None
    ) -> Admission: ...
    def poll(self, now: float) -> list[Dispatch | Drop]: ...
    def expire(self, now: float) -> list[Drop]: ...
    def next_doom_at(self) -> float | None: ...
    def next_wake_at(self) -> float | None: ...
    def requeue(
        self, request_id: RequestId, now: float, reason: str = "backend_unreachable"
    ) -> None: ...
    def set_backend_available(self, backend: int, available: bool) -> None: ...
    def lease_granted(self, request_id: RequestId, now: float, *, local: bool = False) -> None: ...
    def lease_denied(
        self,
        request_id: RequestId,
        now: float,
        *,
        until: float | None = None,
        full: tuple[int, ...] = (),
    ) -> None: ...
    def lease_handed(self, backend: int, now: float) -> None: ...
    def store_changed(
        self, now: float, state: str, tenant: str | None = None, window: int | None = None
    ) -> None: ...
    def on_first_token(self, request_id: RequestId, now: float) -> None: ...
    def finish(self, request_id: RequestId, now: float, outcome: str, reason: str = "") -> bool: ...
    def holds(self, request_id: RequestId) -> bool: ...
    def in_flight_request(self, request_id: RequestId) -> Request | None: ...
    def load(self) -> LoadSnapshot: ...
    def assumptions(self) -> AssumptionReport: ...
    @property
    def num_in_flight(self) -> int: ...
    @property
    def num_queued(self) -> int: ...
    @property
    def max_assured_tokens(self) -> int: ...

    @property
    def max_assured_prompt_tokens(self) -> int: ...
    def in_flight_on(self, backend: int) -> int: ...
