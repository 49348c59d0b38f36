"""Fleet-wide slot leases (docs/design.md §13): at most `C` requests in flight per backend across
every replica, and no opportunistic start while another replica has a floor-entitled
request waiting for a slot in the pool.

A replica dispatches a request only with a lease on its backend (`lease.lua`, one EVALSHA
per decision, or a slot handed to it): granted iff fewer than `C` leases are live and, for
a request that is not floor-entitled, no other replica's entry on the pool's waiting board
is positive (one board per pool: a request waits for a slot on any of its backends). Every
call publishes this replica's count of entitled requests waiting (and a denied entitled
request counts itself), so the board is current after each decision, and a renewal every
`ttl_s / 4` — on each backend where it holds a lease or a handed slot, at least one — keeps
the leases and the board entry alive, and puts back a running request's lease that Redis
lost. A replica that dies stops renewing: its leases expire within `ttl_s` of its last
call (≤ `1.25 · ttl_s` after it died), and its board entry with them.

Freed slots are handed over, not polled for. A denied start counts itself on the board
(entitled, or other), and each slot a release frees goes, in that same call, to a replica
waiting in the pool (entitled first, round-robin): leased in its name and published on its
channel (`handed_channel`). That replica's next start there takes the handed lease with
one call that renews it — an opportunistic one's also reads the board (and hands the slot
on if another replica's entitled request waits) — and a slot it cannot use is
handed on (`plan_pass_on`; at the latest at its second renewal). A renewal lists the slots
handed to the caller on any backend of the pool, so a lost message costs at most
`ttl_s / 4`. A denied start's backend is held off until a hand-over or that renewal
(`hand_over_by`), and so are the pool's other backends a `full` denial names full
(`full_backends`): a waiting request asks once, not each backend in turn.

A call that timed out may have run. Each acquire names its lease afresh (the request and
the call's number), so a lease whose grant never came back is one no later call reuses:
the replica releases it, with every release whose call failed, on the next call Redis
answers (within `ttl_s / 4`, the renewal), instead of leaving the slot idle until its ttl.
A first acquire that times out while Redis answers is sent again, naming the same lease:
the script grants a lease it already holds again (its first answer), never a second.

When Redis cannot be reached, a replica keeps the slots it held: on each backend it grants
a local lease only while it holds fewer there than it held when it lost Redis (it reuses
its own slots as its requests end; it takes none of another replica's). The fleet stays
within `C`: the holdings summed to at most `C` when Redis was lost, and none grows. (A
partition, `⌊C/N⌋` each, would not: a replica that held more than its share when Redis
was lost still runs those requests while the others take their shares — the fleet
simulator found this, `docs/replicas.md`.) A release that timed out may run later and
hand its slot over: its slot is not reused. When Redis answers again the replica puts every
lease it holds back (`restore`: those granted locally, and those that expired with no
renewal reaching Redis) and *recovers*: the count still misses the leases of replicas that
have not called yet, so for two more renewals it keeps to the slots it held (`keep`: put
in Redis whatever the count, judged by the order), and a slot it releases is the fleet's.
A Redis that lost the leases' state is found by the pool's generation (an acquire naming
another is refused `lost`) and recovered from the same way.

The policy is I/O-free, as `SharedFloor`'s is: each operation is a `Plan` that yields
`LeaseCall`s (one run of the script each) and returns its answer. The HTTP guard runs the
plans through `redis_lease_script(store)` (the async shells here); the fleet simulator
drives them itself over a simulated Redis's `lease` (`store/simulated.py`, on the virtual
clock, its answer a round trip later), so both run the same policy.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, cast

from floorguard.clock import Clock
from floorguard.store.base import StoreUnavailable
from floorguard.store.plan import Plan, run_plan_async
from floorguard.store.redis_store import RedisCreditStore
from floorguard.store.script import lua_script

__all__ = [
    "Held",
    "LeaseCall",
    "LeaseReply",
    "SlotLeases",
    "lease_keys",
    "parse_lease_reply",
    "pool_tag",
    "redis_lease_script",
]

SCRIPT = lua_script("lease.lua")
log = logging.getLogger("floorguard.leases")

ORDER_RETRY_S = 0.05
"""How long a start denied `order` waits before asking again (a hand-over may come first).
The fleet simulator (`simulate --replicas 3`, a flood at twice the capacity) gave 0.982 /
0.979 / 0.980 utilization and 4.1 / 3.9 / 3.7 lease calls per request at 20 / 50 / 100 ms,
beside 0.954 and 3.4 waiting as long as after `full`: 50 ms."""


class LeaseCall(NamedTuple):
    """One run of `lease.lua` on one backend, in the script's argument order."""

    backend: str
    """The backend's fleet-wide name (its URL): the keys hang off it."""
    op: str
    """`acquire`, `keep` (a recovering replica's acquire: the order, not the count),
    `release`, `pass` (a release handing on what this replica cannot use), `renew` or
    `restore`."""
    capacity: int
    ttl_s: float
    replica: str
    waiting: int
    """This replica's entitled requests waiting (not counting the one acquiring)."""
    entitled: bool
    members: tuple[str, ...]
    now: float | None
    """The caller's clock; None: the script reads the Redis server's (`TIME`)."""
    seq: int
    """The call's number, rising with each call this replica sends: a call that reaches
    Redis after a newer one (another connection) leaves the waiting board to the newer."""
    surplus: int = 0
    """This replica's other (not floor-entitled) requests waiting (not counting the one
    acquiring)."""
    pool: str = "pool"
    """The pool's hash tag: its backends' keys and its one waiting board hang off it."""
    seen: str = ""
    """The pool's lease generation this replica last saw ("" = none yet)."""


