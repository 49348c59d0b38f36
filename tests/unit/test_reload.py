"""A reload of the core (docs/design.md §14): contracts govern from the next window, slots and queue
limits at once; the checker verifies each stretch of the log against its own
configuration, and catches a reload that changes an open window."""

from __future__ import annotations

import dataclasses

import pytest

from floorguard.analysis.checker import check_fleet, check_trace
from floorguard.core.contract import Contract, GuardConfig, WindowSchedule
from floorguard.core.dispatcher import SlotPool
from floorguard.core.events import EventKind
from floorguard.core.guard import Guard
from floorguard.errors import ConfigError
from floorguard.learners.adversaries import AlwaysAdmit
from floorguard.store import MemoryCreditStore
from tests.helpers import ASSURED, OPPORTUNISTIC, make_config, make_guard, make_request


def with_floor(config: GuardConfig, floor: int, **changes) -> GuardConfig:
    contracts = tuple(
        dataclasses.replace(c, floor=floor) if c.cls is ASSURED else c for c in config.contracts
    )
    return dataclasses.replace(config, contracts=contracts, **changes)


def admit(guard, at: float, *, tenant: str = "a95"):
    return guard.on_arrival(make_request(at=at, tenant=tenant), at)


def test_a_raised_floor_governs_from_the_next_window():
    events = []
    guard = make_guard(make_config(floor=2, slots=(8,)), events=events)
    assert [admit(guard, 0.1).entitled for _ in range(3)] == [True, True, False]
    assert guard.reconfigure(with_floor(guard.config, 5), 0.2) == 1
    assert guard.governs_from == 1.0
    assert not admit(guard, 0.3).entitled  # window 0 keeps B = 2
    assert [admit(guard, 1.1).entitled for _ in range(6)] == [True] * 5 + [False]
    assert guard.governs_from is None and guard.config.contracts[0].floor == 5
    reload = [e for e in events if e.kind is EventKind.CONFIG][1]
    assert (reload.at, reload.window) == (0.2, 1)
    report = check_trace(events, allow_open=True)
    assert report.ok(), report.violations[:3]


def test_a_lowered_floor_leaves_the_open_window_what_it_granted():
    events = []
    guard = make_guard(make_config(floor=4, slots=(8,)), events=events)
    assert [admit(guard, 0.1).entitled for _ in range(2)] == [True, True]
    guard.reconfigure(with_floor(guard.config, 1), 0.5)
    assert [admit(guard, 0.6).entitled for _ in range(3)] == [True, True, False]
    assert [admit(guard, 1.2).entitled for _ in range(2)] == [True, False]
    assert check_trace(events, allow_open=True).ok()


def test_a_charge_answered_after_its_window_ended_does_not_open_the_next_with_its_floor():
    """An arrival judged at 0.999 s under B = 8, its store call answered at 1.001 s (a busy
    event loop, a Redis round trip) after a reload lowered B to 2 from window 1: it is
    charged in window 0, where it was judged, so window 1 opens with B = 2 — once a window
    pins the floor of its first take, this charge landing in window 1 let the old floor
    govern all of window 1 (a flake of tests/integration/test_reload.py: 8 grants where 2
    govern)."""
    events = []
    guard = make_guard(make_config(floor=8, slots=(8,)), events=events)
    guard.reconfigure(with_floor(guard.config, 2), 0.5)
    late = guard.begin_arrival(make_request(at=0.999), 0.999)
    grant = guard.answer(late.need, 1.001)
    assert (grant.granted, grant.window_index) == (True, 0)
    guard.continue_arrival(late, 1.001, grant)
    assert [admit(guard, 1.1).entitled for _ in range(3)] == [True, True, False]
    assert check_trace(events, allow_open=True).ok()


def test_a_removed_tenant_finishes_what_it_has_in_flight_then_is_unknown():
    events = []
    guard = make_guard(make_config(floor=2, slots=(1,)), events=events)
    running = admit(guard, 0.1)
    (started,) = guard.poll(0.1)
    queued = admit(guard, 0.2)
    only_a10 = dataclasses.replace(guard.config, contracts=(Contract("a10", OPPORTUNISTIC, 1.0),))
    guard.reconfigure(only_a10, 0.3)
    guard.finish(started.request.request_id, 0.4, "complete")
    assert [d.request.request_id for d in guard.poll(0.4)] == [queued.request_id]
    guard.finish(queued.request_id, 0.5, "complete")
    late = admit(guard, 1.1)
    assert not late.admitted and late.reason == "unknown_tenant"
    assert running.entitled
    assert check_trace(events).ok()


def test_backends_keep_their_positions_a_removed_one_drains():
    events = []
    config = make_config(floor=4, slots=(1,))
    config = dataclasses.replace(config, backend_ids=("http://a",))
    guard = make_guard(config, events=events)
    admit(guard, 0.1)
    (first,) = guard.poll(0.1)
    assert first.backend == 0
    guard.reconfigure(
        dataclasses.replace(config, slots=(0, 2), backend_ids=("http://a", "http://b")), 0.2
    )
    for _ in range(3):
        admit(guard, 0.3)
    starts = guard.poll(0.3)
    assert [d.backend for d in starts] == [1, 1]  # the removed backend gets nothing new
    guard.finish(first.request.request_id, 0.4, "complete")
    assert guard.poll(0.4) == []  # its freed slot is not offered again
    guard.finish(starts[0].request.request_id, 0.5, "complete")
    assert [d.backend for d in guard.poll(0.5)] == [1]
    assert guard.in_flight_on(0) == 0
    report = check_trace(events, allow_open=True)
    assert report.ok(), report.violations[:3]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"schedule": WindowSchedule(2.0, 0.0)}, "schedule differs"),
        ({"slots": ()}, "at least one backend"),
        ({"slots": (0,)}, "at least one slot"),
    ],
)
def test_what_a_reload_cannot_change_is_refused_and_nothing_changes(change, says):
    guard = make_guard(make_config(floor=2, slots=(2,)))
    before = guard.config
    with pytest.raises(ConfigError, match=says):
        guard.reconfigure(dataclasses.replace(guard.config, **change), 0.1)
    assert guard.config is before and guard.governs_from is None


