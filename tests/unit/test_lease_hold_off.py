"""Leased slots in the core (docs/design.md §13): the fleet's answer to a start is the driver's to
give, the core requeues a denied one, holds its backend off (doubling, capped) and says
when to poll again; the log records grants, local ones marked. A start on leased slots
says so (`Dispatch.lease`), and its lease is answered exactly once before it may
complete."""

from __future__ import annotations

import dataclasses

import pytest

from floorguard.core.events import EventKind
from floorguard.core.leasing import LeaseFlow, lease_answered
from floorguard.core.surface import LEASE_HOLD_OFF_MAX_S, LEASE_HOLD_OFF_S, NO_LEASE, Dispatch
from floorguard.errors import ProtocolError
from floorguard.store.leases import LeaseReply, SlotLeases
from tests.helpers import make_config, make_guard, make_request


def _guard(events=None):
    config = dataclasses.replace(make_config(slots=(1, 1)), slot_leases=True)
    return make_guard(config, events=events)


def _start(guard, now=0.0):
    request = make_request(assured=False, at=now)
    guard.on_arrival(request, now)
    (decision,) = guard.poll(now)
    assert type(decision) is Dispatch
    return request.request_id, decision.backend


def test_a_denied_lease_requeues_and_holds_the_backend_off_until_the_wake_up():
    """Denied on backend b, the request waits again at the front (`no_lease`); b gets no
    start until `next_wake_at`, the other backend still does; from then on b is offered."""
    events = []
    guard = _guard(events)
    rid, backend = _start(guard)
    guard.lease_denied(rid, 0.0)
    assert events[-1].kind is EventKind.REQUEUE and events[-1].reason == NO_LEASE
    assert guard.next_wake_at() == pytest.approx(LEASE_HOLD_OFF_S)
    (again,) = guard.poll(0.001)
    assert again.request.request_id == rid and again.backend != backend
    guard.lease_denied(rid, 0.001)  # now both held off
    assert guard.poll(0.002) == []
    (back,) = guard.poll(LEASE_HOLD_OFF_S)
    assert back.backend == backend


def test_the_hold_off_doubles_per_denial_in_a_row_up_to_its_cap_and_a_grant_resets_it():
    guard = _guard()
    rid, backend = _start(guard)
    now, holds = 0.0, []
    for _ in range(5):
        guard.lease_denied(rid, now)
        wake = guard.next_wake_at()
        holds.append(round(wake - now, 6))
        now = wake
        (decision,) = guard.poll(now)
        while decision.backend != backend:  # the other backend: held off as well
            guard.lease_denied(rid, now)
            now = guard.next_wake_at()
            (decision,) = guard.poll(now)
    assert holds[0] == LEASE_HOLD_OFF_S
    assert max(holds) == LEASE_HOLD_OFF_MAX_S
    guard.lease_granted(rid, now)
    guard.finish(rid, now, "complete")
    guard.set_backend_available(1 - backend, False)  # the next start lands on `backend`
    rid2, backend2 = _start(guard, now)
    assert backend2 == backend
    guard.lease_denied(rid2, now)
    assert guard.next_wake_at() - now == pytest.approx(LEASE_HOLD_OFF_S)  # reset by the grant


def test_a_hold_off_ending_does_not_bring_a_down_backend_back():
    """Health and hold-off are two reasons: the end of a hold-off leaves a backend the
    health probe marked down unavailable."""
    guard = _guard()
    rid, backend = _start(guard)
    guard.lease_denied(rid, 0.0)
    guard.set_backend_available(backend, False)
    guard.set_backend_available(1 - backend, False)
    assert guard.poll(1.0) == []  # the hold-off ended; both backends are down
    guard.set_backend_available(backend, True)
    (decision,) = guard.poll(1.0)
    assert decision.backend == backend


