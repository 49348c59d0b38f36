"""The request protocol refuses misuse (issue 25.5): random sequences of arrivals, polls and
ends — misuse included (completing or failing a queued request, ending twice, ending a
request never admitted, answering a decided arrival again) — show every misuse raising a
`ProtocolError` at the call site with nothing changed, `finish` idempotent, and every
request ending exactly once in a decision log that `check_trace` passes."""

from __future__ import annotations

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
    ),
    max_size=60,
)


def _snapshot(guard):
    return guard.num_queued, guard.num_in_flight, len(guard._queued), dict(guard.stats.per_class)


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


def _end(guard, rid, op, now):
    """One `finish`, misuse or not; True if it ended the request."""
    queued, in_flight = rid in guard._queued, guard.in_flight_request(rid) is not None
    before = _snapshot(guard)
    if op == "bogus" or (queued and op != "abort"):
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
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_misuse_raises_and_every_request_ends_once(ops):
    events: list = []
    guard = make_guard(make_config(floor=2, slots=(2,)), events=events)
    now, ids, decided, ended = 0.0, [], [], set()
    for op, arg in ops:
        now += 0.01
        if op == "arrive":
            pending = _arrive(guard, arg, now)
            ids.append(pending.request.request_id)
            decided.append(pending)
            if not pending.admission.admitted:
                ended.add(pending.request.request_id)
        elif op == "poll":
            ended |= {d.request.request_id for d in guard.poll(now) if not isinstance(d, Dispatch)}
        elif op == "answer_again" and decided:
            _answer_again(guard, decided[arg % len(decided)], now)
        elif op != "answer_again":
            rid = ids[arg % len(ids)] if ids and arg < 30 else f"never-{arg}"
            if _end(guard, rid, op, now):
                ended.add(rid)
    for rid in ids:  # the driver's last exit: end whatever is still held
        if guard.finish(rid, now + 1, "abort", "shutdown"):
            ended.add(rid)
    assert ended == set(ids)
    terminal = [e.request_id for e in events if e.kind in TERMINAL_KINDS]
    assert sorted(terminal) == sorted(ids)  # exactly one terminal outcome each
    report = check_trace(events)
    assert report.ok(), report.violations[:3]
