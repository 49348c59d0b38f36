from __future__ import annotations

import pytest

from floorguard.core.contract import ContractClass
from floorguard.core.events import (
    _WIRE,
    EventKind,
    TraceEvent,
    config_from_dict,
    config_to_dict,
    from_json,
    new_event,
    read_jsonl,
    to_json,
    write_jsonl,
)
from floorguard.errors import TraceError
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import marquee


def test_every_event_round_trips_through_jsonl(tmp_path):
    """to_json/from_json are inverse on a whole simulated trace, including the config."""
    events = simulate_once(marquee(duration_s=3.0), seed=1).events
    path = tmp_path / "t.jsonl"
    assert write_jsonl(events, str(path)) == len(events)
    assert list(read_jsonl(str(path))) == events
    assert config_from_dict(config_to_dict(marquee().guard_config())) == marquee().guard_config()


def test_wire_names_are_the_documented_ones():
    """The JSONL keys are the short names in docs/trace.md, and absent fields are omitted."""
    events = simulate_once(marquee(duration_s=1.0), seed=1).events
    admit = next(e for e in events if e.kind.value == "admit")
    assert set(__import__("json").loads(to_json(admit))) <= {
        "t",
        "event",
        "id",
        "tenant",
        "class",
        "window",
        "entitled",
        "deadline",
    }


def test_every_field_is_written_under_its_wire_name_and_read_back():
    """`to_json` names each field itself: an event with all of them set writes every wire
    name (a field added to `TraceEvent` and not to `to_json` fails here) and reads back."""
    full = TraceEvent(
        1.5, EventKind.PROPOSE, "r-1", "acme", ContractClass.ASSURED, 3, True, "why", 2, 9.5,
        16, 40, 30, 1.25, False, "opportunistic", 0.5, {"k": 1}, "m", 7,
    )  # fmt: skip
    assert all(value is not None for value in full)
    line = to_json(full)
    assert list(__import__("json").loads(line)) == list(_WIRE)
    assert from_json(line) == full


def test_the_fast_constructor_builds_the_event_the_named_tuple_builds():
    """`new_event` (the core's events, without the NamedTuple's interpreted `__new__`)
    takes TraceEvent's fields in its order, with its defaults: each field set alone, by
    keyword, gives what `TraceEvent` gives (a field added to one and not the other fails)."""
    import inspect  # noqa: PLC0415

    assert tuple(inspect.signature(new_event).parameters) == TraceEvent._fields
    assert new_event(1.0, EventKind.ARRIVE) == TraceEvent(1.0, EventKind.ARRIVE)
    values = (
        "r-1", "acme", ContractClass.ASSURED, 3, True, "why", 2, 9.5, 16, 40, 30, 1.25,
        False, "opportunistic", 0.5, {"k": 1}, "m", 7,
    )  # fmt: skip
    for name, value in zip(TraceEvent._fields[2:], values, strict=True):
        made = new_event(1.0, EventKind.PROPOSE, **{name: value})
        assert made == TraceEvent(1.0, EventKind.PROPOSE, **{name: value})
        assert type(made) is TraceEvent and getattr(made, name) == value


@pytest.mark.parametrize("line", ['{"t": 1}', "not json", '{"t":1,"event":"teleport"}'])
def test_bad_lines_raise_trace_error_with_line_number(line):
    """A malformed line names its line number."""
    with pytest.raises(TraceError, match="trace line 3"):
        from_json(line, 3)
