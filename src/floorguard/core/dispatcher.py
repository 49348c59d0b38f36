"""Non-preemptive slot dispatch (docs/design.md §4.2): the guard owns the queue, backends own slots.

A `Ticket` is the guard's record of one admitted request. The dispatchers only order
tickets; the `SlotPool` only counts slots. Neither reads a clock.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from heapq import heappop, heappush, heapreplace

from floorguard.core.contract import AffineEnvelope, Contract, DispatchOrder, SurplusOrder
from floorguard.core.request import Request

__all__ = [
    "AssuredFirstDispatcher",
    "Dispatcher",
    "FairSurplusDispatcher",
    "FifoDispatcher",
    "SlotPool",
    "Ticket",
    "create_dispatcher",
    "slot_charge",
]

TOKEN_CHARGE = AffineEnvelope(0.0, 1.0, 1.0)
"""`fair-tokens`: one unit per metered token, prompt or output."""

DECODE_CHARGE = AffineEnvelope(0.0, 1.0, 0.0)
"""`fair` without a service model (an envelope with no per-token cost): the output cap,
what holds a slot."""

_LEAST_CHARGE = 1e-9


def slot_charge(envelope: AffineEnvelope | None) -> AffineEnvelope:
    """`fair`'s charge: the slot time a request holds, `s_max(ℓ, p)` (the service ceiling:
    its base, decode tokens at the per-token cost, prefill per prompt token); without a
    per-token cost in it, the output cap (`DECODE_CHARGE`)."""
    if envelope is None or envelope.per_token_s <= 0:
        return DECODE_CHARGE
    return envelope


class Ticket:
    """The guard's record of one admitted request. A plain class with its own `__init__`
    (not a dataclass): the compiled core builds one per request, and a dataclass's
    generated `__init__` would run as interpreted Python."""

    __slots__ = (
        "backend",
        "cancelled",
        "contract",
        "deadline_at",
        "dispatched_at",
        "entitled",
        "first_by",
        "first_lower_s",
        "hint",
        "kv",
        "leasing",
        "lower_s",
        "relabel_rank",
        "request",
        "seq",
        "upper_s",
        "window_index",
    )

    def __init__(  # noqa: PLR0917  # positional, as the ledger builds it per request
        self,
        request: Request,
        contract: Contract,
        deadline_at: float,
        entitled: bool,
        window_index: int | None,
        seq: int,
        relabel_rank: int = 1,
        hint: float = 0.0,
        lower_s: float | None = None,
        upper_s: float | None = None,
    ) -> None:
        self.request = request
        self.contract = contract
        self.deadline_at = deadline_at
        self.entitled = entitled
        """Admitted from the floor: dispatched in the assured queue, SF applies."""
        self.window_index = window_index
        self.seq = seq
        """Admission order: the arrival-order tie-break."""
        self.relabel_rank = relabel_rank
        """0 when the learner relabelled a surplus request upward; orders the surplus only."""
        self.hint = hint
        """The learner's priority hint (lower first); orders the surplus only."""
        self.lower_s = lower_s
        """`L(ℓ, p)` for this request (None: no lower envelope): the doom gate's bound."""
        self.upper_s = upper_s
        """`s_max(ℓ, p)` for this request (None: no ceiling)."""
        self.cancelled = False
        self.backend = -1
        self.dispatched_at = math.nan
        self.leasing = False
        """Started on leased slots, its slot lease not yet answered (`Dispatch.lease`)."""
        self.kv = 0
        """Its KV reservation in tokens under a memory budget (`GuardConfig.kv_reservation`)."""
        self.first_by = math.inf
        """When its first token is due (arrival + the contract's TTFT; ∞: no TTFT)."""
        self.first_lower_s: float | None = None
        """`L(0, p)`, the doom gate's bound on its time to a first token (None: no TTFT
        doom: no TTFT, or no per-token lower envelope)."""

    def __repr__(self) -> str:
        return f"Ticket({self.request.request_id!r}, entitled={self.entitled}, seq={self.seq})"


