"""The doom gate (DR, SPEC §1 and §4.3): drop only what provably cannot finish in time.

With a service *lower* bound `L(ℓ) ≤ s`, "drop iff `now + L(ℓ) > D`" is doom-sound: a drop
witnesses infeasibility. An optional *upper* bound `U` adds a third state: `now + U ≤ D` is
surely in time, between the two is uncertain — and uncertain is dispatched, because only
the lower bound may justify a drop.
"""

from __future__ import annotations

from enum import StrEnum

from floorguard.core.contract import AffineEnvelope

__all__ = ["DoomGate", "DoomVerdict"]


class DoomVerdict(StrEnum):
    DISPATCH = "dispatch"
    UNCERTAIN = "uncertain"
    """Neither bound decides; dispatched (never dropped: that would break DR)."""
    DROP = "drop"


class DoomGate:
    def __init__(self, lower: AffineEnvelope | None, upper: AffineEnvelope | None = None) -> None:
        self.lower = lower
        self.upper = upper

    def check(self, deadline_at: float, num_output_tokens: int, now: float) -> DoomVerdict:
        if self.lower is not None and now + self.lower.at(num_output_tokens) > deadline_at:
            return DoomVerdict.DROP
        if self.upper is None or now + self.upper.at(num_output_tokens) <= deadline_at:
            return DoomVerdict.DISPATCH
        return DoomVerdict.UNCERTAIN