def test_lease_events_mark_local_grants_and_refuse_a_request_not_in_flight():
    events = []
    guard = _guard(events)
    rid, _ = _start(guard)
    guard.lease_granted(rid, 0.0, local=True)
    assert events[-1].kind is EventKind.LEASE and events[-1].reason == "local"
    with pytest.raises(ProtocolError, match="not in flight"):
        guard.lease_granted("nobody", 0.0)
    with pytest.raises(ProtocolError):
        guard.lease_denied("nobody", 0.0)


def test_a_leased_start_says_it_needs_a_lease_and_the_lease_is_answered_once():
    guard = _guard()
    request = make_request(assured=False, at=0.0)
    guard.on_arrival(request, 0.0)
    (start,) = guard.poll(0.0)
    rid = request.request_id
    assert start.lease  # the core, not the driver's config, says this start needs one
    with pytest.raises(ProtocolError, match="waits for its slot lease"):
        guard.finish(rid, 0.1, "complete")  # it has not started yet
    guard.lease_granted(rid, 0.1)
    with pytest.raises(ProtocolError, match="answered already"):
        guard.lease_granted(rid, 0.1)
    with pytest.raises(ProtocolError, match="answered already"):
        guard.lease_denied(rid, 0.1)
    assert guard.finish(rid, 0.2, "complete")


def test_without_leased_slots_no_start_asks_for_a_lease():
    guard = make_guard(make_config(slots=(1,)))
    request = make_request(assured=False, at=0.0)
    guard.on_arrival(request, 0.0)
    (start,) = guard.poll(0.0)
    assert not start.lease
    with pytest.raises(ProtocolError, match="slots not leased"):
        guard.lease_granted(request.request_id, 0.0)
    assert guard.finish(request.request_id, 0.1, "complete")


def test_store_changes_are_logged_by_the_core():
    events = []
    guard = _guard(events)
    guard.store_changed(1.0, "fail-static")
    guard.store_changed(2.0, "lost-state", "a95", 2)
    assert [(e.kind, e.reason, e.tenant, e.window) for e in events[-2:]] == [
        (EventKind.STORE, "fail-static", None, None),
        (EventKind.STORE, "lost-state", "a95", 2),
    ]


def test_a_request_of_its_own_ending_on_a_held_off_backend_lifts_the_hold_off():
    """The guard's own request ending there means the fleet has a slot there: the waiting
    request may try again at once, not at the end of the hold-off."""
    config = dataclasses.replace(make_config(slots=(2,)), slot_leases=True)
    guard = make_guard(config)
    first, _ = _start(guard)
    guard.lease_granted(first, 0.0)
    second, _ = _start(guard)
    guard.lease_denied(second, 0.0)
    assert guard.poll(0.001) == []  # held off
    guard.finish(first, 0.001, "complete")
    (again,) = guard.poll(0.001)
    assert again.request.request_id == second


def _leased(events=None):
    config = dataclasses.replace(make_config(slots=(2,)), slot_leases=True)
    return make_guard(config, events=events)


def _dispatched(guard, *, assured, now=0.0):
    request = make_request(assured=assured, at=now)
    guard.on_arrival(request, now)
    (decision,) = guard.poll(now)
    assert type(decision) is Dispatch and decision.lease
    return request.request_id


@pytest.mark.parametrize("answer", ["granted", "denied then aborted", "aborted", "failed"])
def test_an_entitled_request_waiting_for_its_lease_counts_as_waiting_until_answered(answer):
    """Out of the queue but not started: the fleet's waiting board must still show it, on
    every path its lease can take, and the count comes back to zero exactly once."""
    guard = _leased()
    rid = _dispatched(guard, assured=True)
    assert (guard.num_queued_entitled, guard.num_waiting_entitled) == (0, 1)
    if answer == "granted":
        guard.lease_granted(rid, 0.0)
        assert guard.num_waiting_entitled == 0
        guard.finish(rid, 0.1, "complete")
    elif answer == "denied then aborted":
        guard.lease_denied(rid, 0.0)
        assert (guard.num_queued_entitled, guard.num_waiting_entitled) == (1, 1)
        guard.finish(rid, 0.1, "abort", "client_disconnected")
    else:
        guard.finish(rid, 0.1, {"aborted": "abort", "failed": "fail"}[answer], "x")
    assert (guard.num_queued_entitled, guard.num_waiting_entitled) == (0, 0)