class LeaseReply(NamedTuple):
    granted: bool
    reason: str
    """Why not: `full` (C leases live), `order` (another replica's entitled request
    waits) or `lost` (Redis lost the leases' state); '' when granted (or for release and
    renew)."""
    in_use: int
    handed: tuple[tuple[str, str], ...] = ()
    """The slots this call handed over: (replica, member) each, on the call's backend."""
    held: tuple[tuple[str, str], ...] = ()
    """A renewal's: the slots handed to the caller and not released, on any backend of
    the pool (a lost message's): (backend, member) each."""
    full: tuple[str, ...] = ()
    """A `full` denial's: the pool's other backends that were full as of their last call
    (the caller waits for a hand-over instead of asking each in turn)."""
    lost: int = 0
    """A renewal's or a restore's: how many of its leases Redis did not hold (put back)."""
    generation: str = ""
    """The pool's lease generation: a new one means Redis lost the leases' state."""


class Held(NamedTuple):
    """A lease this replica holds for a request on one backend."""

    member: str
    """Its name in the backend's set: `<replica>|<request>|<the acquire's number>`."""
    shared: bool
    """Granted through Redis; False: granted locally while Redis was unreachable."""


LeaseScript = Callable[[LeaseCall], Awaitable[LeaseReply]]
"""Runs one `LeaseCall`: its `LeaseReply`, or `StoreUnavailable`."""


def handed_channel(store: RedisCreditStore, replica: str = "") -> str:
    """The pub/sub channel `lease.lua` publishes a slot handed to `replica` on (without a
    replica: the prefix it is named from)."""
    return f"{store.prefix}:slots:handed:{replica}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pool_tag(pool: str | None) -> str:
    """A pool's hash tag in the store: `pool` for the one unnamed pool, `pool:<name>`."""
    return "pool" if pool is None else f"pool:{pool}"


def lease_keys(prefix: str, pool: str, backend: str) -> list[str]:
    """`lease.lua`'s keys: the backend's leases, its pool's waiting board and the pool's
    generation marker, under the pool's hash tag (one Redis Cluster slot for the pool)."""
    tag = f"{prefix}:slots:{{{pool}}}"
    return [f"{tag}:{backend}", f"{tag}:wait", f"{tag}:gen"]


def parse_lease_reply(reply: list[object]) -> LeaseReply:
    """`lease.lua`'s reply → a `LeaseReply`."""
    granted, reason, in_use, _, handed, held, full, lost, generation = reply
    pairs = [_text(x) for x in cast(list[object], handed)]
    kept = [_text(x) for x in cast(list[object], held)]
    return LeaseReply(
        bool(granted),
        _text(reason),
        int(cast(int, in_use)),
        tuple(zip(pairs[::2], pairs[1::2], strict=True)),
        tuple(zip(kept[::2], kept[1::2], strict=True)),
        tuple(_text(b) for b in cast(list[object], full)),
        int(cast(int, lost)),
        _text(generation),
    )


