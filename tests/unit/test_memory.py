"""The KV budget (SPEC §16, issue 27): a backend takes a request only while the reservations
of what it runs (metered prompt + output cap, in whole blocks) fit its KV cache. The first
waiting request waits for room and nothing smaller overtakes it; a request no cache can
ever hold is refused on arrival (`kv_excess`); `verify` checks the budget (MEMORY) and
finds a seeded violation; and where memory never binds, a run is exactly what it was."""

from __future__ import annotations

from dataclasses import replace

from floorguard.analysis.checker import check_trace
from floorguard.analysis.records import fold_trace
from floorguard.core.events import EventKind, TraceEvent
from floorguard.core.guard import RejectReason
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import marquee
from tests.helpers import make_config, make_guard, make_request


def _guard(events, kv=(64,)):
    slots = (2,) * len(kv)
    config = replace(make_config(floor=10, slots=slots, deadline_s=10.0), kv_tokens=kv)
    return make_guard(config, events=events)


def test_the_first_waiting_request_waits_for_room_and_nothing_smaller_overtakes_it():
    events: list[TraceEvent] = []
    guard = _guard(events)
    first = make_request(tokens=48, request_id=1)  # 48 of the 64 tokens
    guard.on_arrival(first, 0.0)
    assert [d.request.request_id for d in guard.poll(0.0)] == [1]
    guard.on_arrival(make_request(tokens=40, request_id=2), 0.1)  # 48 reserved: no room
    guard.on_arrival(make_request(assured=False, tokens=8, request_id=3), 0.1)  # 16: fits
    assert guard.poll(0.1) == []  # a slot is free, but the entitled one waits first
    assert guard.finish(1, 1.0, "complete")
    assert [d.request.request_id for d in guard.poll(1.0)] == [2, 3]  # 48 + 16 = 64
    report = check_trace(events, allow_open=True)
    assert report.ok(), report.violations[:3]


def test_a_request_no_kv_cache_can_hold_is_refused_on_arrival():
    events: list[TraceEvent] = []
    guard = _guard(events, kv=(64, None))  # the second backend is not budgeted
    assert guard.on_arrival(make_request(tokens=200), 0.0).admitted
    guard = _guard(events := [], kv=(64, 32))
    refused = guard.on_arrival(make_request(tokens=60, prompt=8), 0.0)  # 68 → 80 in blocks
    assert (refused.admitted, refused.reason) == (False, RejectReason.KV_EXCESS)
    assert guard.on_arrival(make_request(tokens=40, prompt=8), 0.0).entitled  # 48: fits
    assert check_trace(events, allow_open=True).ok()  # not owed from the floor


def test_verify_finds_a_seeded_memory_violation():
    """Two 32-token requests in flight together on one backend, and a log whose config says
    that backend holds 48 KV tokens: MEMORY, at the second start."""
    events: list[TraceEvent] = []
    guard = make_guard(make_config(floor=10, slots=(2,), deadline_s=10.0), events=events)
    for rid in (1, 2):
        guard.on_arrival(make_request(tokens=32, request_id=rid), 0.0)
    guard.poll(0.0)
    for rid in (1, 2):
        guard.finish(rid, 0.5, "complete")
    config = events[0]
    assert config.kind is EventKind.CONFIG
    seeded = [config._replace(data={**config.data, "kv_tokens": [48]}), *events[1:]]
    assert check_trace(events).ok()
    report = check_trace(seeded)
    assert [(v.prop, v.request_id) for v in report.violations] == [("MEMORY", 2)]


def test_where_memory_never_binds_the_run_is_unchanged():
    """The marquee with every backend's KV cache far larger than C requests need: the same
    seeded run, request for request, as without a budget."""
    plain = marquee()
    budgeted = replace(plain, kv_tokens=(1_000_000,))
    for seed in (0, 1):
        runs = [fold_trace(simulate_once(s, seed=seed).events).records for s in (plain, budgeted)]
        assert [(r.request_id, r.outcome, r.reason, r.ended_at) for r in runs[0]] == [
            (r.request_id, r.outcome, r.reason, r.ended_at) for r in runs[1]
        ]