def test_a_backend_cannot_be_taken_out_of_its_position():
    config = dataclasses.replace(make_config(slots=(1, 1)), backend_ids=("http://a", "http://b"))
    guard = make_guard(config)
    with pytest.raises(ConfigError, match="keep their positions"):
        guard.reconfigure(dataclasses.replace(config, slots=(1,), backend_ids=("http://b",)), 0.1)


def test_a_second_reload_before_the_first_took_effect_replaces_it():
    events = []
    guard = make_guard(make_config(floor=2, slots=(8,)), events=events)
    guard.reconfigure(with_floor(guard.config, 5), 0.2)
    guard.reconfigure(with_floor(guard.config, 3), 0.4)
    assert [admit(guard, 1.1).entitled for _ in range(4)] == [True] * 3 + [False]
    assert check_trace(events, allow_open=True).ok()


def test_the_checker_catches_a_reload_that_changes_the_open_window():
    events = []
    guard = make_guard(make_config(floor=2, slots=(8,)), events=events)
    guard.reconfigure(with_floor(guard.config, 5), 0.2)
    tampered = [
        e._replace(window=0) if e.kind is EventKind.CONFIG and e.window else e for e in events
    ]
    report = check_trace(tampered, allow_open=True)
    assert [v.prop for v in report.violations] == ["AF"]
    assert "already open" in report.violations[0].message


def test_the_checker_holds_the_open_window_to_its_old_floor():
    """A log that granted the raised floor inside the window the reload happened in fails."""
    events = []
    guard = make_guard(make_config(floor=2, slots=(8,)), events=events)
    guard.reconfigure(with_floor(guard.config, 5), 0.2)
    for _ in range(3):
        admit(guard, 0.3)
    third = next(i for i, e in enumerate(events) if e.kind is EventKind.REJECT)
    events[third] = events[third]._replace(kind=EventKind.ADMIT, entitled=True, reason=None)
    report = check_trace(events, allow_open=True)
    assert report.violations and report.violations[0].prop == "AF"
    assert "beyond B" in report.violations[0].message


def test_a_fleet_mid_reload_agrees_on_the_floor_its_first_take_pinned():
    """Two replicas share a store; one reloads (B 2 → 4), the other has not yet. In the
    window after the reload the first take pins its floor: taken first by the reloaded
    replica, the window's floor is 4 for both (the one still on B = 2 grants up to 4,
    logging the pinned floor); taken first by the other, it is 2 for both. Either way
    `check_fleet` finds one floor per window."""
    for first, expected in ((0, [True] * 4 + [False]), (1, [True, True, False, False, False])):
        store = MemoryCreditStore()
        logs: list[list] = [[], []]
        guards = [
            Guard(
                make_config(floor=2, slots=(8,)),
                learner=AlwaysAdmit(),
                store=store,
                sink=log.append,
            )
            for log in logs
        ]
        guards[0].reconfigure(with_floor(guards[0].config, 4), 0.5)
        order = [first] * 2 + [1 - first] * 3
        got = [admit(guards[n], 1.1 + i / 100).entitled for i, n in enumerate(order)]
        assert got == expected
        decided = (EventKind.ADMIT, EventKind.DEMOTE, EventKind.REJECT)
        logged = [{e.floor for e in log if e.kind in decided} for log in logs]
        assert logged[first] == {None}  # judged against its own floor: nothing to note
        assert logged[1 - first] == {4 if first == 0 else 2}  # the pinned one, logged
        report = check_fleet(logs, allow_open=True)
        assert report.ok(), report.violations[:3]


def test_a_fleet_whose_replicas_judged_one_window_against_two_floors_fails_verify():
    """Without a store that pins (each replica its own counter, as two Redis would), the
    window after a partial reload is judged against 2 on one replica and 4 on the other:
    `check_fleet` says the replicas did not agree on one configuration."""
    logs: list[list] = [[], []]
    guards = [
        Guard(
            make_config(floor=2, slots=(8,)),
            learner=AlwaysAdmit(),
            store=MemoryCreditStore(),
            sink=log.append,
        )
        for log in logs
    ]
    guards[0].reconfigure(with_floor(guards[0].config, 4), 0.5)
    admit(guards[0], 1.1)
    admit(guards[1], 1.2)
    report = check_fleet(logs, allow_open=True)
    assert any("different floors [2, 4]" in v.message for v in report.violations)


def test_slot_pool_resize_counts_what_runs_over_a_lowered_capacity():
    pool = SlotPool((2,))
    pool.acquire()
    pool.acquire()
    pool.resize((1, 1))
    assert pool.num_free == 1 and pool.in_flight(0) == 2
    pool.release(0)
    assert pool.num_free == 1  # backend 0 still runs its capacity
    pool.release(0)
    assert pool.num_free == 2 and pool.acquire() in (0, 1)
    pool.set_available(1, False)
    pool.set_available(1, True)
    assert pool.num_free == 1
    with pytest.raises(ValueError, match="never remove"):
        pool.resize((1,))
