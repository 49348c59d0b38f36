"""The guard's invariants for arbitrary arrivals, completions, failures, aborts and an
adversarial learner (docs/design.md §1, §4): AF in every window, no surplus start while an entitled
request waits, never more than C in flight, DR soundness, one terminal outcome each."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floorguard.analysis.checker import check_trace
from floorguard.core.contract import CapacityAction, ContractClass, DispatchOrder, MeterKind
from floorguard.core.events import TERMINAL_KINDS, EventKind
from floorguard.core.guard import Dispatch, Drop, Guard
from floorguard.core.request import Request
from floorguard.core.surface import StoreCall
from floorguard.store import MemoryCreditStore
from tests.strategies import (
    LearnerFaultError,
    answers,
    configs,
    operations,
    operations_with_expire,
)


class Adversary:
    name = "adversary"

    def __init__(self, script):
        self.script = script
        self.calls = 0

    def propose(self, request, cls, load, now):
        answer = self.script[self.calls % len(self.script)]
        self.calls += 1
        if isinstance(answer, LearnerFaultError):
            raise answer
        return answer() if callable(answer) else answer


def _answered_by_driver(guard, store, request, now):
    """Arrival with the driver answering: the store call against `store`, the learner ask
    through the guard's learner; the guard asks the learner only for surplus requests."""
    pending = guard.begin_arrival(request, now)
    while (need := pending.need) is not None:
        if isinstance(need, StoreCall):
            answer = store.acquire(
                need.key, need.weight, need.capacity, guard.config.schedule, now, floor=need.floor
            )
        else:
            assert need.cls is not ContractClass.ASSURED or pending.demoted, "asked for a floor"
            answer = guard.answer(need, now)
        pending = guard.continue_arrival(pending, now, answer)
    return pending.admission


def _end_one(guard, op, now):
    """A complete / fail / abort op: on the request its pick selects, if there is one."""
    pick = op[2]
    if op[0] == "abort_queued" and guard._queued:
        ids = sorted(guard._queued)
        assert guard.finish(ids[pick % len(ids)], now, "abort", "client_disconnected")
    elif guard._in_flight:
        ids = sorted(guard._in_flight)
        rid = ids[pick % len(ids)]
        if op[0] == "complete":
            guard.finish(rid, now, "complete")
        elif op[0] == "fail":
            guard.finish(rid, now, "fail", "upstream_error")
        else:
            guard.finish(rid, now, "abort", "client_disconnected")


def drive(config, script, ops, prefetch=False, timer_from_start=False):
    """Run the ops through a guard, checking per-step invariants; drain at the end. With
    `prefetch` the driver answers each need itself (`begin_arrival` / `continue_arrival`),
    as the HTTP guard does with Redis and the learner service: the same decisions. With
    `timer_from_start` the doom timer is asked for before the first arrival (the proxy's
    pump), else only at the first `expire` op (built then from what is queued)."""
    events = []
    store = MemoryCreditStore()
    guard = Guard(config, learner=Adversary(script), sink=events.append, store=store)
    now, next_id = 0.0, 0
    if timer_from_start:
        assert guard.next_doom_at() is None

    def check_drops(decisions):
        for d in decisions:
            if isinstance(d, Drop):
                lower = config.lower_envelope
                assert lower is not None, "dropped without a lower envelope"
                request = d.request
                deadline, first_by = guard_deadlines[request.request_id]
                doomed = now + lower.at(request.num_output_tokens) > deadline
                first = lower.per_token_s > 0 and now + lower.at(0, request.num_prompt_tokens)
                assert doomed or first > first_by, "unsound drop"

    def poll():
        decisions = guard.poll(now)
        check_drops(decisions)
        if config.dispatch is DispatchOrder.ASSURED_FIRST and any(
            isinstance(d, Dispatch) and not d.entitled for d in decisions
        ):
            assert guard.num_queued_entitled == 0, "surplus started while entitled waited"
        for b, c in enumerate(config.slots):
            assert guard.in_flight_on(b) <= c, "more than C in flight"

    guard_deadlines = {}
    for op in ops:
        now += op[1]
        if op[0] == "arrive":
            _, _, tenant, tokens, prompt = op
            request = Request(next_id, tenant, now, tokens, prompt)
            next_id += 1
            if prefetch:
                admission = _answered_by_driver(guard, store, request, now)
            else:
                admission = guard.on_arrival(request, now)
            ttft = getattr(guard.contract_of(tenant), "ttft_budget_s", None)
            first_by = now + ttft if ttft is not None else float("inf")
            guard_deadlines[request.request_id] = (admission.deadline_at, first_by)
        elif op[0] == "expire":
            check_drops(guard.expire(now))
            next_at = guard.next_doom_at()
            assert next_at is None or next_at >= now, "a doomed request left queued"
        else:
            _end_one(guard, op, now)
        poll()
    while guard.num_in_flight or guard.num_queued:
        now += 0.1
        for rid in sorted(guard._in_flight):
            guard.finish(rid, now, "complete")
        poll()
    return guard, events, next_id


