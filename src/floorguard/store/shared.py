"""The floor several guard replicas share through Redis, and what it does when Redis
cannot be reached (a documented policy, never a crash or a hang).

Every store call goes to Redis (`RedisCreditStore`, one EVALSHA, a short timeout). A call
that fails is retried (`attempts`, with a short backoff): one refused or slow call is not an
outage. Nor is a call that failed while Redis answered another of this replica's calls:
that is this replica's own congestion (a burst that waits for the connection pool, an
event loop too busy to read a reply in time), and it is retried without counting as an
attempt, up to `congested_retries` times. Every attempt of one decision carries the same
call id: a call that timed out after Redis ran it is answered, when retried, with its first
answer and charged once (a double charge refused an assured request inside its floor); a
retry whose first attempt fell in a window that has since closed cannot know, and is
granted uncharged — the floor's side — with a warning, where the window had room as the
replica last heard and Redis kept the tenant's state (else refused). A call that never
reached Redis (no connection) is retried as a plain take. When every attempt fails the floor
is *degraded* and follows `on_unavailable`:

* `fail-static` (default): each of the `N` live replicas (the count last heard from the
  store's membership, `members.py`; `replicas` here) grants from a local floor of
  `⌊B/N⌋` per window, so the fleet never admits more than `B` from the floor. In the window
  where Redis was lost the replica grants nothing more (it cannot know what the fleet
  already took there); `⌊B/N⌋` from the next window. The local windows follow the *Redis*
  clock: the offset measured on every answer while shared, not this replica's own clock.
* `fail-open`: each replica grants the whole `B` locally (the fleet may admit up to `N·B`).
* `fail-closed`: no floor grants while Redis is away (assured requests meet their excess
  policy).

While degraded, Redis is probed (two tries) at most every `retry_s`, on the request path;
the first call that succeeds ends the degradation. What the replica granted locally in the
current window is handed back *inside* the next call for that tenant, before its take
(atomically, in the script), and once only: the count leaves the ledger when a call
carries it and returns only if that call fails. Other tenants' local grants are handed back
right after the first success.

A Redis that lost its state (restarted without persistence or from a snapshot, a failover)
is detected by the tenant's generation marker: a new one means the count restarted from
nothing, or from less than was granted (the marker names the server that wrote it:
`generation.lua`; a promoted replica may have missed the latest takes). A replica learns the
generation of every tenant with a floor before it serves (`learn_async`, a peek per tenant:
nothing charged), so it can tell even at its first call for a tenant: a first call with no
generation seen cannot tell a new tenant from a forgotten one, and would take the window
afresh while the grants others made there are lost. The replica's next call re-forces what
it had granted through Redis in the current window, and that window is closed to fresh takes
for every replica (none can know what the others granted there until they re-force it). The
next window is shared as after any outage: this replica holds its take down
(`_recovery_capacity`) while the replicas that met the restart as an outage may still grant
their fail-static shares. (A restart shorter than a membership beat is found by the lost
state alone: a replica that never failed a call took the whole floor in the next window
while two others granted their ⌊B/N⌋ locally, 5 of B = 3, in a chaos run.)

Bound: while every replica sees the same Redis (up or down) the fleet admits at most `B`
per window under `fail-static`; while replicas disagree (a partial partition, or the
`retry_s` after Redis returns) the fleet may admit up to `B + ⌊B/N⌋` per degraded replica in
a window.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum
from typing import Any

from floorguard.store.base import CreditStore, Grant
from floorguard.store.memory import MemoryCreditStore
from floorguard.store.plan import Plan, run_plan, run_plan_async
from floorguard.store.script import Carry, Reply, ScriptStore
from floorguard.windows import WindowSchedule

__all__ = ["SharedFloor", "Unavailable"]

log = logging.getLogger("floorguard.store")


_LocalGrant = tuple[str, int]
"""A grant made locally while Redis was away: its id and weight."""

_Knowing = tuple[str, Grant | None]
"""What a replica knew of a tenant when it sent a take: the generation, the last grant."""

_Call = tuple[str, int, int, dict[str, Any]]
"""One store call the decision asks for: key, weight, capacity and the call's options."""


class Unavailable(StrEnum):
    FAIL_STATIC = "fail-static"
    FAIL_OPEN = "fail-open"
    FAIL_CLOSED = "fail-closed"


