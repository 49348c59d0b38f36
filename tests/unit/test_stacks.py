"""Each comparison stack's defining behaviour (docs/design.md §7), and what all stacks share."""

from __future__ import annotations

import pytest

from floorguard.analysis.checker import check_trace
from floorguard.baselines import (
    POLICIES,
    FlowControlOptions,
    FlowControlStack,
    MappingFault,
    Objective,
    RateLimitStack,
    ServerPriorityStack,
    StackOptions,
    TokenBucket,
    UnguardedStack,
    create_stack,
)
from floorguard.core.contract import Contract, ContractClass, GuardConfig
from floorguard.core.events import EventKind
from floorguard.core.guard import Dispatch, Drop
from floorguard.core.learner import Proposal
from floorguard.learners import AlwaysAdmit, Liar
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import marquee
from tests.helpers import make_config, make_request
from tests.unit.test_guard import Scripted

ASSURED, OPP = ContractClass.ASSURED, ContractClass.OPPORTUNISTIC


def started(decisions):
    return [d.request.request_id for d in decisions if isinstance(d, Dispatch)]


def finish(stack, rid, now):
    stack.finish(rid, now, "complete")
    return started(stack.poll(now))


def test_server_priority_never_preempts_and_orders_waiting_by_priority_then_arrival():
    """C = 1: an opportunistic request runs; two later opportunistic and one assured wait.
    The assured request does not preempt the running one; when it ends, the assured starts
    first, then the opportunistic in arrival order."""
    stack = ServerPriorityStack(make_config(slots=(1,)))
    stack.on_arrival(make_request(assured=False, request_id=0), 0.0)
    assert started(stack.poll(0.0)) == [0]
    for rid, assured in [(1, False), (2, False), (3, True)]:
        stack.on_arrival(make_request(assured=assured, request_id=rid), 0.1)
        assert started(stack.poll(0.1)) == []
    assert stack.in_flight_on(0) == 1
    assert [finish(stack, r, t) for r, t in [(0, 0.5), (3, 0.9), (1, 1.3)]] == [[3], [1], [2]]


def test_server_priority_admits_everything_beyond_any_floor():
    """No floor: every assured request is admitted, even past B in one window."""
    stack = ServerPriorityStack(make_config(floor=1))
    assert all(stack.on_arrival(make_request(), 0.0).admitted for _ in range(5))


def test_unguarded_applies_the_learner_to_every_class_in_fifo_order():
    """The learner alone admits or rejects, assured included; admitted requests start in
    arrival order; a learner fault rejects and is counted."""
    stack = UnguardedStack(
        make_config(floor=5, slots=(1,)),
        learner=Scripted(
            Proposal(True), Proposal(False), Proposal(True), RuntimeError("down"), Proposal(True)
        ),
    )
    out = [
        stack.on_arrival(make_request(assured=a, request_id=i), 0.0)
        for i, a in enumerate([False, True, True, True, True])
    ]
    assert [a.admitted for a in out] == [True, False, True, False, True]
    assert out[1].reason == "learner_reject" and out[3].reason == "learner_fault"
    assert stack.stats.learner_faults == 1
    assert started(stack.poll(0.0)) == [0]
    assert finish(stack, 0, 0.3) == [2] and finish(stack, 2, 0.6) == [4]


def test_gated_fifo_has_the_guards_admission_and_fifo_dispatch():
    """gated-fifo admits exactly like the guard (floor, learner) but starts in arrival order."""
    config = make_config(floor=1, slots=(1,))
    gated = create_stack("gated-fifo", config, learner=AlwaysAdmit())
    guard = create_stack("guard", config, learner=AlwaysAdmit())
    for stack in (gated, guard):
        stack.on_arrival(make_request(assured=False, request_id=0), 0.0)
        stack.poll(0.0)
        for rid, assured in [(1, False), (2, True), (3, True)]:
            assert stack.on_arrival(
                make_request(assured=assured, request_id=rid), 0.0
            ).admitted == (rid != 3)
    assert finish(gated, 0, 0.4) == [1]
    assert finish(guard, 0, 0.4) == [2]


