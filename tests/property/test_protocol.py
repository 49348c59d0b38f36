"""The request protocol refuses misuse: random sequences of arrivals, polls,
lease answers and ends — misuse included (completing or failing a queued request, ending
twice, ending a request never admitted, answering a decided arrival again; on leased slots,
answering a lease no start asked for or one answered already, completing a start whose
lease is not answered) — show every misuse raising a `ProtocolError` at the call site with
nothing changed, `finish` idempotent, and every request ending exactly once in a decision
log that `check_trace` passes."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floorguard.analysis.checker import check_trace
from floorguard.core.events import TERMINAL_KINDS
from floorguard.core.guard import Dispatch
from floorguard.errors import ProtocolError
from floorguard.store import Grant
from tests.helpers import make_config, make_guard, make_request

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.booleans()),
        st.tuples(st.just("poll"), st.just(None)),
        st.tuples(
            st.sampled_from(["complete", "fail", "abort", "bogus"]),
            st.integers(0, 40),  # which id: any seen, or one never admitted
        ),
        st.tuples(st.just("answer_again"), st.integers(0, 40)),
        st.tuples(st.sampled_from(["grant", "deny"]), st.integers(0, 40)),
    ),
    max_size=60,
)


def _snapshot(guard):
    held = dict(guard._slots.held_until)
    stats = copy.deepcopy(guard.stats)  # values, not the live objects
    return guard.num_queued, guard.num_in_flight, len(guard._queued), stats, held


def _arrive(guard, assured, now):
    pending = guard.begin_arrival(make_request(assured=assured, at=now), now)
    while pending.need is not None:
        pending = guard.continue_arrival(pending, now, guard.answer(pending.need, now))
    return pending


def _answer_again(guard, pending, now):
    before = _snapshot(guard)
    with pytest.raises(ProtocolError, match="already decided"):
        guard.continue_arrival(pending, now, Grant(True, 0, 1))
    assert _snapshot(guard) == before


def _poll(guard, now, leased, ended, leasing):
    for d in guard.poll(now):
        if not isinstance(d, Dispatch):
            ended.add(d.request.request_id)
            continue
        assert d.lease is leased
        if leased:
            leasing.add(d.request.request_id)


def _lease(guard, rid, op, now, leasing):
    """One lease answer, misuse or not (`leasing`: the starts whose lease is unanswered,
    as the test saw them in `poll`'s `Dispatch.lease`)."""
    answer = guard.lease_granted if op == "grant" else guard.lease_denied
    if rid not in leasing:
        before = _snapshot(guard)
        with pytest.raises(ProtocolError):
            answer(rid, now)
        assert _snapshot(guard) == before
        return
    answer(rid, now)
    leasing.discard(rid)
    assert (guard.in_flight_request(rid) is not None) is (op == "grant")  # denied: it waits


def _end(guard, rid, op, now, leasing):
    """One `finish`, misuse or not; True if it ended the request."""
    queued, in_flight = rid in guard._queued, guard.in_flight_request(rid) is not None
    before = _snapshot(guard)
    if op == "bogus" or (queued and op != "abort") or (op == "complete" and rid in leasing):
        with pytest.raises(ProtocolError):
            guard.finish(rid, now, op, "test")
        assert _snapshot(guard) == before
        return False
    assert guard.finish(rid, now, op, "test") is (queued or in_flight)
    if not (queued or in_flight):
        assert _snapshot(guard) == before  # ended already, or never admitted: no change
        return False
    assert not guard.holds(rid)
    assert guard.finish(rid, now, op, "test") is False  # idempotent
    leasing.discard(rid)
    return True


@pytest.mark.parametrize("leased", [False, True], ids=["own_slots", "leased_slots"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_misuse_raises_and_every_request_ends_once(leased, ops):
    events: list = []
    config = dataclasses.replace(make_config(floor=2, slots=(2, 1)), slot_leases=leased)
    guard = make_guard(config, events=events)
    now, ids, decided, ended, leasing = 0.0, [], [], set(), set()
    for op, arg in ops:
        now += 0.01
        if op == "arrive":
            pending = _arrive(guard, arg, now)
            ids.append(pending.request.request_id)
            decided.append(pending)
            if not pending.admission.admitted:
                ended.add(pending.request.request_id)
        elif op == "poll":
            _poll(guard, now, leased, ended, leasing)
        elif op == "answer_again":
            if decided:
                _answer_again(guard, decided[arg % len(decided)], now)
        else:
            rid = ids[arg % len(ids)] if ids and arg < 30 else f"never-{arg}"
            if op in ("grant", "deny"):
                _lease(guard, rid, op, now, leasing)
            elif _end(guard, rid, op, now, leasing):
                ended.add(rid)
    for rid in ids:  # the driver's last exit: end whatever is still held
        if guard.finish(rid, now + 1, "abort", "shutdown"):
            ended.add(rid)
    assert ended == set(ids)
    terminal = [e.request_id for e in events if e.kind in TERMINAL_KINDS]
    assert sorted(terminal) == sorted(ids)  # exactly one terminal outcome each
    report = check_trace(events)
    assert report.ok(), report.violations[:3]