class Dispatcher(ABC):
    """Orders queued tickets. `pop` returns the next one to start, or None. Each keeps
    `num_queued` / `num_queued_entitled` in step as it pushes and pops (inline: the
    dispatch loop's hot path)."""

    def __init__(self) -> None:
        self.num_queued = 0
        self.num_queued_entitled = 0

    @abstractmethod
    def push(self, ticket: Ticket) -> None: ...

    @abstractmethod
    def push_front(self, ticket: Ticket) -> None:
        """Put back a ticket that was popped (its start failed): ahead of every ticket of
        its queue that was admitted after it, as if it had never left."""

    @abstractmethod
    def pop(self) -> Ticket | None: ...

    @abstractmethod
    def ahead(self, tenant: str, rank: int, hint: float) -> Iterator[Ticket]:
        """The queued tickets that start before a surplus ticket of `tenant` with (`rank`,
        `hint`) admitted now, whatever arrives later: while one waits, it is popped first."""

    def cancel(self, ticket: Ticket) -> None:
        """Remove a queued ticket (client gone); removal is lazy, the counts are not."""
        ticket.cancelled = True
        self.num_queued -= 1
        if ticket.entitled:
            self.num_queued_entitled -= 1


class AssuredFirstDispatcher(Dispatcher):
    """Oldest floor-entitled ticket first; the surplus only when none waits, ordered by
    (learner relabel, learner hint, arrival). The hint never reaches the assured queue."""

    def __init__(self) -> None:
        super().__init__()
        self._assured: deque[Ticket] = deque()
        """Floor-entitled tickets only; the surplus heap holds the rest."""
        self._surplus: list[tuple[int, float, int, Ticket]] = []

    def push(self, ticket: Ticket) -> None:
        self.num_queued += 1
        if ticket.entitled:
            self.num_queued_entitled += 1
            self._assured.append(ticket)
        else:
            heappush(self._surplus, (ticket.relabel_rank, ticket.hint, ticket.seq, ticket))

    def push_front(self, ticket: Ticket) -> None:
        if ticket.entitled:
            self.num_queued += 1
            self.num_queued_entitled += 1
            self._assured.appendleft(ticket)
        else:
            self.push(ticket)  # the surplus heap orders by admission already

    def _pop_entitled(self) -> Ticket | None:
        """The oldest floor-entitled ticket still waiting, or None."""
        assured = self._assured
        while assured:
            ticket = assured.popleft()
            if not ticket.cancelled:
                self.num_queued -= 1
                self.num_queued_entitled -= 1
                return ticket
        return None

    def pop(self) -> Ticket | None:
        if self._assured and (entitled := self._pop_entitled()) is not None:
            return entitled
        surplus = self._surplus
        while surplus:
            ticket = heappop(surplus)[3]
            if not ticket.cancelled:
                self.num_queued -= 1
                return ticket
        return None

    def ahead(self, tenant: str, rank: int, hint: float) -> Iterator[Ticket]:
        yield from (t for t in self._assured if not t.cancelled)
        yield from _before(self._surplus, rank, hint)


class _Share:
    """One tenant's part of the fair surplus: its tickets (the learner's order) and its
    virtual time."""

    __slots__ = ("queue", "vtime")

    def __init__(self) -> None:
        self.queue: list[tuple[int, float, int, Ticket]] = []
        self.vtime = 0.0


