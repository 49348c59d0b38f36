"""The core's side of the HTTP edge (docs/design.md §12): doom timers, surplus queue limits,
re-placement after an unreachable backend, unavailable backends, prompt-aware envelopes."""

from __future__ import annotations

from dataclasses import replace

from floorguard.analysis.checker import check_trace
from floorguard.core.contract import AffineEnvelope, DispatchOrder, QueueLimits
from floorguard.core.events import EventKind
from floorguard.core.guard import Dispatch, Drop, RejectReason
from tests.helpers import make_config, make_guard, make_request

LOWER = AffineEnvelope(0.3, 0.01)


def test_a_queued_request_is_dropped_the_moment_it_is_doomed_not_when_a_slot_frees():
    """`next_doom_at` is D − L(ℓ); `expire` before it drops nothing, just after it drops."""
    guard = make_guard(make_config(slots=(1,), deadline_s=1.0, lower=LOWER))
    guard.on_arrival(make_request(request_id=0, tokens=10), 0.0)
    guard.on_arrival(make_request(request_id=1, tokens=10), 0.0)
    guard.poll(0.0)  # 0 runs, 1 waits
    assert guard.next_doom_at() == 1.0 - LOWER.at(10)
    assert guard.expire(0.59) == []
    (drop,) = guard.expire(0.61)
    assert isinstance(drop, Drop) and drop.request.request_id == 1
    assert guard.num_queued == 0 and guard.next_doom_at() is None


def test_the_doom_timer_uses_the_prompts_lower_bound_only():
    """L counts the prompt's certain tokens (`min_prompt_tokens`), not its metered bound."""
    lower = AffineEnvelope(0.3, 0.0, per_prompt_token_s=0.001)
    guard = make_guard(make_config(slots=(1,), deadline_s=1.0, lower=lower))
    guard.on_arrival(make_request(request_id=0), 0.0)
    bounded = replace(make_request(request_id=1, prompt=500), min_prompt_tokens=0)
    guard.on_arrival(bounded, 0.0)
    guard.poll(0.0)
    assert guard.next_doom_at() == 0.7  # not 0.2: the 500 are only an upper bound


def test_surplus_over_its_queue_limit_is_refused_and_entitled_never_is():
    """With room for one waiting surplus request, the second is `queue_full`; floor-entitled
    requests are admitted however many wait."""
    config = replace(make_config(floor=5, slots=(1,)), queue_limits=QueueLimits(opportunistic=1))
    guard = make_guard(config)
    guard.on_arrival(make_request(assured=False, request_id=0), 0.0)
    second = guard.on_arrival(make_request(assured=False, request_id=1), 0.0)
    assert second.reason == RejectReason.QUEUE_FULL
    assert all(guard.on_arrival(make_request(request_id=i), 0.0).entitled for i in range(2, 7))
    guard.poll(0.0)  # the opportunistic one waits behind the assured; then frees its place
    guard.finish(0, 0.1, "abort", "client_disconnected")
    assert guard.on_arrival(make_request(assured=False, request_id=9), 0.2).admitted


def test_per_tenant_limit_counts_one_tenants_waiting_surplus():
    config = replace(make_config(slots=(1,)), queue_limits=QueueLimits(per_tenant=2))
    guard = make_guard(config)
    decisions = [guard.on_arrival(make_request(assured=False, request_id=i), 0.0) for i in range(3)]
    assert [d.admitted for d in decisions] == [True, True, False]


def test_requeue_puts_the_request_back_in_its_old_place_and_the_log_verifies():
    """A dispatched request whose backend was unreachable frees its slot and starts again
    before everything admitted after it; the checker accepts the `requeue` event."""
    events: list = []
    for order in DispatchOrder:
        events.clear()
        guard = make_guard(make_config(floor=3, slots=(1, 1), dispatch=order), events=events)
        for i in range(3):
            guard.on_arrival(make_request(request_id=i), 0.0)
        first, _ = guard.poll(0.0)
        assert isinstance(first, Dispatch) and first.request.request_id == 0
        guard.requeue(0, 0.01)
        assert guard.in_flight_on(first.backend) == 0
        guard.finish(1, 0.02, "complete")
        started = [d.request.request_id for d in guard.poll(0.02)]
        assert started == [0, 2]  # 0 again, ahead of 2, which was admitted after it
        guard.finish(0, 0.5, "complete")
        guard.finish(2, 0.9, "complete")
        assert EventKind.REQUEUE in [e.kind for e in events]
        assert check_trace(events).ok(), check_trace(events).violations


def test_an_unavailable_backend_gets_no_request_until_it_is_back():
    guard = make_guard(make_config(floor=4, slots=(2, 2)))
    guard.set_backend_available(0, False)
    for i in range(4):
        guard.on_arrival(make_request(request_id=i), 0.0)
    assert {d.backend for d in guard.poll(0.0)} == {1}
    assert guard.num_queued == 2
    guard.set_backend_available(0, True)
    assert {d.backend for d in guard.poll(0.1)} == {0}


def test_a_doomed_drop_beside_a_waiting_entitled_request_is_no_order_violation():
    """The doom timer may drop a surplus request while an entitled one waits (a drop is not
    a start); the checker holds ORDER to starts only."""
    events: list = []
    guard = make_guard(make_config(slots=(1,), deadline_s=1.0, lower=LOWER), events=events)
    guard.on_arrival(make_request(request_id=0), 0.0)
    guard.on_arrival(make_request(assured=False, request_id=1, tokens=1), 0.0)
    guard.poll(0.0)
    guard.on_arrival(make_request(request_id=2, tokens=1, at=0.5), 0.5)
    assert [d.request.request_id for d in guard.expire(0.7)] == [1]
    guard.finish(0, 0.8, "complete")
    guard.poll(0.8)
    guard.finish(2, 1.2, "complete")
    assert check_trace(events).ok()


def test_max_output_tokens_is_the_largest_cap_L_fits():
    assert LOWER.max_output_tokens(0.5) == 20
    assert LOWER.max_output_tokens(0.305) == 0
    assert AffineEnvelope(0.1, 0.0).max_output_tokens(1.0) > 10**9


def test_a_requeued_request_is_still_dropped_the_moment_it_is_doomed():
    """The doom timer keeps watching a request placed again after its backend failed."""
    guard = make_guard(make_config(slots=(1,), deadline_s=1.0, lower=LOWER))
    guard.on_arrival(make_request(request_id=0, tokens=10), 0.0)
    guard.poll(0.0)
    assert guard.next_doom_at() is None  # running: nothing queued to watch
    guard.set_backend_available(0, False)
    guard.requeue(0, 0.1)
    assert guard.next_doom_at() == 1.0 - LOWER.at(10)
    assert [d.request.request_id for d in guard.expire(0.61)] == [0]