def test_a_release_between_an_entitled_dispatch_and_its_lease_call_keeps_it_on_the_board():
    """The race a SIGKILL test found under load (tests/integration/test_fleet_slots.py):
    the guard dispatches an entitled request, and before its lease call is sent another
    of this replica's requests ends. The release must publish the entitled one as
    waiting, or another replica's opportunistic start takes the freed slot ahead of it
    (fleet ORDER). Its own lease call then carries the others only."""
    guard = _leased()
    leases = SlotLeases(
        None, backends=["b"], capacity=[2], replica="r1",
        waiting=lambda: guard.num_waiting_entitled,
    )  # fmt: skip
    surplus = _dispatched(guard, assured=False)
    plan = leases.plan_acquire(0, str(surplus), entitled=False)
    assert next(plan).waiting == 0
    with pytest.raises(StopIteration):
        plan.send(LeaseReply(True, "", 1))
    guard.lease_granted(surplus, 0.0)
    entitled = _dispatched(guard, assured=True)  # the guard chose it; no lease call yet
    waiting = leases.waiting()  # as the pool takes it, before the end moves the queue
    guard.finish(surplus, 0.1, "complete")
    release = next(leases.plan_release(0, str(surplus), waiting))
    assert (release.op, release.waiting) == ("release", 1)
    acquire = next(leases.plan_acquire(0, str(entitled), entitled=True))
    assert (acquire.op, acquire.entitled, acquire.waiting) == ("acquire", True, 0)


def test_a_hand_over_offers_the_backend_for_one_start_then_holds_it_again():
    """Denied on both backends with a hand-over promised (`until`: the renewal), nothing
    starts; a slot handed on one backend offers it for one start — the next request starts
    there — and it is held off again until `until` (a second start would find it full)."""
    config = dataclasses.replace(make_config(slots=(2, 2)), slot_leases=True)
    guard = make_guard(config)
    requests = [make_request(assured=False, at=0.0) for _ in range(3)]
    for request in requests:
        guard.on_arrival(request, 0.0)
    started = guard.poll(0.0)
    assert len(started) == 3
    for decision in started:
        guard.lease_denied(decision.request.request_id, 0.0, until=0.5)
    assert guard.poll(0.1) == [] and guard.next_wake_at() == 0.5
    guard.lease_handed(1, 0.2)
    (one,) = guard.poll(0.2)
    assert one.backend == 1
    assert guard.poll(0.2) == []  # held off again: one hand-over, one start
    assert guard.next_wake_at() == 0.5


def test_two_hand_overs_before_a_start_offer_two_starts():
    config = dataclasses.replace(make_config(slots=(3,)), slot_leases=True)
    guard = make_guard(config)
    for _ in range(3):
        guard.on_arrival(make_request(assured=False, at=0.0), 0.0)
    for decision in guard.poll(0.0):
        guard.lease_denied(decision.request.request_id, 0.0, until=0.5)
    guard.lease_handed(0, 0.1)
    guard.lease_handed(0, 0.1)
    assert len(guard.poll(0.1)) == 2


def _three_backends():
    config = dataclasses.replace(make_config(slots=(1, 1, 1)), slot_leases=True)
    guard = make_guard(config)
    leases = SlotLeases(
        None, backends=["b0", "b1", "b2"], capacity=[1, 1, 1], replica="r1",
        waiting=lambda: guard.num_waiting_entitled, clock=lambda: 0.0,
    )  # fmt: skip
    return guard, leases