class FairSurplusDispatcher(AssuredFirstDispatcher):
    """Assured-first, and below the floor fair across tenants (docs/design.md §15): a virtual-time
    fair queue. Each tenant with surplus waiting has a virtual time; the one with the least
    goes next (the oldest head on a tie), and is charged its ticket's `charge.at(ℓ, p)`:
    by default the slot time the request holds (`slot_charge`: the service envelope, decode
    tokens at the per-token cost plus prefill), so a tenant of long prompts and short
    outputs is not charged a prompt token like an output token. A tenant that comes back
    from idle starts at the virtual time of the last start, so idleness banks nothing.
    Within a tenant the learner's order holds (relabel, hint, arrival), so one tenant's
    surplus runs exactly as under `AssuredFirstDispatcher`. The floor-entitled queue is
    untouched."""

    def __init__(self, charge: AffineEnvelope = DECODE_CHARGE) -> None:
        super().__init__()
        self._charge = charge
        self._shares: dict[str, _Share] = {}
        self._turns: list[tuple[float, int, _Share]] = []
        """(virtual time, head's arrival, share) for each tenant with surplus waiting; the
        arrival (unique per ticket) settles every comparison before the share."""
        self._now = 0.0
        """The virtual time of the last surplus start."""

    def _share(self, tenant: str) -> _Share:
        share = self._shares.get(tenant)
        if share is None:
            share = self._shares[tenant] = _Share()
        return share

    def push(self, ticket: Ticket) -> None:
        self.num_queued += 1
        if ticket.entitled:
            self.num_queued_entitled += 1
            self._assured.append(ticket)
            return
        share = self._share(ticket.request.tenant)
        queue = share.queue
        if queue:
            heappush(queue, (ticket.relabel_rank, ticket.hint, ticket.seq, ticket))
            return
        queue.append((ticket.relabel_rank, ticket.hint, ticket.seq, ticket))
        share.vtime = max(share.vtime, self._now)  # back from idle: no credit for idleness
        heappush(self._turns, (share.vtime, ticket.seq, share))

    def push_front(self, ticket: Ticket) -> None:
        if ticket.entitled:
            super().push_front(ticket)
            return
        # its start failed: the tenant gets back what it was charged, and its turn
        share = self._share(ticket.request.tenant)
        share.vtime -= self._cost(ticket.request)
        self.num_queued += 1
        entry = (ticket.relabel_rank, ticket.hint, ticket.seq, ticket)
        if share.queue:
            heappush(share.queue, entry)
            return
        share.queue.append(entry)
        heappush(self._turns, (share.vtime, ticket.seq, share))

    def pop(self) -> Ticket | None:
        if self._assured and (entitled := self._pop_entitled()) is not None:
            return entitled
        turns = self._turns
        while turns:
            start, _, share = turns[0]
            queue = share.queue
            while queue:
                ticket = heappop(queue)[3]
                if ticket.cancelled:
                    continue
                self._now = start
                share.vtime = vtime = start + self._cost(ticket.request)
                if queue:  # its next turn, in one sift
                    heapreplace(turns, (vtime, queue[0][2], share))
                else:
                    heappop(turns)
                self.num_queued -= 1
                return ticket
            heappop(turns)  # only cancelled tickets were left
        return None

    def _cost(self, request: Request) -> float:
        """What the fair queue charges a request's tenant (never nothing: every start
        moves its tenant's virtual time on)."""
        return max(
            self._charge.at(request.num_output_tokens, request.num_prompt_tokens), _LEAST_CHARGE
        )

    def ahead(self, tenant: str, rank: int, hint: float) -> Iterator[Ticket]:
        """The floor's queue and the tenant's own earlier surplus: another tenant's turn
        may come after this one's (its virtual time), so none of its tickets is certain."""
        yield from (t for t in self._assured if not t.cancelled)
        share = self._shares.get(tenant)
        if share is not None:
            yield from _before(share.queue, rank, hint)


def _before(
    queue: list[tuple[int, float, int, Ticket]], rank: int, hint: float
) -> Iterator[Ticket]:
    """The live tickets of a surplus heap that a newcomer with (`rank`, `hint`) follows."""
    for entry_rank, entry_hint, _, ticket in queue:
        if (entry_rank, entry_hint) <= (rank, hint) and not ticket.cancelled:
            yield ticket


class FifoDispatcher(Dispatcher):
    """One queue in admission order, whatever the class: the fault-injection baseline."""

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[Ticket] = deque()

    def push(self, ticket: Ticket) -> None:
        self.num_queued += 1
        self.num_queued_entitled += ticket.entitled
        self._queue.append(ticket)

    def push_front(self, ticket: Ticket) -> None:
        self.num_queued += 1
        self.num_queued_entitled += ticket.entitled
        self._queue.appendleft(ticket)

    def pop(self) -> Ticket | None:
        queue = self._queue
        while queue:
            ticket = queue.popleft()
            if not ticket.cancelled:
                self.num_queued -= 1
                self.num_queued_entitled -= ticket.entitled
                return ticket
        return None

    def ahead(self, tenant: str, rank: int, hint: float) -> Iterator[Ticket]:
        return (t for t in self._queue if not t.cancelled)


