"""The hand-off measure of `floorguard bench handoff`, on streams whose timings are known."""

from __future__ import annotations

import pytest

from floorguard.bench.backlog import Stream
from floorguard.bench.handoff import handoffs_s


def _stream(sent: float, first: float, done: float) -> Stream:
    return Stream(sent, [first, (first + done) / 2, done])


def test_a_waiting_request_hands_off_from_the_completion_that_freed_its_slot():
    """Two slots, three clients: the first two start at once and have no hand-off; the
    third was sent at 0.0 and starts 20 ms after the first completion at 1.0; the first
    client's next request, sent at 1.0 when the other two were running, starts 30 ms after
    the next completion at 1.5."""
    streams = [
        _stream(0.0, 0.05, 1.0),
        _stream(0.0, 0.05, 1.5),
        _stream(0.0, 1.02, 2.0),
        _stream(1.001, 1.53, 2.5),
    ]
    assert handoffs_s(streams, slots=2) == pytest.approx([0.02, 0.03])


def test_a_request_that_found_a_free_slot_has_no_hand_off():
    """A request whose first token came before any completion after its send did not
    wait for a slot: it is not counted."""
    streams = [_stream(0.0, 0.05, 1.0), _stream(0.2, 0.25, 1.2), _stream(0.3, 0.35, 1.1)]
    assert handoffs_s(streams, slots=2) == []