def redis_lease_script(store: RedisCreditStore) -> LeaseScript:
    """`lease.lua` on `store`'s Redis (its asyncio pool and timeouts); hand-overs are
    published on `handed_channel`."""
    script = store.register_async(SCRIPT)
    prefix, channel = store.prefix, handed_channel(store)
    tokens, base = itertools.count(), uuid.uuid4().hex

    async def run(call: LeaseCall) -> LeaseReply:
        args = [call.op, call.capacity, repr(call.ttl_s), call.replica, call.waiting]
        now = "" if call.now is None else repr(call.now)
        more = [call.surplus, channel, call.backend, call.seen, f"{base}:{next(tokens)}"]
        reply = await script(
            keys=lease_keys(prefix, call.pool, call.backend),
            args=[*args, int(call.entitled), now, call.seq, *more, *call.members],
        )
        return parse_lease_reply(reply)

    return run


class SlotLeases:
    def __init__(  # noqa: PLR0915  # one statement an attribute, each with its account
        self,
        script: LeaseScript | None,
        *,
        backends: Sequence[str],
        capacity: Sequence[int],
        replica: str,
        ttl_s: float = 2.0,
        waiting: Callable[[], int],
        surplus: Callable[[], int] = lambda: 0,
        on_handed: Callable[[int], None] | None = None,
        on_change: Callable[[str], None] | None = None,
        clock: Callable[[], float] | None = None,
        first_seq: int = 0,
        pool: str = "pool",
    ) -> None:
        self.script = script
        """The script the async shells run the plans through; None: a driver runs the plans
        itself (the fleet simulator, over a simulated Redis's `lease`)."""
        self.backends = list(backends)
        self.capacity = list(capacity)
        self.replica = replica
        self.ttl_s = ttl_s
        self.pool = pool
        """The pool's hash tag (`pool_tag`): one waiting board for all its backends."""
        self._waiting = waiting
        """This replica's floor-entitled requests waiting for a slot, the guard's count:
        queued, or dispatched and waiting for a lease (`num_waiting_entitled`). The core
        counts one from the moment it leaves the queue, not from when its lease call is
        sent: a release sent in between must not clear the board while it waits."""
        self._surplus = surplus
        """This replica's other requests waiting for a slot (queued, not floor-entitled)."""
        self.on_handed = on_handed
        """Called with a backend when a slot there was handed to this replica (its driver
        offers the backend again and starts its next request there)."""
        self.on_change = on_change
        """Called with the leases' new state: `unreachable` (keeping to the slots held; this
        replica's waiting requests are off the board), `lost-state` (Redis answers with its
        state lost, the board with it), `recovering` or `shared` (the decision log records
        it: `verify` judges fleet ORDER against a replica that could not be on the board
        conditionally)."""
        self._state = "shared"
        self._clock = clock
        """The caller's clock for the script (a simulation); None: the Redis server's."""
        self.held: list[dict[str, Held]] = [{} for _ in backends]
        """Per backend: the leases this replica holds (request → its lease)."""
        self._held_members: list[set[str]] = [set() for _ in backends]
        """Per backend: every member of `held` there, by name."""
        self._handed: list[dict[str, bool]] = [{} for _ in backends]
        """Per backend: slots handed to this replica not yet started on (member → whether a
        renewal has passed since: one not taken by the next is handed on)."""
        self._releasing: list[set[str]] = [set() for _ in backends]
        """Per backend: handed members whose release or taking is in flight (a renewal's
        reply may still list them: not a hand-over to learn again)."""
        self._names = {name: i for i, name in enumerate(self.backends)}
        self.handed = {"in": 0, "used": 0, "passed_on": 0}
        """Slots handed to this replica, started on, and handed on unused."""
        self._doubt: list[set[str]] = [set() for _ in backends]
        """Per backend: leases Redis may hold that this replica does not (an acquire whose
        reply never came and was not granted locally, a release that failed): released on
        the next call Redis answers."""
        self.denied: dict[str, int] = {"full": 0, "order": 0}
        self.local_grants = 0
        self.retried = 0
        """Acquires sent again after a timeout (the script answers a lease it holds again)."""
        self.put_back = 0
        """Leases a renewal found missing in Redis and put back (its requests run on them)."""
        self._seq = first_seq
        """The last call's number. A replica that restarts under the same name must number
        above its former self (the HTTP guard starts at the wall clock's microseconds),
        or its board entries would stand still until the old ones expire."""
        self._shown = 0
        """The count of entitled requests waiting that the newest call carries (what the
        pool's board shows once it has run, or more)."""
        self._full: tuple[int, ...] = ()
        """The backends the latest `full` denial named full as of their last call."""
        self._kept: list[int] | None = None
        """While Redis is unreachable, or recovering: the leases held on each backend when
        it was lost, the most this replica may hold there; None while shared."""
        self._restore_due = False
        """The leases held must be put back at the next call Redis answers."""
        self._grace: int | None = None
        """Recovering (Redis answers again, or lost its state): the renewals left before
        this replica leases from Redis's count again — by then every live replica has
        renewed, and so put its leases back; None otherwise."""
        self._generation = ""
        """The pool's lease generation as last seen ("" = none yet)."""

    def is_local(self, backend: int, request_id: str) -> bool:
        """Whether the request's lease on `backend` was granted locally (store down)."""
        held = self.held[backend].get(request_id)
        return held is not None and not held.shared

    def waiting(self) -> int:
        """This replica's floor-entitled requests waiting for a slot: queued, or waiting
        for a lease."""
        return self._waiting()

    # -- the policy, without I/O ------------------------------------------------------------

    def _call(
        self, backend: int, op: str, *members: str, entitled: bool = False, waiting: int
    ) -> LeaseCall:
        self._shown = waiting
        return LeaseCall(
            self.backends[backend],
            op,
            self.capacity[backend],
            self.ttl_s,
            self.replica,
            waiting,
            entitled,
            members,
            self._now(),
            self._next_seq(),
            self._surplus(),
            self.pool,
            self._generation,
        )

    def _now(self) -> float | None:
        return None if self._clock is None else self._clock()

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def plan_acquire(self, backend: int, request_id: str, *, entitled: bool) -> Plan[str]:
        """'' when the request may start on `backend` (it holds a lease), else why not:
        `full`, `order` or `lost`. A slot handed to this replica there is taken, with a call
        that renews it; an opportunistic one's asks the script whether another replica's
        entitled request waits (then the slot is handed on to it). Redis
        unreachable: a local lease while this replica holds fewer there than it did when
        Redis was lost."""
        if self.may_take_handed(backend, entitled=entitled):
            return (yield from self._take_handed_slot(backend, request_id, entitled=entitled))
        if self._kept is not None:
            return (yield from self._acquire_kept(backend, request_id, entitled=entitled))
        others = max(self.waiting() - entitled, 0)  # the script counts this one if denied
        member = f"{self.replica}|{request_id}|{self._seq + 1}"  # the call's number, below
        call = self._call(backend, "acquire", member, entitled=entitled, waiting=others)
        reply = yield call
        if isinstance(reply, StoreUnavailable) and reply.sent and self._kept is None:
            self.retried += 1  # it may have run: the same lease again, answered once
            reply = yield call._replace(seq=self._next_seq(), now=self._now())
        if isinstance(reply, StoreUnavailable):
            if reply.sent:
                self._doubt[backend].add(member)
            kept = self._lost()
            if len(self.held[backend]) >= kept[backend]:
                self.denied["full"] += 1
                return "full"
            self._hold(backend, request_id, Held(member, shared=False))
            self._doubt[backend].discard(member)  # held: restored with the others
            self.local_grants += 1
            return ""
        self._learn(backend, reply)
        yield from self._answered()
        if reply.granted:
            self._hold(backend, request_id, Held(member, shared=True))
            return ""
        return (yield from self._denied(backend, request_id, reply, entitled=entitled))

    def _denied(
        self, backend: int, request_id: str, reply: LeaseReply, *, entitled: bool
    ) -> Plan[str]:
        """An acquire Redis refused: why, or '' if a slot handed here meanwhile starts it."""
        if reply.reason == "lost":  # Redis lost the leases' state: keep to what is held
            if self._kept is None:  # found by the script (another server), not the generation
                self._lost_state()
            return (yield from self._acquire_kept(backend, request_id, entitled=entitled))
        self.denied[reply.reason] = self.denied.get(reply.reason, 0) + 1
        if reply.reason == "full":
            self._full = tuple(self._names[n] for n in reply.full if n in self._names)
        if reply.reason == "full" and self.may_take_handed(backend, entitled=entitled):
            # handed while this call was out
            return (yield from self._take_handed_slot(backend, request_id, entitled=entitled))
        return reply.reason

    def may_take_handed(self, backend: int, *, entitled: bool) -> bool:
        """Whether a start may take a slot handed here on `backend`: one is, and the start is
        floor-entitled or none of this replica's entitled requests waits (one whose lease
        call is out takes it when its call comes back `full`, or, granted, leaves it to the
        next start). The script orders a handed slot's start only against the *other*
        replicas: here an opportunistic request whose call came back first took the slot
        handed for this replica's entitled one, whose count the hand-over had taken off the
        board, and the other replicas' opportunistic starts went ahead of it (fleet ORDER,
        a chaos run)."""
        return bool(self._handed[backend]) and (entitled or not self.waiting())

    def holds_handed_on(self, backend: int) -> bool:
        """Whether a slot handed to this replica on `backend` waits to be taken."""
        return bool(self._handed[backend])

    def _acquire_kept(self, backend: int, request_id: str, *, entitled: bool) -> Plan[str]:
        """Unreachable or recovering: a lease only while this replica holds fewer on
        `backend` than it did when Redis was lost (it reuses its own slots, takes none of
        another's), put in Redis whatever its count (`keep`: the count may still miss the
        leases other replicas have not put back) but not ahead of another replica's
        entitled request (`order`), or held locally if Redis does not answer."""
        kept = self._kept
        assert kept is not None
        if len(self.held[backend]) >= kept[backend]:
            self.denied["full"] += 1
            return "full"
        member = f"{self.replica}|{request_id}|{self._seq + 1}"
        local = Held(member, shared=False)
        self._hold(backend, request_id, local)  # held before the call: counted at once
        others = max(self.waiting() - entitled, 0)
        call = self._call(backend, "keep", member, entitled=entitled, waiting=others)
        reply = yield call
        if isinstance(reply, StoreUnavailable):
            self._lost()  # held locally: put back with the others when Redis answers
            self.local_grants += 1
            return ""
        self._learn(backend, reply)
        if not reply.granted:  # another replica's entitled request waits
            if self.held[backend].get(request_id) == local:
                del self.held[backend][request_id]
                self._held_members[backend].discard(member)
            self.denied[reply.reason] = self.denied.get(reply.reason, 0) + 1
            yield from self._answered()
            return str(reply.reason)
        if self.held[backend].get(request_id) == local:
            self.held[backend][request_id] = local._replace(shared=True)
        yield from self._answered()
        return ""

    def _lost(self) -> list[int]:
        """Redis did not answer: keep to the slots held until it does (and then for a
        grace)."""
        if self._kept is None:
            self._kept = [len(held) for held in self.held]
            log.warning("slot leases: Redis unreachable; keeping the slots held: %s", self._kept)
        self._say("unreachable")
        self._restore_due = True
        self._grace = None
        self._shown = 0  # the board entry may expire meanwhile: announce again
        return self._kept

    def _lost_state(self) -> None:
        """Redis answers with a new generation: it lost the leases' state (restarted without
        its data). Keep to the slots held, put them back, and wait out the grace."""
        if self._kept is None:
            self._kept = [len(held) for held in self.held]
            log.warning(
                "slot leases: Redis lost the leases' state; keeping the slots held (%s) "
                "while the fleet puts its leases back",
                self._kept,
            )
        self._state = ""  # found now, whatever it was: said once per finding
        self._say("lost-state")
        self._restore_due = True
        self._grace = None
        self._shown = 0  # the board is gone with the rest: announce again

    def _take_handed_slot(self, backend: int, request_id: str, *, entitled: bool) -> Plan[str]:
        """Start on a slot handed here, with one call that takes its lease: it renews it
        (a handed lease lives no longer than its waiter's board entry, which may be near
        its end: taken with no call, one expired under a running request and the fleet
        ran 7 on a 6-slot backend) and, for an opportunistic start, reads the order (an
        entitled request waiting elsewhere gets the slot: it is handed on)."""
        handed = self._handed[backend]
        member = next(iter(handed))
        del handed[member]
        others = max(self.waiting() - entitled, 0)
        call = self._call(backend, "acquire", member, entitled=entitled, waiting=others)
        reply = yield from self._leaving(backend, call)
        if isinstance(reply, LeaseReply):
            self._learn(backend, reply)
            if not reply.granted:  # handed on if it lives (`order`); gone otherwise
                self.denied[reply.reason] = self.denied.get(reply.reason, 0) + 1
                if reply.reason == "order":
                    yield from self._hand_on(backend, [member])
                return str(reply.reason)
        # Redis unreachable: the slot is this replica's all the same (no order to read)
        self._hold(backend, request_id, Held(member, shared=True))
        self.handed["used"] += 1
        return ""

    def _leaving(self, backend: int, call: LeaseCall) -> Plan[LeaseReply | StoreUnavailable]:
        """Send `call`, whose members are being taken or given back: while it is out they
        are `_releasing` (a renewal's reply may still list them: not a hand-over to learn
        again); its reply."""
        releasing = self._releasing[backend]
        releasing.update(call.members)
        try:
            reply: LeaseReply | StoreUnavailable = yield call
        finally:
            releasing.difference_update(call.members)
        return reply

    def _say(self, state: str) -> None:
        if state != self._state:
            self._state = state
            if self.on_change is not None:
                self.on_change(state)

    def _hold(self, backend: int, request_id: str, lease: Held) -> None:
        self.held[backend][request_id] = lease
        self._held_members[backend].add(lease.member)

    def on_message(self, backend: str, member: str) -> None:
        """A hand-over published on this replica's channel (`handed_channel`): `backend`'s
        name and the handed lease."""
        index = self._names.get(backend)
        if index is not None and member.startswith(f"{self.replica}|handed|"):
            self._take_handed(index, member)

    def _learn(self, backend: int, reply: LeaseReply) -> None:
        """What an answered call says: a new generation (Redis lost the leases' state), and
        the slots it handed over (this replica's are taken: its message may come later, or
        never)."""
        if reply.generation != self._generation:
            if self._generation:
                self._lost_state()
            self._generation = reply.generation
        for to, member in reply.handed:
            if to == self.replica:
                self._take_handed(backend, member)

    def _take_handed(self, backend: int, member: str) -> None:
        if (
            member in self._held_members[backend]
            or member in self._handed[backend]
            or member in self._releasing[backend]
            or member in self._doubt[backend]
        ):
            return  # known already (its message and its call's reply both tell it)
        self._handed[backend][member] = False
        self.handed["in"] += 1
        if self.on_handed is not None:
            self.on_handed(backend)

    def _pass_on(self, backend: int) -> Plan[None]:
        """Release the slots handed here that a whole renewal period left unused: the
        script hands them on."""
        handed = self._handed[backend]
        stale = [member for member, passed in handed.items() if passed]
        for member in handed:
            handed[member] = True
        for member in stale:
            del handed[member]
        yield from self._hand_on(backend, stale)

    def plan_pass_on(self, backend: int | None = None) -> Plan[None]:
        """Hand on every slot handed here (or on every backend) and not taken: this replica
        has nothing left to start (its count on the board was out of date, or its last
        waiting request started elsewhere)."""
        for b in range(len(self.backends)) if backend is None else (backend,):
            members = list(self._handed[b])
            self._handed[b].clear()
            yield from self._hand_on(b, members)

    def hand_over_by(self, why: str, now: float) -> float | None:
        """Until when a start denied for `why` waits before its replica asks again. The
        denial put it on the waiting board: a slot released there is handed to it. After
        `full`, it waits for that hand-over, or for its next renewal, which finds one whose
        message was lost (`ttl_s / 4`). After `order` (another replica's entitled request
        waits, and a slot may be free here) it asks again after `ORDER_RETRY_S`: that
        replica's count on this board is as of its last call here, and may be out of date.
        While Redis is unreachable nothing is handed over: None (the core's short hold-off,
        for the slots this replica keeps)."""
        if self._kept is not None:
            return None
        return now + (self.ttl_s / 4 if why == "full" else ORDER_RETRY_S)

    def full_backends(self) -> tuple[int, ...]:
        """The pool's other backends the latest `full` denial found full as of their last
        call: a start denied `full` waits for a hand-over there too, instead of asking
        each in turn (each denial a call: ~9 a request at 8 replicas × 64 backends). Not
        one where a slot was handed to this replica meanwhile: it waits to be taken."""
        return tuple(b for b in self._full if not self._handed[b])

    def holds_handed(self) -> bool:
        """Whether a slot handed to this replica waits to be taken."""
        return any(self._handed)

    def _hand_on(self, backend: int, members: list[str]) -> Plan[None]:
        """Release slots handed here (taken out of `_handed`): the script hands them on to
        the others (`pass`), never back here — this replica's count may include an
        entitled request whose own lease call is out, and handed back, the slot went round
        and round at one instant (a fleet simulation that never ended)."""
        if not members:
            return
        self.handed["passed_on"] += len(members)
        call = self._call(backend, "pass", *members, waiting=self.waiting())
        reply = yield from self._leaving(backend, call)
        if isinstance(reply, StoreUnavailable):
            self._doubt[backend].update(members)
        else:
            self._learn(backend, reply)

    def _answered(self) -> Plan[None]:
        """Redis answered: release the leases in doubt, and after an outage put every
        lease held back in it."""
        for backend, doubt in enumerate(self._doubt):
            if not doubt:
                continue
            members = sorted(doubt)
            doubt.clear()  # a plan running beside this one leaves them to this call
            reply = yield self._call(backend, "release", *members, waiting=self.waiting())
            if isinstance(reply, StoreUnavailable):
                doubt.update(members)
                self._lost()
                return
            self._learn(backend, reply)
        if not self._restore_due:
            return
        self._restore_due = False
        if not any(self.held):  # nothing to put back: the board entry is published all the
            yield from self.plan_renew(self._renewed()[:1])  # same (the outage may have
            if self._restore_due:  # expired it, and an entitled request waits here)
                return
        for backend, held in enumerate(self.held):
            if not held:
                continue
            restored = dict(held)  # what is held now (it may change while the call is out)
            members = [lease.member for lease in restored.values()]
            reply = yield self._call(backend, "restore", *members, waiting=self.waiting())
            if isinstance(reply, StoreUnavailable):
                self._lost()
                return
            self._learn(backend, reply)
            for request_id, lease in restored.items():
                if held.get(request_id) == lease:
                    held[request_id] = lease._replace(shared=True)
        if self._restore_due:  # a generation changed under the restore: again, next call
            return
        self._grace = 2
        self._say("recovering")
        log.warning(
            "slot leases: Redis answers; the leases held are put back (shared again after "
            "two renewals, when every live replica has put back its own)"
        )

    def plan_release(self, backend: int, request_id: str, waiting: int | None = None) -> Plan[None]:
        """Give the lease back (a request that ended); a failed call leaves it in doubt,
        released again on the next call Redis answers.
        `waiting`: this replica's entitled count as of the end (the caller takes it before
        its own queue moves on, so the freed slot is not taken by another replica's
        opportunistic request ahead of this replica's entitled one). The call publishes the
        larger of that and the count when it is sent: an entitled request that arrived
        in between waits too (a release sent later than its end must not clear it)."""
        lease = self.held[backend].pop(request_id, None)
        if lease is None:
            return
        self._held_members[backend].discard(lease.member)
        count = self.waiting() if waiting is None else max(waiting, self.waiting())
        kept = self._kept
        if kept is not None:  # the slot may go to the fleet (handed over): not reused here
            kept[backend] -= 1  # from the moment the release is sent, not when answered
        call = self._call(backend, "release", lease.member, waiting=count)
        reply = yield from self._leaving(backend, call)
        if isinstance(reply, StoreUnavailable):
            self._doubt[backend].add(lease.member)  # released on the next answered call
            if not reply.sent and kept is not None and kept is self._kept:
                kept[backend] += 1  # it never reached Redis: still this replica's to reuse
        else:
            self._learn(backend, reply)
            yield from self._answered()

    def plan_announce(self) -> Plan[None]:
        """An entitled request was just queued: publish the count if the newest call left
        the pool's board at zero (the board shows a replica's count only from its last
        call; the backends may be held off for a while, and another replica's
        opportunistic start must not slip past). Not only when it is the first one
        waiting: an entitled request whose lease call is out counts as waiting, but its
        call carries the count without it, so if granted it clears the board while this
        one waits."""
        if self._shown < 1 and self.waiting() > 0:
            yield from self.plan_renew(self._renewed()[:1])

    def _renewed(self) -> list[int]:
        """The backends a renewal calls on: every one where this replica holds a lease or
        a handed slot; at least one (the pool's board entry and the slots handed here
        whose message was lost are the pool's, kept and found by a call on any)."""
        busy = [
            b
            for b in range(len(self.backends))
            if self._handed[b] or any(lease.shared for lease in self.held[b].values())
        ]
        return busy or [0]

    def plan_renew(self, backends: Sequence[int] | None = None) -> Plan[None]:
        """Renew this replica's leases, handed slots and board entry (on `_renewed`'s
        backends, or on `backends`); a whole renewal counts down a recovery's grace (not
        the one that began it)."""
        recovering = backends is None and self._grace is not None
        for backend in self._renewed() if backends is None else backends:
            yield from self._pass_on(backend)
            members = [lease.member for lease in self.held[backend].values() if lease.shared]
            reply = yield self._call(backend, "renew", *members, waiting=self.waiting())
            if not isinstance(reply, StoreUnavailable):
                self._learn(backend, reply)
                if reply.lost:
                    self.put_back += reply.lost
                    log.warning(
                        "slot leases: Redis had lost %d of this replica's %d leases on %s "
                        "(restarted without its data?): put back",
                        reply.lost,
                        len(members),
                        self.backends[backend],
                    )
                for name, member in reply.held:  # a hand-over whose message was lost
                    if name in self._names:
                        self._take_handed(self._names[name], member)
            if isinstance(reply, StoreUnavailable):
                if self._kept is None:
                    log.warning(
                        "slot leases: renewal on %s failed: %s", self.backends[backend], reply
                    )
                self._lost()
            else:
                yield from self._answered()
        if recovering and self._grace is not None:
            self._grace -= 1
            if self._grace <= 0:
                self._grace, self._kept = None, None
                self._say("shared")
                log.warning("slot leases: recovered; leasing from the fleet's count again")

    # -- the shells (the HTTP guard's event loop) ---------------------------------------------

    def _script(self) -> LeaseScript:
        if self.script is None:
            raise RuntimeError("SlotLeases without a script: drive its plans")
        return self.script

    async def acquire_async(self, backend: int, request_id: str, *, entitled: bool) -> str:
        plan = self.plan_acquire(backend, request_id, entitled=entitled)
        return await run_plan_async(plan, self._script())

    async def release_async(
        self, backend: int, request_id: str, waiting: int | None = None
    ) -> None:
        await run_plan_async(self.plan_release(backend, request_id, waiting), self._script())

    async def renew_every(self, clock: Clock) -> None:
        """Keep this replica's leases and waiting-board entries alive (every `ttl_s / 4`)."""
        while True:
            await clock.sleep(self.ttl_s / 4)
            await run_plan_async(self.plan_renew(), self._script())

    def status(self) -> dict[str, object]:
        return {
            "ttl_s": self.ttl_s,
            "held": {b: len(h) for b, h in zip(self.backends, self.held, strict=True)},
            "denied": dict(self.denied),
            "local_grants": self.local_grants,
            "retried": self.retried,
            "put_back": self.put_back,
            "handed": dict(self.handed),
            "in_doubt": sum(map(len, self._doubt)),
            "degraded": self._kept is not None and self._grace is None,
            "recovering": self._grace is not None,
        }
