from __future__ import annotations

from dataclasses import replace

import pytest

from floorguard.core.contract import (
    AffineEnvelope,
    CapacityAction,
    ContractClass,
    DispatchOrder,
    ExcessPolicy,
)
from floorguard.core.events import EventKind
from floorguard.core.guard import Dispatch, Drop, RejectReason
from floorguard.core.learner import Proposal
from floorguard.errors import ProtocolError
from floorguard.learners.adversaries import AlwaysReject
from tests.helpers import make_config, make_guard, make_request


class Scripted:
    """A learner that answers from a list (or raises what it is given)."""

    name = "scripted"

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = 0

    def propose(self, request, cls, load, now):
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer() if callable(answer) else answer


def test_floor_admits_entitled_even_when_the_learner_rejects_everything():
    """AF: the first B assured per window are admitted whatever the learner says; the
    learner is not even consulted for them."""
    learner = Scripted(Proposal(admit=False))
    guard = make_guard(make_config(floor=2), learner=learner)
    out = [guard.on_arrival(make_request(at=0.1 * i), 0.1 * i) for i in range(3)]
    assert [(a.admitted, a.entitled) for a in out] == [(True, True), (True, True), (False, False)]
    assert out[2].reason is RejectReason.FLOOR_EXHAUSTED
    assert learner.calls == 0


def test_learner_governs_the_opportunistic_surplus():
    """Opportunistic requests are admitted or rejected as the learner proposes."""
    guard = make_guard(learner=Scripted(Proposal(True), Proposal(False)))
    first = guard.on_arrival(make_request(assured=False), 0.0)
    second = guard.on_arrival(make_request(assured=False), 0.0)
    assert (first.admitted, second.admitted, second.reason) == (
        True,
        False,
        RejectReason.LEARNER_REJECT,
    )


@pytest.mark.parametrize(
    "bad",
    [
        RuntimeError("boom"),
        None,
        "admit",
        # made inside the learner: a compiled core's Proposal refuses a field of the wrong
        # type as it is built (TypeError, a fault), a pure one is refused by `consult`
        lambda: Proposal(admit=1),  # type: ignore[arg-type]
        Proposal(True, priority_hint=float("nan")),
        lambda: Proposal(True, proposed_class="assured"),  # type: ignore[arg-type]
    ],
    ids=["raises", "none", "string", "int-admit", "nan-hint", "str-class"],
)
def test_a_faulty_learner_counts_as_reject_surplus(bad):
    """An exception or malformed proposal rejects the surplus request and is counted; the
    floor is untouched and the guard keeps serving."""
    guard = make_guard(learner=Scripted(bad))
    surplus = guard.on_arrival(make_request(assured=False), 0.0)
    entitled = guard.on_arrival(make_request(assured=True), 0.0)
    assert (surplus.admitted, surplus.reason) == (False, RejectReason.LEARNER_FAULT)
    assert entitled.admitted and entitled.entitled
    assert guard.stats.learner_faults == 1


def test_unknown_tenant_is_rejected_before_anything_else():
    """No contract, no class: refused with reason unknown_tenant, never given a class."""
    guard = make_guard()
    out = guard.on_arrival(make_request(tenant="mallory"), 0.0)
    assert (out.admitted, out.cls, out.reason) == (False, None, RejectReason.UNKNOWN_TENANT)


def test_demote_admits_burst_excess_as_surplus_through_the_learner():
    """Under `demote`, assured beyond B become surplus: learner-governed, queued behind the
    entitled, and not entitled."""
    guard = make_guard(
        make_config(floor=1, excess=ExcessPolicy.DEMOTE), learner=Scripted(Proposal(True))
    )
    a = guard.on_arrival(make_request(at=0.0), 0.0)
    b = guard.on_arrival(make_request(at=0.1), 0.1)
    assert (a.entitled, b.admitted, b.entitled, b.demoted) == (True, True, False, True)
    guard_reject = make_guard(
        make_config(floor=1, excess=ExcessPolicy.DEMOTE), learner=AlwaysReject()
    )
    guard_reject.on_arrival(make_request(), 0.0)
    assert guard_reject.on_arrival(make_request(), 0.0).reason is RejectReason.LEARNER_REJECT


