"""The fleet's answer for a leased start, carried to the stack the same way by every driver
(the HTTP guard's pool and the fleet simulator): granted, the request starts (a `lease`
event, local if the store was unreachable); denied, it waits again at the front of its
queue and its backend — with the pool's other backends the denial found full — is held
off until the hand-over the denial put it on the waiting board for (`SlotLeases`)."""

from __future__ import annotations

from floorguard.core.guard import Guard
from floorguard.core.surface import Dispatch, Stack
from floorguard.store.leases import SlotLeases

__all__ = ["lease_answered", "nothing_to_start", "slots_changed"]


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


def nothing_to_start(guard: Guard) -> bool:
    """Whether a slot handed to this replica should be handed on: nothing is queued, and
    no floor-entitled request is waiting for its lease's answer (one whose call comes back
    `full` starts on the handed slot next; handed on at once, the slot went to another
    replica's opportunistic request while this one's entitled request waited — fleet
    ORDER broken in a chaos run)."""
    return not guard.num_queued and not guard.num_waiting_entitled


def slots_changed(stack: Stack, state: str, now: float) -> None:
    """The slot leases' state changed (`SlotLeases.on_change`): a `store` event, reason
    `slots-<state>` (`SLOTS_UNREACHABLE` …): `verify` judges fleet ORDER against an
    entitled request waiting where its replica could not be on the pool's board (the
    store unreachable, or its state lost until the replica's next call) conditionally."""
    stack.store_changed(now, f"slots-{state}")
