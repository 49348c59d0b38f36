from __future__ import annotations

import pytest

from floorguard.clock import ManualClock, MonotonicClock


def test_manual_clock_moves_only_when_told_and_never_backwards():
    """advance() and jump() move it forward; a negative step or an earlier jump is refused."""
    clock = ManualClock(5.0)
    assert clock.now() == 5.0
    assert clock.advance(0.5) == 5.5
    assert clock.jump(7.0) == 7.0
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1.0)
    with pytest.raises(ValueError, match="earlier than now"):
        clock.jump(6.0)


def test_monotonic_clock_does_not_decrease():
    """The proxy's clock is monotonic."""
    clock = MonotonicClock()
    first = clock.now()
    assert clock.now() >= first