def _denied_full(leases, backend, rid, full):
    """Run the acquire plan for `rid` on `backend`, answered `full` naming `full`."""
    plan = leases.plan_acquire(backend, str(rid), entitled=False)
    next(plan)
    with pytest.raises(StopIteration) as answered:
        plan.send(LeaseReply(False, "full", 1, full=full))
    return answered.value.value


def test_a_full_denial_holds_off_the_other_backends_it_names_full():
    """The pool's board names the other backends full as of their last call: the start
    waits for a hand-over instead of asking each in turn (one denial, not three), and a
    backend it does not name is still offered."""
    guard, leases = _three_backends()
    decision = _first(guard)
    rid, backend = decision.request.request_id, decision.backend
    others = [b for b in range(3) if b != backend]
    why = _denied_full(leases, backend, rid, (f"b{others[0]}",))
    assert lease_answered(guard, leases, decision, why, 0.0) is False
    (again,) = guard.poll(0.001)
    assert again.backend == others[1]  # the one not named full
    guard.lease_denied(rid, 0.001)
    assert guard.poll(0.002) == []  # all three held until a hand-over or the renewal


def test_a_backend_handed_over_meanwhile_is_not_held_off_by_a_full_denial():
    """A slot on b was handed to this replica while its denial elsewhere was out, and that
    denial names b full as of its last call: b stays offered, so the handed slot is
    taken at once (held off, it idled until the second renewal handed it on)."""
    guard, leases = _three_backends()
    decision = _first(guard)
    rid, backend = decision.request.request_id, decision.backend
    other = (backend + 1) % 3
    plan = leases.plan_acquire(backend, str(rid), entitled=False)
    next(plan)
    leases.on_message(f"b{other}", "r1|handed|7")  # the hand-over's message comes first
    guard.lease_handed(other, 0.0)
    with pytest.raises(StopIteration) as answered:
        plan.send(LeaseReply(False, "full", 1, full=(f"b{other}",)))
    assert leases.full_backends() == ()
    lease_answered(guard, leases, decision, answered.value.value, 0.0)
    (again,) = guard.poll(0.001)
    assert again.backend == other


def _first(guard):
    request = make_request(assured=False, at=0.0)
    guard.on_arrival(request, 0.0)
    (decision,) = guard.poll(0.0)
    assert type(decision) is Dispatch
    return decision


def test_a_slot_handed_while_an_entitled_lease_call_is_out_is_kept_for_it():
    """An entitled and an opportunistic request of this replica are out with their lease
    calls; a slot is handed here meanwhile (its hand-over took the entitled one's count
    off the pool's board). The opportunistic call comes back `full` first: it must not
    take the handed slot — it did, in a chaos run, and the entitled request waited while
    the other replicas' opportunistic starts went ahead (fleet ORDER). The entitled call,
    `full` too, takes it; had it been granted instead, the slot is offered to the next
    start."""
    guard = _leased()
    leases = SlotLeases(
        None, backends=["b"], capacity=[2], replica="r1",
        waiting=lambda: guard.num_waiting_entitled, clock=lambda: 0.0,
    )  # fmt: skip
    entitled = _dispatched(guard, assured=True)
    surplus = _dispatched(guard, assured=False)
    taking = leases.plan_acquire(0, str(entitled), entitled=True)
    other = leases.plan_acquire(0, str(surplus), entitled=False)
    next(taking), next(other)
    leases.on_message("b", "r1|handed|3")
    with pytest.raises(StopIteration) as answered:
        other.send(LeaseReply(False, "full", 2))
    assert answered.value.value == "full" and leases.holds_handed_on(0)
    take = taking.send(LeaseReply(False, "full", 2))  # its own call: the handed slot
    assert (take.op, take.members, take.entitled) == ("acquire", ("r1|handed|3",), True)
    with pytest.raises(StopIteration) as started:
        taking.send(LeaseReply(True, "", 2))
    assert started.value.value == "" and not leases.holds_handed_on(0)