def test_spare_admits_burst_excess_only_into_a_free_slot_with_nothing_queued():
    """Under `spare`, an assured request past B goes on as surplus (demoted) while it would
    start at once: a slot free and nothing queued. With the one slot busy, or an entitled
    request queued, it is refused `floor_exhausted` as under `reject`."""
    guard = make_guard(
        make_config(floor=1, slots=(1,), excess=ExcessPolicy.SPARE),
        learner=Scripted(Proposal(True)),
    )
    a = guard.on_arrival(make_request(at=0.0, request_id=1), 0.0)  # entitled, queued
    b = guard.on_arrival(make_request(at=0.0, request_id=2), 0.0)  # one queued: refused
    assert (a.entitled, b.admitted, b.reason) == (True, False, RejectReason.FLOOR_EXHAUSTED)
    assert [d.request.request_id for d in guard.poll(0.0)] == [1]  # the slot is busy now
    c = guard.on_arrival(make_request(at=0.1, request_id=3), 0.1)
    assert (c.admitted, c.reason) == (False, RejectReason.FLOOR_EXHAUSTED)
    guard.finish(1, 0.2, "complete")  # the slot is free, nothing queued: spare
    d = guard.on_arrival(make_request(at=0.3, request_id=4), 0.3)
    assert (d.admitted, d.entitled, d.demoted) == (True, False, True)
    assert [x.request.request_id for x in guard.poll(0.3)] == [4]


def test_liar_relabel_orders_only_the_surplus_and_never_beats_the_floor():
    """A proposal relabelling a surplus request as assured moves it ahead of other surplus,
    never ahead of a floor-entitled request, and does not make it entitled."""
    liar = Scripted(
        Proposal(True),
        Proposal(True, ContractClass.OPPORTUNISTIC, 0.0),
        Proposal(True, ContractClass.ASSURED, 0.0),
    )
    guard = make_guard(make_config(slots=(1,)), learner=liar)
    busy = make_request(assured=False, request_id=100)
    guard.on_arrival(busy, 0.0)
    guard.poll(0.0)  # the only slot is now busy
    plain = make_request(assured=False, request_id=1)
    relabelled = make_request(assured=False, request_id=2)
    entitled = make_request(assured=True, request_id=3)
    for r in (plain, relabelled, entitled):
        out = guard.on_arrival(r, 0.0)
        assert out.entitled == (r is entitled)
    order = []
    for t in (0.1, 0.2, 0.3):
        guard.finish(order[-1] if order else 100, t, "complete")
        (d,) = guard.poll(t)
        order.append(d.request.request_id)
    assert order == [3, 2, 1]


def test_never_more_than_C_in_flight_and_completion_frees_a_slot():
    """poll() fills exactly the free slots; a completion lets the next one start."""
    guard = make_guard(make_config(floor=5, slots=(2,)))
    for i in range(4):
        guard.on_arrival(make_request(request_id=i), 0.0)
    assert [d.request.request_id for d in guard.poll(0.0)] == [0, 1]
    assert guard.poll(0.0) == []
    assert guard.finish(0, 0.5, "complete")
    assert guard.stats.per_class[ContractClass.ASSURED].late == 0
    assert [d.request.request_id for d in guard.poll(0.5)] == [2]
    assert guard.num_in_flight == 2


def test_doom_gate_drops_at_dispatch_only_when_infeasible():
    """A request that waited until t + L > D is dropped at dispatch with reason doomed."""
    config = make_config(slots=(1,), deadline_s=1.0, lower=AffineEnvelope(0.3, 0.0))
    guard = make_guard(config)
    guard.on_arrival(make_request(request_id=0), 0.0)
    guard.on_arrival(make_request(request_id=1), 0.0)
    guard.poll(0.0)
    guard.finish(0, 0.71, "complete")
    (drop,) = guard.poll(0.71)
    assert isinstance(drop, Drop) and drop.reason == "doomed"
    assert guard.stats.per_class[ContractClass.ASSURED].dropped == 1


def test_late_completion_is_counted_as_late():
    """Completion after D counts as late for its class."""
    guard = make_guard(make_config(deadline_s=0.5))
    guard.on_arrival(make_request(request_id=7), 0.0)
    guard.poll(0.0)
    assert guard.finish(7, 0.6, "complete")
    assert guard.stats.per_class[ContractClass.ASSURED].late == 1