def test_token_bucket_allows_its_burst_then_its_rate():
    """Starts full; refills at the rate; never beyond the burst."""
    bucket = TokenBucket(rate_per_s=2.0, burst=2.0)
    assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
    assert bucket.take(0.5) and not bucket.take(0.5)
    assert [bucket.take(10.0) for _ in range(3)] == [True, True, False]


def test_rate_limit_per_class_vs_flat():
    """Per class, an opportunistic flood cannot use the assured bucket; flat, it can."""
    config = make_config(floor=2, slots=(4,))
    per_class = create_stack(
        "rate-limit-class", config, learner=AlwaysAdmit(), options=StackOptions()
    )
    flat = create_stack("rate-limit-flat", config, learner=AlwaysAdmit())
    for stack in (per_class, flat):
        for i in range(20):
            stack.on_arrival(make_request(assured=False, request_id=i), 0.0)
    assert per_class.on_arrival(make_request(request_id=99), 0.0).admitted
    rejected = flat.on_arrival(make_request(request_id=99), 0.0)
    assert (rejected.admitted, rejected.reason) == (False, "rate_limited")
    assert isinstance(per_class, RateLimitStack) and per_class.name == "rate-limit-class"


NOT_SHEDDABLE = {ASSURED: Objective("premium", 10), OPP: Objective("standard", 0)}


def flow(fault=MappingFault.NONE, threshold=0, ttl=None, slots=(1,), objectives=None):
    """A flow controller; by default with a non-sheddable low band, so both bands queue."""
    config = GuardConfig(
        contracts=(
            Contract("a95", ASSURED, 1.0, 2),
            Contract("b95", ASSURED, 1.0, 2),
            Contract("a10", OPP, 1.0),
        ),
        slots=slots,
    )
    options = FlowControlOptions(
        objectives=objectives or NOT_SHEDDABLE,
        mapping_fault=fault,
        queue_depth_threshold=threshold,
        queue_ttl_s=ttl,
    )
    return FlowControlStack(config, options=options)


def test_flow_control_dispatches_strictly_by_band():
    """Behind a busy slot, a later assured request (high band) starts before earlier
    opportunistic ones (low band)."""
    stack = flow()
    stack.on_arrival(make_request(assured=False, request_id=0), 0.0)
    assert started(stack.poll(0.0)) == [0]
    for rid, assured in [(1, False), (2, False), (3, True)]:
        assert stack.on_arrival(make_request(assured=assured, request_id=rid), 0.1).admitted
        stack.poll(0.1)
    assert finish(stack, 0, 0.3) == [3]
    assert finish(stack, 3, 0.5) == [1]


def test_swapped_mapping_flips_which_class_goes_first():
    """With the objectives swapped, the opportunistic class owns the high band."""
    stack = flow(fault=MappingFault.SWAP)
    stack.on_arrival(make_request(assured=False, request_id=0), 0.0)
    stack.poll(0.0)
    for rid, assured in [(1, True), (2, False)]:
        assert stack.on_arrival(make_request(assured=assured, request_id=rid), 0.1).admitted
        stack.poll(0.1)
    assert finish(stack, 0, 0.3) == [2]


def test_swapped_mapping_under_saturation_sheds_the_assured_class():
    """With GAIE's default objectives (opportunistic sheddable) a swap makes the assured
    class sheddable: while saturated its arrivals are rejected, the opportunistic queue."""
    stack = flow(fault=MappingFault.SWAP, objectives=FlowControlOptions().objectives)
    stack.on_arrival(make_request(assured=False, request_id=0), 0.0)
    stack.poll(0.0)
    assert stack.saturated()
    shed = stack.on_arrival(make_request(assured=True, request_id=1), 0.1)
    assert (shed.admitted, shed.reason) == (False, "shed_saturated")
    assert stack.on_arrival(make_request(assured=False, request_id=2), 0.1).admitted


def test_flow_control_round_robins_tenants_within_a_band():
    """Two assured tenants in one band alternate, whatever their arrival order."""
    stack = flow()
    stack.on_arrival(make_request(assured=False, request_id=0), 0.0)
    stack.poll(0.0)
    for rid, tenant in [(1, "a95"), (2, "a95"), (3, "a95"), (4, "b95")]:
        stack.on_arrival(make_request(tenant=tenant, request_id=rid), 0.1)
        stack.poll(0.1)
    order = [finish(stack, r, t)[0] for r, t in [(0, 0.2)]]
    for t in (0.3, 0.4, 0.5):
        order += finish(stack, order[-1], t)
    assert order == [1, 4, 2, 3]


