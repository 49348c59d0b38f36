"""`acquire.lua`'s and `lease.lua`'s semantics in process, on the caller's clock: the Redis
a simulation runs against (the datacenter in `datacenter.py`), held to the real scripts by
differential tests against a real `redis-server` (`tests/integration/test_simulated_store.py`).

Every step of the script is here — the generation marker, the carried hand-back and the
re-force of a lost state (once per caller and window), the window closed by a lost state,
the floor pinned at a window's first take — and every step of the lease script (leases
that expire unless renewed, the waiting board that holds opportunistic starts back while
another replica's entitled request waits), so a fleet simulated over it meets the same
store the shipped replicas meet. `restart()` is a Redis that comes back without its data,
`failover()` another server with the same data (a replica promoted: the markers name the
old one, `generation.lua`); `down` makes every call fail as an unreachable one does. Key
expiry is not modelled: the script reads every field against the current window, so an
expired field and a stale one answer alike.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from floorguard.store.base import Grant, StoreUnavailable
from floorguard.store.leases import LeaseCall, LeaseReply
from floorguard.store.script import NO_CARRY, Carry, Reply, ScriptStore
from floorguard.windows import WindowSchedule

__all__ = ["SimulatedRedis"]

_Entry = list[float]
"""A waiting-board entry: [entitled waiting, the instant it expires, seq, others waiting]."""
_Marker = tuple[str, int]
"""A generation marker: (token, the server that wrote it)."""


@dataclass
class _Counter:
    """A tenant's counter hash for one window: `w`, `used`, `floor`, `lost`, `r:<caller>`
    marks, `op:<id>` answers and `h:<id>` grants handed back (a call in a later window
    starts it afresh)."""

    window: int | None = None
    used: int = 0
    floor: int | None = None
    lost: int | None = None
    reforced: dict[str, int] = field(default_factory=dict)
    ops: dict[str, bool] = field(default_factory=dict)
    handed: set[str] = field(default_factory=set)


class SimulatedRedis:
    """One simulated Redis; `client(caller)` is one replica's connection to it (the
    caller's id keys its once-per-window re-force, as the real store's token base does)."""

    url = "sim://redis"

    def __init__(self, outage: tuple[float, float] | None = None) -> None:
        self.down = False
        """Every call raises `StoreUnavailable` while set (an outage)."""
        self.outage = outage
        """… and while the caller's clock is in [start, end) seconds (a simulated one)."""
        self._counters: dict[str, _Counter] = {}
        self._generations: dict[str, _Marker] = {}
        self._leases: dict[str, dict[str, float]] = {}
        """Per backend: lease member → the instant it expires unless renewed."""
        self._boards: dict[str, dict[str, _Entry]] = {}
        """Per pool: replica → its waiting-board entry (`_Entry`)."""
        self._uses: dict[str, dict[str, tuple[int, int]]] = {}
        """Per pool: backend → (leases in use, capacity) as of the last call there."""
        self._index: dict[str, dict[str, tuple[str, float]]] = {}
        """Per pool: a handed member not yet released → (its backend, its expiry)."""
        self._turns: dict[str, int] = {}
        """Per pool: the hand-over's round-robin count."""
        self._lease_generations: dict[str, _Marker] = {}
        """Per pool: the leases' generation marker."""
        self._moved: dict[str, float] = {}
        """Per pool: until when every acquire is refused `lost` (a marker another server
        wrote: `lease.lua`'s `|moved`)."""
        self._server = 0
        """Which Redis server answers (its run id)."""
        self._tokens = itertools.count()

    def restart(self) -> None:
        """Redis came back without its data: every counter, marker, lease and board is gone."""
        self._counters.clear()
        self._generations.clear()
        self._leases.clear()
        self._boards.clear()
        self._uses.clear()
        self._index.clear()
        self._turns.clear()
        self._lease_generations.clear()
        self._moved.clear()
        self._server += 1

    def failover(self) -> None:
        """Another Redis server answers with the same data (a replica promoted, here one
        that missed nothing): every marker names the server before it."""
        self._server += 1

    def _generation(self, markers: dict[str, _Marker], key: str) -> tuple[str, bool]:
        """`generation.lua`: the marker's token, and whether another server wrote it (then a
        fresh one, written by this server, as for a marker missing)."""
        marker = markers.get(key)
        moved = marker is not None and marker[1] != self._server
        if marker is None or moved:
            marker = markers[key] = (f"sim:{next(self._tokens)}", self._server)
        return marker[0], moved

    def _unreachable(self, now: float) -> bool:
        outage = self.outage
        return self.down or (outage is not None and outage[0] <= now < outage[1])

    def client(self, caller: str) -> SimulatedClient:
        return SimulatedClient(self, caller)

    def call(  # noqa: PLR0917  # the script's arguments, in its order
        self,
        caller: str,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        mode: str,
        seen: str,
        carry: Carry,
        floor: int | None,
        op: str = "",
        retry_of: int | None = None,
    ) -> Reply:
        """One run of `acquire.lua`, step for step."""
        if self._unreachable(now):
            raise StoreUnavailable("simulated outage", sent=False)
        own_floor = capacity if floor is None else floor
        index = schedule.index_at(now)
        generation, moved = self._generation(self._generations, key)
        counter = self._counters.setdefault(key, _Counter())
        if counter.window is not None and counter.window != index:
            counter = self._counters[key] = _Counter()  # another window's: none of it holds
        current = counter.window == index
        used = counter.used if current else 0
        pinned = counter.floor if current else None
        window_floor = own_floor if pinned is None else pinned
        limit = min(capacity, window_floor) if capacity < own_floor else window_floor

        if mode == "take" and op:
            closed_now = counter.lost == index
            first = counter.ops.get(op)
            if first is not None:
                grant = Grant(first, index, limit - used, window_floor)
                return Reply(grant, generation, now, 0, closed_now, replayed=True)
            if retry_of is not None and retry_of < index:
                grant = Grant(True, retry_of, 0, window_floor)
                return Reply(grant, generation, now, 0, closed_now, unsure=True)

        carried = carry.window == index
        restored = 0
        if moved or seen not in (generation, ""):
            counter.lost = index
            if carried and counter.reforced.get(caller) != index:
                restored = carry.shared
                counter.reforced[caller] = index
        closed = counter.lost == index
        fresh = [(g, w) for g, w in carry.grants if g not in counter.handed] if carried else []
        handed = sum(w for _, w in fresh) if carry.grants else carry.local if carried else 0
        used += restored + handed

        granted = mode == "take" and not closed and used + weight <= limit
        if granted:
            used += weight
        if mode == "take" or restored + handed > 0 or closed:
            counter.window, counter.used = index, used
            counter.handed.update(g for g, _ in fresh)
            if mode == "take":
                counter.floor = window_floor
                if op:
                    counter.ops[op] = granted
            elif pinned is None:
                counter.floor = None
        grant = Grant(granted, index, limit - used, window_floor)
        return Reply(grant, generation, now, restored, closed)

    def lease_state(self, pool: str, backend: str) -> tuple[dict[str, float], dict[str, object]]:
        """A backend's leases (member → expiry) and its pool's waiting board as stored,
        field by field: replica → (entitled, expiry, seq, others), `|turn` → the hand-over's
        count, `|use:<backend>` → (in use, capacity), `|h:<member>` → (backend, expiry)."""
        board: dict[str, object] = {
            r: (int(e[0]), e[1], int(e[2]), int(e[3]))
            for r, e in self._boards.get(pool, {}).items()
        }
        if pool in self._turns:
            board["|turn"] = self._turns[pool]
        if pool in self._moved:
            board["|moved"] = self._moved[pool]
        board |= {f"|use:{b}": use for b, use in self._uses.get(pool, {}).items()}
        board |= {f"|h:{m}": handed for m, handed in self._index.get(pool, {}).items()}
        return dict(self._leases.get(backend, {})), board

    def lease(self, call: LeaseCall) -> LeaseReply:
        """One run of `lease.lua` on the call's backend and its pool's board, step for step,
        on the caller's clock. Publishing is the driver's: it delivers each hand-over to
        its replica."""
        now = call.now
        if now is None:
            raise ValueError("a simulated Redis runs on the caller's clock: give SlotLeases one")
        if self._unreachable(now):
            raise StoreUnavailable("simulated outage", sent=False)
        backend, members = call.backend, list(call.members)
        leases = self._leases.setdefault(backend, {})
        board = self._boards.setdefault(call.pool, {})
        uses = self._uses.setdefault(call.pool, {})
        index = self._index.setdefault(call.pool, {})
        _prune(leases, board, index, now)
        generation, stale = self._pool_generation(call, now)
        waiting, surplus = call.waiting, call.surplus
        granted, reason, freed, lost = False, "", 0, 0
        if call.op in ("acquire", "keep"):
            granted, reason = _acquire(call, leases, board, index, stale=stale)
            waiting += not granted and call.entitled
            surplus += not granted and not call.entitled
        elif call.op in ("release", "pass"):
            freed = _update(leases, call.op, members, now + call.ttl_s)
            for member in members:
                index.pop(member, None)
        else:
            lost = _update(leases, call.op, members, now + call.ttl_s)
        mine = board.get(call.replica)
        if mine is not None and mine[2] > call.seq:
            pass  # a newer call's counts stand
        elif waiting > 0 or surplus > 0:
            board[call.replica] = [waiting, now + call.ttl_s, call.seq, surplus]
        else:
            board.pop(call.replica, None)
        handed = self._hand_over(call, leases, board, index, freed=freed)
        uses[backend] = (len(leases), call.capacity)
        held: tuple[tuple[str, str], ...] = ()
        if call.op == "renew":
            prefix = f"{call.replica}|handed|"
            held = tuple((index[m][0], m) for m in sorted(index) if m.startswith(prefix))
        full: tuple[str, ...] = ()
        if reason == "full":
            full = tuple(sorted(b for b, (n, c) in uses.items() if b != backend and n >= c))
        return LeaseReply(granted, reason, len(leases), tuple(handed), held, full, lost, generation)

    def _pool_generation(self, call: LeaseCall, now: float) -> tuple[str, bool]:
        """The pool's generation, and whether an acquire is refused `lost`: the caller saw
        another, or the pool recovers from a marker another server wrote (for `ttl_s / 2`
        after the call that met it)."""
        if self._moved.get(call.pool, now) <= now:
            self._moved.pop(call.pool, None)
        generation, moved = self._generation(self._lease_generations, call.pool)
        if moved:
            self._moved[call.pool] = now + call.ttl_s / 2
        return generation, call.seen not in ("", generation) or call.pool in self._moved

    def _hand_over(
        self,
        call: LeaseCall,
        leases: dict[str, float],
        board: dict[str, _Entry],
        index: dict[str, tuple[str, float]],
        *,
        freed: int,
    ) -> list[tuple[str, str]]:
        """Each slot a release freed leased to a replica waiting in the pool: entitled
        first, round-robin; each expires with its ttl, or with the waiter's board entry if
        that is sooner."""
        handed: list[tuple[str, str]] = []
        turn = self._turns.get(call.pool, 0)
        assert call.now is not None
        while freed > 0 and len(leases) < call.capacity:
            freed -= 1
            for column in (0, 3):
                waiters = sorted(
                    r
                    for r, e in board.items()
                    if e[column] > 0 and not (call.op == "pass" and r == call.replica)
                )
                if waiters:
                    break
            else:
                break
            to = waiters[turn % len(waiters)]
            turn += 1
            entry = board[to]
            entry[column] -= 1
            member = f"{to}|handed|{turn}"
            expiry = min(call.now + call.ttl_s, entry[1])
            leases[member] = expiry
            index[member] = (call.backend, expiry)
            if entry[0] <= 0 and entry[3] <= 0:
                del board[to]
            handed.append((to, member))
        if handed:
            self._turns[call.pool] = turn
        return handed