def test_abort_dequeues_or_frees_and_fail_frees_the_slot():
    """A client abort removes a queued request or frees its slot; a backend failure frees
    the slot; a second abort of the same request is a no-op."""
    guard = make_guard(make_config(floor=5, slots=(1,)))
    for i in range(3):
        guard.on_arrival(make_request(request_id=i), 0.0)
    guard.poll(0.0)
    assert guard.finish(1, 0.1, "abort", "client_disconnected")  # queued
    assert guard.num_queued_entitled == 1 and guard.backlog.backlog == 1
    guard.finish(0, 0.2, "fail", "upstream_error")  # in flight
    (d,) = guard.poll(0.2)
    assert d.request.request_id == 2
    assert guard.finish(2, 0.3, "abort", "client_disconnected")  # in flight
    assert not guard.finish(2, 0.4, "abort", "again")
    assert guard.num_in_flight == 0 and guard.num_queued == 0


def test_fifo_dispatch_serves_in_arrival_order_across_classes():
    """The FIFO variant lets an earlier surplus request start before a later entitled one."""
    guard = make_guard(make_config(slots=(1,), dispatch=DispatchOrder.FIFO))
    guard.on_arrival(make_request(assured=False, request_id=1), 0.0)
    guard.on_arrival(make_request(assured=True, request_id=2), 0.0)
    (first,) = guard.poll(0.0)
    assert isinstance(first, Dispatch) and first.request.request_id == 1


def test_every_decision_is_a_trace_event():
    """Arrival, proposal, admission, enqueue, dispatch and completion each emit one event,
    after a leading config event."""
    events = []
    guard = make_guard(events=events)
    guard.on_arrival(make_request(assured=False, request_id=5), 0.0)
    guard.poll(0.0)
    guard.on_first_token(5, 0.05)
    guard.finish(5, 0.3, "complete")
    assert [e.kind for e in events] == [
        EventKind.CONFIG,
        EventKind.ARRIVE,
        EventKind.PROPOSE,
        EventKind.ADMIT,
        EventKind.ENQUEUE,
        EventKind.DISPATCH,
        EventKind.FIRST_TOKEN,
        EventKind.COMPLETE,
    ]
    assert events[3].entitled is False and events[3].deadline_at == 1.0


def test_credits_left_reports_the_current_window():
    """credits_left counts down within a window and refills in the next."""
    guard = make_guard(make_config(floor=3))
    guard.on_arrival(make_request(), 0.0)
    assert guard.credits_left("a95", 0.5) == 2
    assert guard.credits_left("a95", 1.0) == 3
    assert guard.credits_left("a10", 0.5) is None


def test_lower_floor_action_refuses_what_measured_capacity_cannot_serve():
    """Under `lower-floor`, once a busy window measured μ̂·W = 2 < B = 4, the next window
    admits 2 from the floor and refuses the rest `floor_lowered`; under `alarm`, 4."""

    def run(action):
        guard = make_guard(replace(make_config(floor=4, slots=(1,)), capacity_action=action))
        for rid in range(4):  # window 0: queue work, finish 2
            guard.on_arrival(make_request(request_id=rid, at=0.0), 0.0)
        guard.poll(0.0)
        for rid, t in [(0, 0.4), (1, 0.8)]:
            guard.finish(rid, t, "complete")
            guard.poll(t)
        guard.finish(2, 1.2, "complete")  # closes window 0: μ̂ = 2/s
        out = [guard.on_arrival(make_request(request_id=10 + i, at=1.3), 1.3) for i in range(4)]
        return [a.reason for a in out]

    assert run(CapacityAction.LOWER_FLOOR) == [None, None, "floor_lowered", "floor_lowered"]
    assert run(CapacityAction.ALARM) == [None, None, None, None]


def test_answering_a_decided_arrival_again_is_refused_at_the_call_site():
    """A second `continue_arrival` on a decided `Pending` admitted the request
    again (two tickets; the next `poll` died with a KeyError far from the cause). Now it
    raises at the call, and the guard holds one ticket; so does a store call answered with
    something other than a Grant."""
    guard = make_guard(make_config(floor=2))
    pending = guard.begin_arrival(make_request(request_id=1), 0.0)
    need = pending.need
    grant = guard.answer(need, 0.0)
    assert guard.continue_arrival(pending, 0.0, grant).admission.admitted
    with pytest.raises(ProtocolError, match="already decided"):
        guard.continue_arrival(pending, 0.0, grant)
    assert [type(d) for d in guard.poll(0.0)] == [Dispatch]
    assert guard.poll(0.0) == []
    other = guard.begin_arrival(make_request(request_id=2), 0.0)
    with pytest.raises(ProtocolError, match="not a Grant"):
        guard.continue_arrival(other, 0.0, Proposal(admit=True))
    assert other.need is not None and other.admission is None  # nothing changed