def test_flow_control_holds_while_saturated_and_sheds_the_sheddable():
    """With threshold 1 and C = 1, the backend holds one running and one waiting; more wait
    in the controller; a sheddable arrival while saturated is rejected."""
    stack = flow(threshold=1, objectives=FlowControlOptions().objectives)
    for rid in range(3):
        stack.on_arrival(make_request(request_id=rid), 0.0)
        stack.poll(0.0)
    assert (stack.in_flight_on(0), stack.num_waiting_on(0), stack.num_queued) == (1, 1, 2)
    assert stack.saturated()
    shed = stack.on_arrival(make_request(assured=False, request_id=9), 0.0)
    assert (shed.admitted, shed.reason) == (False, "shed_saturated")


def test_a_backend_queues_in_the_order_requests_reached_it_not_admission_order():
    """C = 1, two may wait at the backend. An opportunistic request held by the controller
    (admitted at 0.1) is forwarded after a later premium one (admitted at 0.2, released
    first): the backend's FIFO starts the premium first, as vLLM would (it knows when a
    request reached it, not when a stack admitted it)."""
    stack = flow(threshold=2)
    for rid, assured, at in [(0, False, 0.0), (1, False, 0.0), (2, False, 0.0),
                             (4, False, 0.1), (5, True, 0.2)]:  # fmt: skip
        assert stack.on_arrival(make_request(assured=assured, request_id=rid), at).admitted
        stack.poll(at)
    assert (stack.in_flight_on(0), stack.num_waiting_on(0), stack.num_queued) == (1, 2, 4)
    assert finish(stack, 0, 0.5) == [1]  # and the premium one goes to the backend's queue
    assert finish(stack, 1, 1.0) == [2]  # and the held opportunistic one behind it
    assert finish(stack, 2, 1.5) == [5]
    assert finish(stack, 5, 2.0) == [4]


def test_flow_control_queue_ttl_evicts_with_a_reason():
    """A request older than the TTL in the controller's queue is dropped `ttl_expired`."""
    stack = flow(ttl=0.5)
    stack.on_arrival(make_request(request_id=0, at=0.0), 0.0)
    stack.poll(0.0)
    stack.on_arrival(make_request(request_id=1, at=0.0), 0.0)
    stack.poll(0.0)
    stack.finish(0, 0.6, "complete")
    (drop,) = stack.poll(0.6)
    assert isinstance(drop, Drop) and drop.reason == "ttl_expired"


def test_stack_abort_frees_or_dequeues():
    """A comparison stack handles client aborts like the guard: dequeue or free the slot."""
    stack = ServerPriorityStack(make_config(slots=(1,)))
    for rid in range(2):
        stack.on_arrival(make_request(request_id=rid), 0.0)
    stack.poll(0.0)
    assert stack.finish(1, 0.1, "abort", "client_disconnected")
    assert stack.finish(0, 0.2, "abort", "client_disconnected")
    assert not stack.finish(0, 0.3, "abort", "again")
    assert (stack.num_in_flight, stack.num_queued) == (0, 0)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_stack_accounts_for_every_request_within_C(policy):
    """On the marquee, each stack ends every request exactly once and never runs more than
    C at a time (the checker's TERMINAL and SLOTS)."""
    run = simulate_once(marquee(), seed=3, policy=policy)
    report = check_trace(run.events)
    assert not [v for v in report.violations if v.prop in ("TERMINAL", "SLOTS")]
    assert report.num_requests == run.num_requests == sum(report.counts.values())


def test_the_liar_cannot_change_the_class_the_floor_is_drawn_from():
    """Under the guard, a lying learner leaves floor-entitled attainment whole and the trace
    passes every check; unguarded, the same liar's relabels change nothing either (it has no
    say in order), but nothing protects the floor from overload."""
    run = simulate_once(marquee(), seed=4, policy="guard", learner=lambda rng: Liar())
    report = check_trace(run.events)
    assert report.ok() and report.num_sf_late == 0
    admits = [e for e in run.events if e.kind is EventKind.ADMIT and e.cls is ASSURED]
    assert admits and all(e.entitled for e in admits)
