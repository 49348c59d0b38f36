from __future__ import annotations

import pytest

from floorguard.sim.engine import Engine, Priority


def test_same_time_events_run_by_priority_then_scheduling_order():
    """The documented heap key (time, priority, seq) is the real order."""
    engine = Engine()
    seen = []
    record = lambda payload, now: seen.append((now, payload))  # noqa: E731
    engine.schedule(1.0, Priority.ARRIVAL, record, "arrival-1")
    engine.schedule(1.0, Priority.COMPLETION, record, "completion")
    engine.schedule(1.0, Priority.ARRIVAL, record, "arrival-2")
    engine.schedule(0.5, Priority.ARRIVAL, record, "early")
    engine.schedule(1.0, Priority.FIRST_TOKEN, record, "first-token")
    assert engine.run() == 5
    assert [p for _, p in seen] == ["early", "first-token", "completion", "arrival-1", "arrival-2"]
    assert engine.now == 1.0


def test_handlers_can_schedule_more_events_and_run_stops_at_until():
    """Events scheduled by handlers run in order; run(until) leaves later ones queued."""
    engine = Engine()
    seen = []

    def tick(n, now):
        seen.append(now)
        if n:
            engine.schedule(now + 1.0, Priority.ARRIVAL, tick, n - 1)

    engine.schedule(0.0, Priority.ARRIVAL, tick, 5)
    engine.run(until=2.5)
    assert seen == [0.0, 1.0, 2.0] and len(engine) == 1


def test_cannot_schedule_in_the_past():
    """Time only moves forward."""
    engine = Engine()
    engine.schedule(1.0, Priority.ARRIVAL, lambda p, n: engine.schedule(0.5, 0, print))
    with pytest.raises(ValueError, match="before now"):
        engine.run()


def test_engines_have_independent_sequence_counters():
    """seq is per engine (no state shared across engines)."""
    a, b = Engine(), Engine()
    a.schedule(0.0, 0, lambda p, n: None)
    b.schedule(0.0, 0, lambda p, n: None)
    assert a._heap[0][2] == b._heap[0][2] == 0