def assert_af_per_window(config, events):
    """Count meter: each (tenant, window) admits min(B, offered) from the floor — or, under
    the lower-floor capacity action, refuses the difference explicitly as floor_lowered."""
    if config.meter is not MeterKind.COUNT:
        return
    floors = {c.tenant: c.floor for c in config.contracts if c.assured}
    offered, entitled = Counter(), Counter()
    for e in events:
        kv = config.kv_reservation(e.num_prompt_tokens or 0, e.num_output_tokens or 0)
        fits = config.kv_fits_somewhere(kv)  # else refused before the floor (kv_excess)
        if e.kind is EventKind.ARRIVE and e.tenant in floors and fits:
            offered[(e.tenant, config.schedule.index_at(e.at))] += 1
        if e.kind is EventKind.ADMIT and e.entitled:
            entitled[(e.tenant, e.window)] += 1
        if e.kind is EventKind.REJECT and e.reason == "floor_lowered":
            assert config.capacity_action is CapacityAction.LOWER_FLOOR
            entitled[(e.tenant, e.window)] += 1
    for key, n in offered.items():
        assert entitled[key] == min(floors[key[0]], n), key


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=configs(),
    script=st.lists(answers, min_size=1, max_size=6),
    ops=operations,
    prefetch=st.booleans(),
)
def test_guard_invariants_hold_for_any_arrivals_and_any_learner(config, script, ops, prefetch):
    guard, events, num_offered = drive(config, script, ops, prefetch)
    assert_af_per_window(config, events)
    terminal = Counter(e.request_id for e in events if e.kind in TERMINAL_KINDS)
    assert len(terminal) == num_offered and set(terminal.values()) <= {1}
    report = check_trace(events)
    assert report.ok(), report.violations[:3]
    assert guard.backlog.backlog == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), script=st.lists(answers, min_size=1, max_size=6), ops=operations)
def test_a_driver_answering_the_needs_makes_the_same_decisions(config, script, ops):
    """One decision path: the driver that answers the store call and the learner ask itself
    (the HTTP guard) writes the same decision log as `on_arrival` (the simulator)."""
    _, by_guard, _ = drive(config, script, ops, prefetch=False)
    _, by_driver, _ = drive(config, script, ops, prefetch=True)
    assert by_driver == by_guard


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=configs(), script=st.lists(answers, min_size=1, max_size=6), ops=operations_with_expire
)
def test_the_doom_timer_drops_alike_whenever_it_is_first_asked_for(config, script, ops):
    """The doom timer is built at the first `next_doom_at` / `expire`: a guard asked from
    the start and one asked only when a timer fires write the same decision log, every drop
    sound and none left doomed in the queue after `expire`."""
    _, from_start, num_offered = drive(config, script, ops, timer_from_start=True)
    _, when_asked, _ = drive(config, script, ops)
    assert when_asked == from_start
    terminal = Counter(e.request_id for e in from_start if e.kind in TERMINAL_KINDS)
    assert len(terminal) == num_offered and set(terminal.values()) <= {1}
    report = check_trace(from_start)
    assert report.ok(), report.violations[:3]


_slot_ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["acquire", "acquire", "release", "down", "up", "acquire_on", "hold", "resize"]
        ),
        st.integers(0, 127),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(slots=st.lists(st.integers(0, 4), min_size=2, max_size=80), ops=_slot_ops)
def test_the_slot_buckets_choose_as_the_scan_of_every_backend_did(slots, ops):
    """`SlotPool.acquire` keeps its choice in buckets by free count (it does not grow with
    the backends); it must pick what the scan it replaced picked — the available backend
    with the most free slots, the lowest index on a tie — through any releases, health
    changes, hold-offs, direct takes and reloads that resize (more than 64 backends
    included), so dispatch order (and every experiment table) is unchanged."""
    from floorguard.core.dispatcher import SlotPool  # noqa: PLC0415  # only this test

    pool = SlotPool(tuple(slots))
    for op, at in ops:
        b = at % len(pool.capacity)
        free, up = pool._free, pool._available
        if op == "acquire" and pool.num_free > 0:
            expected = max(range(len(free)), key=lambda i: free[i] if up[i] else -1)
            assert pool.acquire() == expected
        elif op == "release" and pool.in_flight(b) > 0:
            pool.release(b)
        elif op in ("down", "up"):
            pool.set_available(b, op == "up")
        elif op == "acquire_on" and free[b] > 0:
            pool.acquire_on(b)
        elif op == "hold":
            pool.hold_off(b, 0.0, 1.0, 1.0)
            if at % 2:
                pool.lift(2.0)
        elif op == "resize":  # new capacities, a backend appended on odd `at`
            grown = tuple((c + at) % 6 for c in pool.capacity)
            pool.resize(grown + ((at % 4,) if at % 2 else ()))
            free, up = pool._free, pool._available
        assert pool.num_free == sum(max(0, f) for f, u in zip(free, up, strict=True) if u)