def _prune(
    leases: dict[str, float],
    board: dict[str, _Entry],
    index: dict[str, tuple[str, float]],
    now: float,
) -> None:
    """Drop the expired leases, board entries and handed-index entries."""
    for member in [m for m, expiry in leases.items() if expiry <= now]:
        del leases[member]
    for name in [r for r, entry in board.items() if entry[1] <= now]:
        del board[name]
    for member in [m for m, (_, expiry) in index.items() if expiry <= now]:
        del index[member]


def _acquire(
    call: LeaseCall,
    leases: dict[str, float],
    board: dict[str, _Entry],
    index: dict[str, tuple[str, float]],
    *,
    stale: bool,
) -> tuple[bool, str]:
    """An acquire's answer: (granted, why not)."""
    if call.op == "acquire" and stale:
        return False, "lost"  # the leases' state is gone: nothing is judged by its count
    member = call.members[0]
    assert call.now is not None
    expiry = call.now + call.ttl_s
    live = member in leases  # a retry of a call that ran: its first grant
    judged = not call.entitled and (not live or "|handed|" in member)
    reason = _board_order(board, call.replica) if judged else ""
    if reason:
        return False, reason
    if live:
        leases[member] = expiry
        index.pop(member, None)  # a handed slot taken: its replica renews it from now on
        return True, ""
    if call.op == "keep" or len(leases) < call.capacity:
        leases[member] = expiry
        return True, ""
    return False, "full"


