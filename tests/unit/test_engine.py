from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def _trace_of(preload: bool, priority, times, spawned):
    """Run events at `times` (sorted), all of `priority`, through an engine, each handler
    scheduling its `spawned` follow-ups; the handled order, as `schedule` alone gives it or
    with the arrivals preloaded."""
    engine = Engine()
    seen = []

    def handle(payload, now):
        seen.append((now, payload))
        for k, (delay, then) in enumerate(spawned.get(payload, ())):
            engine.schedule(now + delay, then, handle, f"{payload}.{k}")

    names = [f"a{i}" for i in range(len(times))]
    if preload:
        engine.preload(priority, handle, times, names)
    else:
        for at, name in zip(times, names, strict=True):
            engine.schedule(at, priority, handle, name)
    engine.run(until=3.0)
    first = list(seen)
    engine.run()
    return first, seen, engine.num_handled, len(engine)


@given(
    priority=st.sampled_from(list(Priority)),
    times=st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 4.0]), max_size=12),
    spawns=st.lists(
        st.lists(
            st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from(list(Priority))),
            max_size=2,
        ),
        max_size=12,
    ),
)
def test_preloaded_events_run_exactly_as_if_each_was_scheduled(priority, times, spawns):
    """Preloading is an optimisation, not a second order: with ties in time and priority
    against events the handlers schedule, and across run(until), the handled sequence is
    the heap's."""
    times.sort()
    spawned = {f"a{i}": s for i, s in enumerate(spawns)}
    assert _trace_of(True, priority, times, spawned) == _trace_of(False, priority, times, spawned)


def test_preload_refuses_what_would_change_the_order():
    """Unsorted times, a length mismatch, and a preload after anything was scheduled, are
    refused."""
    engine = Engine()
    noop = lambda p, n: None  # noqa: E731
    with pytest.raises(ValueError, match="sorted"):
        engine.preload(Priority.ARRIVAL, noop, [1.0, 0.5], [1, 2])
    with pytest.raises(ValueError, match="2 times for 1 payloads"):
        engine.preload(Priority.ARRIVAL, noop, [1.0, 2.0], [1])
    engine.schedule(0.0, Priority.ARRIVAL, noop)
    with pytest.raises(ValueError, match="before any other"):
        engine.preload(Priority.ARRIVAL, noop, [1.0], [1])
    assert len(engine) == 1


def test_a_finished_simulation_is_freed_without_the_cyclic_collector():
    """A run's guard and its decision log go when the caller drops the run: no reference
    cycle (a `Serving` holding its driver's bound method was one) keeps them for the
    cyclic collector, whose later full passes then walk them (10 % more instructions per
    request on the traced simulator, docs/benchmarks.md)."""
    import gc  # noqa: PLC0415

    from floorguard.core.guard import Guard  # noqa: PLC0415
    from floorguard.sim.run import simulate_once  # noqa: PLC0415
    from floorguard.sim.scenarios import marquee  # noqa: PLC0415

    def guards() -> int:  # alive, by the collector's own list (a compiled Guard takes no weakref)
        return sum(1 for o in gc.get_objects() if type(o) is Guard)

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        before = guards()
        run = simulate_once(marquee(duration_s=5), seed=0, record=True)
        assert run.events and guards() == before + 1
        del run
        assert guards() == before
    finally:
        if enabled:
            gc.enable()