def test_a_slot_handed_for_an_entitled_request_granted_otherwise_starts_the_next():
    """As above, but the entitled request's own call is granted: the slot handed for it
    is offered at once (the backend the opportunistic denial held off is offered again),
    and the opportunistic request starts there, on the handed slot."""
    guard = _leased()
    leases = SlotLeases(
        None, backends=["b"], capacity=[2], replica="r1",
        waiting=lambda: guard.num_waiting_entitled, clock=lambda: 0.0,
    )  # fmt: skip
    for assured in (True, False):
        guard.on_arrival(make_request(assured=assured, at=0.0), 0.0)
    entitled, surplus = guard.poll(0.0)
    assert entitled.entitled and not surplus.entitled
    taking = leases.plan_acquire(0, str(entitled.request.request_id), entitled=True)
    other = leases.plan_acquire(0, str(surplus.request.request_id), entitled=False)
    next(taking), next(other)
    leases.on_message("b", "r1|handed|3")
    with pytest.raises(StopIteration) as answered:
        other.send(LeaseReply(False, "full", 2))
    assert lease_answered(guard, leases, surplus, answered.value.value, 0.0) is False
    assert guard.poll(0.001) == []  # held off until a hand-over or the renewal
    with pytest.raises(StopIteration) as granted:
        taking.send(LeaseReply(True, "", 2))
    assert lease_answered(guard, leases, entitled, granted.value.value, 0.002) is True
    (again,) = guard.poll(0.003)
    assert again.request.request_id == surplus.request.request_id
    take = next(leases.plan_acquire(0, str(surplus.request.request_id), entitled=False))
    assert take.members == ("r1|handed|3",)


def test_a_slot_handed_between_a_denial_and_its_answer_is_offered_again():
    """The entitled request's plan ends `full` with nothing handed yet; the hand-over comes
    before the driver carries that answer to the core, finds the backend not held off and
    offers nothing; the denial then held it off until the renewal, the handed slot idle
    while the entitled request waited (fleet ORDER, a chaos run). The answer offers the
    backend again: the entitled request starts on the handed slot at once."""
    guard = _leased()
    leases = SlotLeases(
        None, backends=["b"], capacity=[2], replica="r1",
        waiting=lambda: guard.num_waiting_entitled, clock=lambda: 0.0,
    )  # fmt: skip
    guard.on_arrival(make_request(assured=True, at=0.0), 0.0)
    (decision,) = guard.poll(0.0)
    plan = leases.plan_acquire(0, str(decision.request.request_id), entitled=True)
    next(plan)
    with pytest.raises(StopIteration) as answered:
        plan.send(LeaseReply(False, "full", 2))
    leases.on_message("b", "r1|handed|3")  # before the answer reaches the core
    guard.lease_handed(0, 0.0)
    assert lease_answered(guard, leases, decision, answered.value.value, 0.0) is False
    (again,) = guard.poll(0.001)
    assert again.request.request_id == decision.request.request_id
    take = next(leases.plan_acquire(0, str(decision.request.request_id), entitled=True))
    assert take.members == ("r1|handed|3",)


def test_a_backend_held_for_a_hand_over_stays_held_when_a_request_of_its_own_ends():
    """With a hand-over promised (`until`), a request of this guard's own ending there does
    not lift the hold: its release hands the slot to the fleet's waiters (this guard among
    them), so a lease call right after it asks for a slot already handed on — at 8
    replicas × 64 backends, 1.5 futile denials a request. The slot comes back as a
    hand-over, which offers the backend at once. (Without `until` — the store unreachable,
    this guard reusing its own slots — an end still lifts it: the test above.)"""
    config = dataclasses.replace(make_config(slots=(2,)), slot_leases=True)
    guard = make_guard(config)
    first, _ = _start(guard)
    guard.lease_granted(first, 0.0)
    second, _ = _start(guard)
    guard.lease_denied(second, 0.0, until=0.5)
    guard.finish(first, 0.001, "complete")
    assert guard.poll(0.001) == []  # still held: the release hands the slot on
    guard.lease_handed(0, 0.002)  # handed back to this guard
    (again,) = guard.poll(0.002)
    assert again.request.request_id == second