class SharedFloor(CreditStore):
    def __init__(
        self,
        store: ScriptStore,
        *,
        policy: Unavailable,
        replicas: int,
        retry_s: float,
        clock: Callable[[], float],
        attempts: int = 3,
        backoff_s: float = 0.01,
        congested_retries: int = 8,
        on_change: Callable[[str, float], None] | None = None,
        on_lost_state: Callable[[str, int, float], None] | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.replicas = replicas
        self.retry_s = retry_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.congested_retries = congested_retries
        self.on_change = on_change
        """Called with the new state (`shared`, or the policy's name) and the time."""
        self.on_lost_state = on_lost_state
        """Called once per tenant and window that Redis lost the state of (the window is
        closed to fresh takes), with the tenant, the window and the time."""
        self._closed: set[tuple[str, int]] = set()
        self._clock = clock
        self.degraded_since: float | None = None
        """When Redis was lost (the caller's clock); None while it answers."""
        self.offset_s = 0.0
        """The Redis clock minus this replica's, measured on every answer while shared."""
        self.calls: Counter[str] = Counter()
        """Store calls by outcome: `redis` (answered), `failed_attempt` (a call that failed,
        retried or not), `congested` (a failed call retried without counting as an attempt,
        because Redis answered another call meanwhile), `redis_error` (a decision whose
        every attempt failed), `local`
        (answered by the fallback); `restored`: credits re-forced after Redis lost its
        state; `replayed`: a retry answered with its timed-out first attempt's answer (not
        charged twice); `retry_unsure`: a retry that could not know, granted uncharged."""
        self._heard = 0
        """Answers Redis gave this replica so far: a call that failed while another was
        answered met this replica's own congestion, not an outage."""
        self._retry_at = 0.0
        self._onset_window = -1
        self._local = MemoryCreditStore()
        self._last: dict[str, Grant] = {}
        self._seen: dict[str, str] = {}
        """Each tenant's generation, as last seen."""
        self._shared: dict[str, tuple[int, int]] = {}
        """Each tenant's (window, credits this replica took through Redis in it)."""
        self._owed: dict[str, tuple[int, tuple[_LocalGrant, ...]]] = {}
        """Each tenant's (window, local grants not yet handed back): each with its id, so one
        handed back twice (its first call timed out after Redis ran it) counts once."""
        self._handing_back: Counter[str] = Counter()
        """Calls in flight that carry a tenant's local grants back to Redis: another take
        for that tenant waits for them, or Redis would count it without those grants."""
        self._recovering_from: float | None = None
        """When this replica saw Redis return after an outage (None: no recovery under
        way): the shared count is held down for a while (`_recovery_capacity`)."""
        self._op_base = uuid.uuid4().hex[:12]
        self._ops = itertools.count()
        """Each decision's store call id (`_op_base:n`): its retries carry the same id, so
        a take Redis ran before its answer timed out is not charged again."""

    @property
    def degraded(self) -> bool:
        return self.degraded_since is not None

    def status(self) -> dict[str, Any]:
        """Its state for an operator: `shared`, or degraded under its fallback policy."""
        return {
            "url": self.store.url,
            "state": self.state,
            "degraded_since": self.degraded_since,
            "replicas": self.replicas,
            "clock_offset_s": self.offset_s,
            "calls": dict(self.calls),
        }

    @property
    def state(self) -> str:
        if self.degraded:
            return self.policy.value
        return "recovering" if self._recovering_from is not None else "shared"

    def outage_seen(self, now: float) -> None:
        """Redis was unreachable and answers again, as this replica saw it elsewhere (its
        membership beats): the fleet is recovering, as if its floor had been degraded."""
        if not self.degraded:
            self._recovering_from = now
            if self.on_change is not None:
                self.on_change(self.state, now)

    def _recovery_capacity(self, capacity: int, schedule: WindowSchedule, now: float) -> int:
        """While others may still grant from their fail-static shares — for `retry_s` and a
        window after this replica saw Redis return, and in the very call that finds it back
        (a degraded replica's probe) — the shared count leaves their `(N − 1)·⌊B/N⌋` aside,
        so the fleet never grants more than `B` in a window; then the floor is shared whole
        again."""
        since = self._recovering_from
        if since is not None and now >= since + self.retry_s + schedule.window_s:
            self._recovering_from = None
            if self.on_change is not None:
                self.on_change(self.state, now)
            since = None
        if since is None and not self.degraded:
            return capacity
        if self.policy is not Unavailable.FAIL_STATIC:
            return capacity
        return capacity - (self.replicas - 1) * (capacity // self.replicas)

    # -- two thin shells over one policy (`_plan`): the async one (the server's request
    # -- path) and the synchronous `CreditStore` interface (the core's own calls) ----------

    async def acquire_async(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        floor: int | None = None,
    ) -> Grant:
        """The grant for one admission: from Redis, else by the fallback policy."""
        plan = self._plan(key, weight, capacity, schedule, now, floor=floor)
        store = self.store

        async def call(step: _Call) -> Reply:
            key, weight, capacity, options = step
            return await store.call_async(key, weight, capacity, schedule, now, **options)

        return await run_plan_async(plan, call)

    def acquire(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        floor: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Grant:
        """`sleep`: how a retry's backoff is waited (a simulation on a virtual clock
        waits none)."""
        plan = self._plan(key, weight, capacity, schedule, now, floor=floor)
        store = self.store

        def call(step: _Call) -> Reply:
            key, weight, capacity, options = step
            return store.call(key, weight, capacity, schedule, now, **options)

        return run_plan(plan, call, sleep)

    def remaining(self, key: str, capacity: int, schedule: WindowSchedule, now: float) -> int:
        """As last seen by this replica (no round trip): the shared count after its latest
        admission in the current window, or the local floor's while degraded."""
        if self.degraded:
            local_now = now + self.offset_s
            return self._local.remaining(key, self._local_capacity(capacity), schedule, local_now)
        last = self._last.get(key)
        if last is None or last.window_index != schedule.index_at(now + self.offset_s):
            return capacity
        return last.remaining

    async def learn_async(
        self, keys: Iterable[str], schedule: WindowSchedule, now: float, *, at_once: int = 32
    ) -> int:
        """Learn the generation of every one of `keys` not seen yet (`plan_learn`), at
        most `at_once` calls in flight; how many are still unknown (Redis did not answer:
        their first call cannot tell a lost state, as before)."""
        store = self.store
        todo = [key for key in dict.fromkeys(keys) if key not in self._seen]
        unknown = 0

        async def call(step: _Call) -> Reply:
            key, weight, capacity, options = step
            return await store.call_async(key, weight, capacity, schedule, now, **options)

        for start in range(0, len(todo), at_once):
            plans = [self.plan_learn(k, schedule, now) for k in todo[start : start + at_once]]
            known = await asyncio.gather(*(run_plan_async(p, call) for p in plans))
            unknown += known.count(False)
        return unknown

    def learn(self, keys: Iterable[str], schedule: WindowSchedule, now: float) -> int:
        """`learn_async`, blocking (a simulation)."""
        store = self.store

        def call(step: _Call) -> Reply:
            key, weight, capacity, options = step
            return store.call(key, weight, capacity, schedule, now, **options)

        plans = [self.plan_learn(key, schedule, now) for key in dict.fromkeys(keys)]
        return [run_plan(plan, call) for plan in plans].count(False)

    def plan_learn(self, key: str, schedule: WindowSchedule, now: float) -> Plan[bool]:
        """Learn `key`'s generation by a peek (nothing taken or carried), so this replica's
        first take for the tenant can tell a Redis that lost its state since; whether it is
        known now."""
        if key in self._seen:
            return True
        carry = Carry(schedule.index_at(now + self.offset_s))
        reply = yield (key, 0, 0, {"mode": "peek", "seen": "", "carry": carry})
        if not isinstance(reply, Reply):
            return False
        self._heard += 1
        self._seen.setdefault(key, reply.generation)  # a take answered meanwhile stands
        return True

    # -- the policy -------------------------------------------------------------------------

    def _plan(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        floor: int | None,
    ) -> Plan[Grant]:
        """The whole decision, without I/O (a `Plan`): each store call it yields is `key,
        weight, capacity, options`; it returns the grant. The two shells above only run the
        I/O it asks for."""
        if self._should_try(now):
            while self._handing_back[key]:
                yield float(self.backoff_s)  # its local grants are on their way: count them first
            shared_capacity = self._recovery_capacity(capacity, schedule, now)
            carry = self._carry(key, schedule, now)
            with self._carrying(key, carry):
                grant = yield from self._shared_take(
                    key,
                    weight,
                    capacity,
                    shared_capacity=shared_capacity,
                    carry=carry,
                    schedule=schedule,
                    now=now,
                    floor=floor,
                )
            if grant is not None:
                return grant
            self._lost(schedule, now)
        return self._fallback(key, weight, capacity, schedule, now)

    def _shared_take(
        self,
        key: str,
        weight: int,
        capacity: int,
        *,
        shared_capacity: int,
        carry: Carry,
        schedule: WindowSchedule,
        now: float,
        floor: int | None,
    ) -> Plan[Grant | None]:
        """The take through Redis, with its retries; None when every attempt failed (the
        carried hand-back is owed again)."""
        op = f"{self._op_base}:{next(self._ops)}"  # one id for every attempt
        sent_knowing = (self._seen.get(key, ""), self._last.get(key))  # at the first attempt
        failed = congested = 0
        maybe_ran = False  # an attempt that failed may have run in Redis all the same
        while failed < self._attempts():
            if failed or congested:
                yield self.backoff_s * 2 ** max(0, failed - 1)
            retry_of = carry.window if maybe_ran else None  # answered once, never twice
            heard = self._heard
            own_floor = capacity if floor is None else floor  # pinned as B, not as held down
            options = {"seen": self._seen.get(key, ""), "carry": carry, "floor": own_floor}
            reply = yield (
                key,
                weight,
                shared_capacity,
                {**options, "op": op, "retry_of": retry_of},
            )
            if isinstance(reply, BaseException) or reply is None:
                maybe_ran |= getattr(reply, "sent", True)
                self.calls["failed_attempt"] += 1
                if self._heard > heard and congested < self.congested_retries:
                    congested += 1  # Redis answered another call meanwhile: alive
                    self.calls["congested"] += 1
                else:
                    failed += 1
                continue
            grant = self._answered(key, weight, reply, now, sent_knowing)
            for other, owed in self._hand_backs(schedule, now):
                with self._carrying(other, owed):
                    seen = self._seen.get(other, "")
                    back = yield (other, 0, 0, {"mode": "peek", "seen": seen, "carry": owed})
                if isinstance(back, Reply):
                    self._heard += 1
                    self._seen[other] = back.generation
                else:
                    self._owe_again(other, owed)
            return grant
        self._owe_again(key, carry)
        return None

    @contextlib.contextmanager
    def _carrying(self, key: str, carry: Carry) -> Iterator[None]:
        """Marks `key`'s local grants in flight to Redis while the call carrying them runs
        (however it ends), so a concurrent take for `key` waits for them."""
        if not carry.local:
            yield
            return
        self._handing_back[key] += 1
        try:
            yield
        finally:
            self._handing_back[key] -= 1
            if not self._handing_back[key]:
                del self._handing_back[key]

    def _should_try(self, now: float) -> bool:
        return not self.degraded or now >= self._retry_at

    def _attempts(self) -> int:
        """Shared: `attempts` (a single failed call is not an outage); degraded: a probe of
        at most two (the first call after an outage often meets a pooled connection the
        outage broke)."""
        return min(2, self.attempts) if self.degraded else self.attempts

    def _carry(self, key: str, schedule: WindowSchedule, now: float) -> Carry:
        """What a call for `key` carries back, for the current window (on the Redis clock):
        this replica's grants through Redis (re-forced only if the state was lost) and its
        local grants, taken out of the ledger so no concurrent call carries them too."""
        window = schedule.index_at(now + self.offset_s)
        shared_window, shared = self._shared.get(key, (window, 0))
        owed_window, owed = self._owed.pop(key, (window, ()))
        grants = owed if owed_window == window else ()
        return Carry(
            window, shared if shared_window == window else 0, sum(w for _, w in grants), grants
        )

    def _owe_again(self, key: str, carry: Carry) -> None:
        """A call that carried a hand-back failed: its grants are owed again, under their
        ids (Redis may have counted them: the ids keep them from counting twice)."""
        self._owe(key, carry.window, carry.grants)

    def _owe(self, key: str, window: int, grants: tuple[_LocalGrant, ...]) -> None:
        if grants:
            was, owed = self._owed.get(key, (window, ()))
            self._owed[key] = (window, (owed if was == window else ()) + grants)

    def _hand_backs(self, schedule: WindowSchedule, now: float) -> list[tuple[str, Carry]]:
        """Every other tenant's local grants still owed (after the first success)."""
        return [(key, self._carry(key, schedule, now)) for key in list(self._owed)]

    def _unsure_stands(self, key: str, reply: Reply, sent_knowing: _Knowing) -> bool:
        """An unsure retry (`Reply.unsure`) is granted only where its first attempt could
        have been: Redis kept the tenant's state (the generation this replica saw when it
        sent that attempt), and the window had room as this replica heard of it then and
        since. Else it is refused: the window was full, or its count is gone (refusals there
        are conditional on the store). Judged by what was known at the first attempt, not
        only now: another call answered meanwhile by a Redis that restarted empty teaches
        the new generation and the next window, and granted a fourth of B = 3 that way (a
        chaos run)."""
        seen, last_then = sent_knowing
        for generation in (seen, self._seen.get(key, "")):
            if generation and reply.generation != generation:
                return False
        window = reply.grant.window_index
        return all(
            last is None or last.window_index != window or last.remaining > 0
            for last in (last_then, self._last.get(key))
        )

    def _answered(
        self, key: str, weight: int, reply: Reply, now: float, sent_knowing: _Knowing
    ) -> Grant:
        if reply.unsure and not self._unsure_stands(key, reply, sent_knowing):
            reply = reply._replace(grant=reply.grant._replace(granted=False))
        grant = reply.grant
        self.calls["redis"] += 1
        self._heard += 1
        if reply.replayed:
            self.calls["replayed"] += 1  # a timed-out attempt Redis had run: charged once
        if reply.unsure and grant.granted:
            self.calls["retry_unsure"] += 1
            log.warning(
                "a retried floor take for %s could not tell whether its first attempt, in a "
                "window now gone, was charged: granted without a charge (the floor's side)",
                key,
            )
        if reply.restored:
            self.calls["restored"] += reply.restored
        if reply.closed and (key, grant.window_index) not in self._closed:
            self._closed = {k for k in self._closed if k[1] >= grant.window_index}
            self._closed.add((key, grant.window_index))
            self.calls["lost_state"] += 1
            if self.on_lost_state is not None:
                self.on_lost_state(key, grant.window_index, now)
            # a Redis that lost its state was away: others may be granting their
            # fail-static shares until their probes find it back
            self.outage_seen(now)
        self._seen[key] = reply.generation
        self.offset_s = reply.clock_s - now
        if grant.granted:
            window, used = self._shared.get(key, (grant.window_index, 0))
            used = used if window == grant.window_index else 0
            self._shared[key] = (grant.window_index, used + weight)
        self._last[key] = grant
        if self.degraded:
            self._recovered(now)
        return grant

    def _lost(self, schedule: WindowSchedule, now: float) -> None:
        self.calls["redis_error"] += 1
        self._retry_at = now + self.retry_s
        if not self.degraded:
            self.degraded_since = now
            self._onset_window = schedule.index_at(now + self.offset_s)
            self._local = MemoryCreditStore()
            if self.on_change is not None:
                self.on_change(self.state, now)

    def _recovered(self, now: float) -> None:
        self.degraded_since = None
        self._recovering_from = now
        self._local = MemoryCreditStore()
        if self.on_change is not None:
            self.on_change(self.state, now)

    def _local_capacity(self, capacity: int) -> int:
        if self.policy is Unavailable.FAIL_OPEN:
            return capacity
        if self.policy is Unavailable.FAIL_CLOSED:
            return 0
        return capacity // self.replicas

    def _fallback(
        self, key: str, weight: int, capacity: int, schedule: WindowSchedule, now: float
    ) -> Grant:
        """The local floor, on windows of the Redis clock (the last measured offset)."""
        self.calls["local"] += 1
        local_now = now + self.offset_s
        index = schedule.index_at(local_now)
        local = self._local_capacity(capacity)
        if self.policy is Unavailable.FAIL_STATIC and index == self._onset_window:
            local = 0  # the fleet may have spent this window's floor before Redis went away
        # a local grant is this replica's own: no floor is pinned fleet-wide
        grant = self._local.acquire(key, weight, local, schedule, local_now)._replace(floor=None)
        if grant.granted:
            self._owe(key, index, ((f"{self._op_base}:g{next(self._ops)}", weight),))
        return grant