def _update(leases: dict[str, float], op: str, members: list[str], expiry: float) -> int:
    """`release` `members` (how many leases that freed), or `renew` / `restore` them
    whatever the count (how many were missing)."""
    if op in ("release", "pass"):
        return sum(leases.pop(member, None) is not None for member in members)
    missing = sum(member not in leases for member in members)
    for member in members:
        leases[member] = expiry
    return missing


def _board_order(board: dict[str, _Entry], replica: str) -> str:
    """`order` if another replica's board entry shows entitled requests waiting (the
    expired entries are gone already)."""
    return "order" if any(r != replica and e[0] > 0 for r, e in board.items()) else ""


class SimulatedClient(ScriptStore):
    """The `RedisCreditStore` surface (`call`, and the `CreditStore` operations) and a
    lease script (`lease`, for `SlotLeases`) over one `SimulatedRedis`, for one caller."""

    def __init__(self, server: SimulatedRedis, caller: str) -> None:
        self.server = server
        self.caller = caller
        self.url = server.url

    def call(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        mode: str = "take",
        seen: str = "",
        carry: Carry = NO_CARRY,
        floor: int | None = None,
        op: str = "",
        retry_of: int | None = None,
    ) -> Reply:
        return self.server.call(
            self.caller,
            key,
            weight,
            capacity,
            schedule,
            now,
            mode,
            seen,
            carry,
            floor,
            op,
            retry_of,
        )

    def lease(self, call: LeaseCall) -> LeaseReply:
        """One `LeaseCall`, on the caller's clock (a simulated Redis has none of its own)."""
        return self.server.lease(call)