def test_the_backends_a_full_denial_names_come_back_a_period_after_the_denied_one():
    """When the hold ends, one start asks the denied backend again — its answer names the
    others still full — instead of every backend coming back at once, each asked by a
    request of the queue."""
    guard, _ = _three_backends()
    decision = _first(guard)
    rid, backend = decision.request.request_id, decision.backend
    others = tuple(b for b in range(3) if b != backend)
    guard.lease_denied(rid, 0.0, until=0.5, full=others)
    for _ in range(2):
        guard.on_arrival(make_request(assured=False, at=0.1), 0.1)
    assert guard.poll(0.4) == [] and guard.next_wake_at() == 0.5
    assert [d.backend for d in guard.poll(0.5)] == [backend]  # the denied one only
    assert guard.next_wake_at() == 1.0
    assert {d.backend for d in guard.poll(1.0)} == set(others)


def _flow(guard, backends=("b0", "b1", "b2")):
    flow = LeaseFlow(
        None, lambda: 0.0, backends=list(backends), capacity=[1] * len(backends),
        replica="r1", ttl_s=2.0, on_handed=lambda backend: None, script_clock=lambda: 0.0,
    )  # fmt: skip
    flow.serve(guard)
    return flow


def test_a_lease_answer_reaches_the_stack_only_in_the_driver_step_that_goes_on():
    """The HTTP guard runs `plan_start` in a task of its own and goes on with the request
    when it is done. Had the plan requeued the denied request itself, another request's
    pump could dispatch it again before its handler waited for it: that dispatch had no
    one to go to, and the request hung in flight until its client gave up (found in CI's
    leased-replicas test). The plan only answers; `answered` requeues."""
    events = []
    config = dataclasses.replace(make_config(slots=(1, 1, 1)), slot_leases=True)
    guard = make_guard(config, events=events)
    flow = _flow(guard)
    decision = _first(guard)
    plan = flow.plan_start(decision)
    next(plan)
    with pytest.raises(StopIteration) as done:
        plan.send(LeaseReply(False, "full", 1))
    assert done.value.value == "full"
    assert guard.awaits_lease(decision.request.request_id)  # nothing told the stack yet
    assert all(d.request.request_id != decision.request.request_id for d in guard.poll(0.0))
    assert flow.answered(decision, "full", 0.0) is False
    assert events[-1].kind is EventKind.REQUEUE and events[-1].reason == NO_LEASE


def test_an_answer_for_a_request_that_ended_meanwhile_is_not_told():
    """The client left while the lease call was out: the request ended; its answer is
    dropped (its end gives the lease back), not a `ProtocolError` in a background task."""
    config = dataclasses.replace(make_config(slots=(1, 1, 1)), slot_leases=True)
    guard = make_guard(config)
    flow = _flow(guard)
    decision = _first(guard)
    guard.finish(decision.request.request_id, 0.0, "abort", "client_disconnected")
    assert flow.answered(decision, "", 0.0) is False


def test_a_handed_slot_nothing_here_will_take_is_handed_on_after_the_poll():
    """A slot handed here while nothing is queued (the request it was for was dropped or
    started elsewhere): the settling after the next poll hands it on in one call."""
    config = dataclasses.replace(make_config(slots=(1, 1, 1)), slot_leases=True)
    guard = make_guard(config)
    flow = _flow(guard)
    flow.leases.on_message("b1", "r1|handed|3")
    assert flow.needs_settling()
    plan = flow.plan_settle()
    call = next(plan)
    assert (call.backend, call.op, call.members) == ("b1", "pass", ("r1|handed|3",))
    assert not flow.needs_settling()