def create_dispatcher(
    order: DispatchOrder,
    surplus: SurplusOrder = SurplusOrder.FAIR,
    envelope: AffineEnvelope | None = None,
) -> Dispatcher:
    """The guard's queue (`GuardConfig.dispatch`, `.surplus`; the screen runs the same);
    `envelope`: the service ceiling `fair` charges by (`slot_charge`)."""
    if order is DispatchOrder.FIFO:
        return FifoDispatcher()
    if surplus is SurplusOrder.FAIR:
        return FairSurplusDispatcher(slot_charge(envelope))
    if surplus is SurplusOrder.FAIR_TOKENS:
        return FairSurplusDispatcher(TOKEN_CHARGE)
    return AssuredFirstDispatcher()


_UNBUDGETED = 2**62
"""The KV room of a backend whose cache is not budgeted."""


class SlotPool:
    """`C` slots per backend, and under a memory budget (design §16) each backend's KV tokens.
    `acquire` picks the backend with the most free slots (lowest index on a tie) that has
    room for the request's reservation, so load spreads and no backend ever exceeds its `C`
    or its KV cache.

    Without a memory budget the choice does not grow with the `M` backends: the available
    backends are kept in buckets by free count, each bucket a bit set of backends, so the
    choice is the highest non-empty bucket's lowest set bit, and a count's change moves
    one bit. (Under a budget the room must be checked per backend: a scan.) A heap of
    (−free, backend) did this before at O(log M) and 1.4× one backend's decision at 256
    backends, compiled (docs/benchmarks.md)."""

    def __init__(self, slots: tuple[int, ...], kv_tokens: tuple[int | None, ...] = ()) -> None:
        self.capacity = slots
        self._free = list(slots)
        self._kv_capacity = [_UNBUDGETED if kv is None else kv for kv in kv_tokens]
        self._kv_free: list[int] | None = (
            list(self._kv_capacity) if any(kv is not None for kv in kv_tokens) else None
        )
        """KV tokens not reserved, per backend; None without a budget."""
        self._available = [True] * len(slots)
        self.num_free = sum(slots)
        """Free slots on available backends: what `acquire` may hand out."""
        self._down: set[int] = set()
        """Backends the driver's health probe marked unavailable."""
        self.held_until: dict[int, float] = {}
        """Backends held off after a denied slot lease → until when (`hold_off`)."""
        self._lift_at = math.inf
        """No hold-off ends before this (a lower bound, exact after each `lift` that
        scans): `lift` and `next_lift_at` need not scan every held backend each time."""
        self._denials: dict[int, int] = {}
        """Backends → slot leases denied there in a row (the hold-off doubles with each)."""
        self._handed_starts: dict[int, tuple[int, float]] = {}
        """Held-off backends offered again for hand-overs → (starts left, the hold-off's
        end to return to)."""
        self._polled: set[int] = set()
        """Held-off backends that wait for no hand-over (`hold_off`: the store
        unreachable, this guard reusing its own slots): one of this guard's requests
        ending there lifts the hold. A backend held for a hand-over (`hold_until`) stays
        held: the release hands the freed slot to the fleet's waiters, this guard among
        them if it waits; lifted, every end there started a lease call the hand-over had
        already made futile (at 8 replicas × 64 backends, 1.5 denials a request)."""
        self._buckets: list[int] = []
        """Bit `b` of `_buckets[k]` is set where backend `b` is available with `k` ≥ 1 free
        slots (with several backends and no budget; see the class)."""
        self._bucket_of: list[int] = []
        """Each backend's bucket (0: none)."""
        self._top = 0
        """The highest bucket with a backend in it (0: none)."""
        self._rebuild()

    def _rebuild(self) -> None:
        self._buckets = [0] * (max(self.capacity, default=0) + 1)
        self._bucket_of = [0] * len(self._free)
        self._top = 0
        for backend in range(len(self._free)):
            self._place(backend)

    def _place(self, backend: int) -> None:
        """`backend`'s free count or availability changed: its bucket."""
        if self._kv_free is not None or len(self._free) == 1:
            return  # a budget's choice is a scan; one backend's, itself
        n = self._free[backend]
        bucket = n if n > 0 and self._available[backend] else 0
        was = self._bucket_of[backend]
        if bucket == was:
            return
        buckets, bit = self._buckets, 1 << backend
        if was:
            buckets[was] ^= bit
        self._bucket_of[backend] = bucket
        top = self._top
        if bucket:
            buckets[bucket] |= bit
            top = max(top, bucket)
        while top and not buckets[top]:
            top -= 1
        self._top = top

    def acquire(self, kv: int = 0) -> int:
        """A slot, with room for `kv` reserved tokens under a memory budget: its backend,
        or -1 when no available backend with a free slot has that room (the caller's
        request waits for one; nothing smaller overtakes it)."""
        if self.num_free <= 0:
            raise RuntimeError("acquire() with no free slot: the caller must check num_free")
        free, up, room = self._free, self._available, self._kv_free
        if room is not None:
            backend = -1
            for b, n in enumerate(free):
                if up[b] and n > 0 and room[b] >= kv and (backend < 0 or n > free[backend]):
                    backend = b
            if backend < 0:
                return -1
            room[backend] -= kv
        elif len(free) == 1:
            backend = 0
        else:  # the most free slots, the lowest index on a tie
            most = self._buckets[self._top]
            backend = (most & -most).bit_length() - 1
        free[backend] -= 1
        self.num_free -= 1
        if room is None and len(free) > 1:
            self._place(backend)
        if self._handed_starts:
            self._started_handed(backend)
        return backend

    def resize(self, slots: tuple[int, ...], kv_tokens: tuple[int | None, ...] = ()) -> None:
        """New capacities (a reload): backends keep their positions and what runs there; new
        ones are appended, available. A backend whose capacity (slots or KV) falls below
        what it runs (0: removed) gets nothing new until enough of it ends."""
        if len(slots) < len(self.capacity):
            raise ValueError("resize() may append backends, never remove one")
        if self._kv_free is not None:
            held = [c - f for c, f in zip(self._kv_capacity, self._kv_free, strict=True)]
            held += [0] * (len(slots) - len(held))
            self._kv_capacity = [_UNBUDGETED if kv is None else kv for kv in kv_tokens]
            self._kv_free = [c - h for c, h in zip(self._kv_capacity, held, strict=True)]
        in_flight = [self.in_flight(b) for b in range(len(self.capacity))]
        in_flight += [0] * (len(slots) - len(in_flight))
        self._available += [True] * (len(slots) - len(self._available))
        self.capacity = slots
        self._free = [c - n for c, n in zip(slots, in_flight, strict=True)]
        self.num_free = sum(
            max(0, f) for f, up in zip(self._free, self._available, strict=True) if up
        )
        self._rebuild()

    def set_available(self, backend: int, available: bool) -> None:
        """The health probe's word: a backend that is not available keeps its running
        requests but gets no new one (nor while it is held off)."""
        if available:
            self._down.discard(backend)
        else:
            self._down.add(backend)
        self._offer(backend, available and backend not in self.held_until)

    def hold_off(self, backend: int, now: float, first_s: float, max_s: float) -> None:
        """The fleet had no slot lease on `backend`: offer it nothing for `first_s`,
        doubled for each denial there in a row, at most `max_s` (`lift` from then)."""
        self._handed_starts.pop(backend, None)
        streak = self._denials.get(backend, 0)
        self._denials[backend] = min(streak + 1, 16)  # the hold-off is capped long before
        until = now + min(first_s * 2**streak, max_s)
        self.held_until[backend] = max(until, self.held_until.get(backend, until))
        self._polled.add(backend)
        self._lift_at = min(self._lift_at, until)
        self._offer(backend, False)

    def hold_until(self, backend: int, until: float) -> None:
        """Offer `backend` nothing until `until` (or a hand-over: `handed`)."""
        self._handed_starts.pop(backend, None)
        self._polled.discard(backend)
        self.held_until[backend] = max(until, self.held_until.get(backend, until))
        self._lift_at = min(self._lift_at, until)
        self._offer(backend, False)

    def hold_full(self, backends: tuple[int, ...], until: float) -> None:
        """The fleet found `backends` full (a denial elsewhere named them): offer them
        nothing until `until`, except one offered for a hand-over already."""
        held, handed, count = self.held_until, self._handed_starts, len(self._free)
        for backend in backends:
            if held.get(backend, -1.0) >= until or backend in handed or not 0 <= backend < count:
                continue
            held[backend] = until
            self._polled.discard(backend)
            self._lift_at = min(self._lift_at, until)
            self._offer(backend, False)

    def handed(self, backend: int) -> None:
        """The fleet handed a slot lease on `backend`: offer it again now, for as many
        starts as slots were handed there while it is held off (then it is held off again
        until its hold-off ends: the other starts would find it full)."""
        self._denials.pop(backend, None)
        handed = self._handed_starts.get(backend)
        if handed is not None:  # offered for hand-overs already: one start more
            self._handed_starts[backend] = (handed[0] + 1, handed[1])
            return
        until = self.held_until.get(backend)
        if until is None:
            return
        self._lift_one(backend)
        self._handed_starts[backend] = (1, until)

    def _started_handed(self, backend: int) -> None:
        handed = self._handed_starts.get(backend)
        if handed is None:
            return
        starts, until = handed
        if starts > 1:
            self._handed_starts[backend] = (starts - 1, until)
            return
        del self._handed_starts[backend]
        self.held_until[backend] = until
        self._lift_at = min(self._lift_at, until)
        self._offer(backend, False)

    def leased(self, backend: int) -> None:
        """A lease was granted on `backend`: its next hold-off starts short again."""
        self._denials.pop(backend, None)

    def _lift_one(self, backend: int) -> None:
        self._handed_starts.pop(backend, None)
        self._polled.discard(backend)
        if self.held_until.pop(backend, None) is not None:
            self._offer(backend, backend not in self._down)

    def lift(self, now: float) -> None:
        """Offer again every held-off backend whose hold-off has ended (unless down)."""
        if now < self._lift_at:
            return
        for backend, until in list(self.held_until.items()):
            if until <= now:
                del self.held_until[backend]
                self._polled.discard(backend)
                self._offer(backend, backend not in self._down)
        self._lift_at = min(self.held_until.values(), default=math.inf)

    def next_lift_at(self) -> float | None:
        """When the next hold-off ends (or earlier: a `poll` then finds what to lift);
        None: no backend is held off."""
        return self._lift_at if self.held_until else None

    def _offer(self, backend: int, available: bool) -> None:
        if self._available[backend] == available:
            return
        self._available[backend] = available
        free = max(0, self._free[backend])
        self.num_free += free if available else -free
        self._place(backend)

    def acquire_on(self, backend: int) -> None:
        """Take a slot on one given backend (a stack whose backends keep their own queue)."""
        if self._free[backend] <= 0:
            raise RuntimeError(f"acquire_on({backend}) with no free slot there")
        self._free[backend] -= 1
        if self._available[backend]:
            self.num_free -= 1
        self._place(backend)

    def release(self, backend: int, kv: int = 0) -> None:
        """A slot on `backend` is free again (its request ended, or waits again), with the
        `kv` tokens it reserved. A hold-off there ends with it: the guard's own lease
        there is coming back (a lease denial holds the backend off again right after its
        requeue)."""
        if self._free[backend] >= self.capacity[backend]:
            raise RuntimeError(f"release() of backend {backend} with no slot in use")
        self._free[backend] += 1
        if self._kv_free is not None:
            self._kv_free[backend] += kv
        if self._available[backend] and self._free[backend] > 0:
            self.num_free += 1
            self._place(backend)
        if backend in self._polled:
            self._lift_one(backend)

    def in_flight(self, backend: int) -> int:
        return self.capacity[backend] - self._free[backend]
