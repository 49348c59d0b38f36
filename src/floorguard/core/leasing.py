"""What follows a dispatch on fleet-wide slot leases (docs/design.md §13), once, for every
driver: the HTTP guard's pool and the fleet simulator only carry its store calls (a plan
each, as `SharedFloor` decides the floor) and start what it says may start.

* an entitled admission is announced on the pool's waiting board (`plan_admitted`);
* a leased start takes its lease (`plan_start`, the store's part) and its answer reaches
  the stack (`answered`, in the driver's step that goes on with the request — a requeue
  whose next dispatch came before the request waited again would be lost): granted, the
  request starts (a `lease` event, local if the store was unreachable); denied, it waits
  again at the front of its queue and its backend — with the pool's other backends the
  denial found full — is held off until the hand-over the denial put it on the waiting
  board for;
* a slot handed to this replica is offered at once (`handed`), and handed on when nothing
  here is left to start on it (`plan_settle`, after every poll);
* an end gives its lease back with the waiting count as of the end (`plan_end`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from floorguard.core.guard import Guard
from floorguard.core.surface import Dispatch, Stack
from floorguard.store.leases import LeaseScript, SlotLeases
from floorguard.store.plan import Plan

__all__ = ["LeaseFlow", "lease_answered"]


class LeaseFlow:
    """One replica's leased starts over its `SlotLeases`. Built before the stack it serves
    (the pool's guard takes its floor from the same fleet), it is bound to it once with
    `serve`; the leases' callbacks read the stack from then on."""

    def __init__(
        self,
        script: LeaseScript | None,
        clock: Callable[[], float],
        *,
        backends: Sequence[str],
        capacity: Sequence[int],
        replica: str,
        ttl_s: float,
        on_handed: Callable[[int], None],
        script_clock: Callable[[], float] | None = None,
        first_seq: int = 0,
        pool: str = "pool",
    ) -> None:
        self.clock = clock
        """The driver's clock, read only when the leases' state changes (`SlotLeases` says
        no time with it); everything else is told `now` by the driver."""
        self._stack: Guard | None = None
        self.leases = SlotLeases(
            script,
            backends=backends,
            capacity=capacity,
            replica=replica,
            ttl_s=ttl_s,
            waiting=self._waiting,
            surplus=self._surplus,
            on_handed=on_handed,
            on_change=self._changed,
            clock=script_clock,
            first_seq=first_seq,
            pool=pool,
        )

    def serve(self, stack: Guard) -> None:
        self._stack = stack

    @property
    def stack(self) -> Guard:
        if self._stack is None:
            raise RuntimeError("LeaseFlow.serve(stack) was not called")
        return self._stack

    # -- what the leases read of the stack ----------------------------------------------------

    def _waiting(self) -> int:
        """Floor-entitled requests waiting for a slot: queued, or waiting for a lease."""
        return self.stack.num_waiting_entitled

    def _surplus(self) -> int:
        stack = self.stack
        return stack.num_queued - stack.num_queued_entitled

    def _changed(self, state: str) -> None:
        """The leases' state changed (`SlotLeases.on_change`): a `store` event, reason
        `slots-<state>` (`SLOTS_UNREACHABLE` …): `verify` judges fleet ORDER against an
        entitled request waiting where its replica could not be on the pool's board (the
        store unreachable, or its state lost until the replica's next call) conditionally."""
        self.stack.store_changed(self.clock(), f"slots-{state}")

    # -- the flow, as plans ---------------------------------------------------------------------

    def plan_admitted(self, *, entitled: bool) -> Plan[None]:
        """An admission: an entitled one puts this replica's count on the board at once."""
        if entitled:
            yield from self.leases.plan_announce()

    def plan_start(self, decision: Dispatch) -> Plan[str]:
        """Take the lease for `decision`'s leased start: '' granted, else why not (the
        answer `answered` carries to the stack)."""
        return (
            yield from self.leases.plan_acquire(
                decision.backend, str(decision.request.request_id), entitled=decision.entitled
            )
        )

    def answered(self, decision: Dispatch, why: str, now: float) -> bool:
        """`plan_start`'s answer `why` for `decision`, told the stack; True when the request
        may start. A request that ended while its call was out (its client left) is not
        told: its end gives back what the call took (`plan_end`)."""
        if not self.stack.awaits_lease(decision.request.request_id):
            return False
        return lease_answered(self.stack, self.leases, decision, why, now)

    def handed(self, backend: int, now: float) -> None:
        """A slot on `backend` was handed to this replica: the backend is offered again, and
        the driver's next poll starts there (or `plan_settle` hands it on)."""
        self.stack.lease_handed(backend, now)

    def needs_settling(self) -> bool:
        """Whether slots handed here wait while nothing is left to start on them: nothing is
        queued, and no floor-entitled request is waiting for its lease's answer (one whose
        call comes back `full` starts on the handed slot next; handed on at once, the slot
        went to another replica's opportunistic request while this one's entitled request
        waited — fleet ORDER broken in a chaos run)."""
        stack = self.stack
        return (
            not stack.num_queued and not stack.num_waiting_entitled and self.leases.holds_handed()
        )

    def plan_settle(self) -> Plan[None]:
        """After a poll: hand on the slots handed here that nothing is left to start on (a
        request that would have taken one was dropped, ended or started elsewhere)."""
        if self.needs_settling():
            yield from self.leases.plan_pass_on()

    def plan_end(self, backend: int, request_id: str, waiting: int) -> Plan[None]:
        """Give the lease of a request that ended (or whose backend failed) back; `waiting`:
        the count as of the end, before the end lets the queue move on."""
        yield from self.leases.plan_release(backend, request_id, waiting)


def lease_answered(
    stack: Stack, leases: SlotLeases, decision: Dispatch, why: str, now: float
) -> bool:
    """`why` is the lease plan's answer for `decision`'s start ('' granted, else `full` or
    `order`); True when the request may start."""
    request_id = decision.request.request_id
    if why:
        full = leases.full_backends() if why == "full" else ()
        stack.lease_denied(request_id, now, until=leases.hand_over_by(why, now), full=full)
        if leases.may_take_handed(decision.backend, entitled=decision.entitled):
            # handed here after its plan ended and before this answer: the hand-over found
            # the backend not held off yet, so it was not offered; held now, the slot idled
            # until the renewal while the entitled request waited (fleet ORDER, a chaos run)
            stack.lease_handed(decision.backend, now)
        return False
    local = leases.is_local(decision.backend, str(request_id))
    stack.lease_granted(request_id, now, local=local)
    if leases.holds_handed_on(decision.backend):  # kept for this start, which needed none:
        stack.lease_handed(decision.backend, now)  # the next start there takes it
    return True
