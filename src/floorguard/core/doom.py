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

    def check(
        self,
        deadline_at: float,
        num_output_tokens: int,
        now: float,
        *,
        prompt_lower: int = 0,
        prompt_upper: int = 0,
    ) -> DoomVerdict:
        """`prompt_lower` / `prompt_upper`: bounds on the prompt's tokens, for `L` and `U`."""
        if self.lower is not None and self.is_doomed(
            deadline_at, num_output_tokens, now, prompt_lower
        ):
            return DoomVerdict.DROP
        if (
            self.upper is None
            or now + self.upper.at(num_output_tokens, prompt_upper) <= deadline_at
        ):
            return DoomVerdict.DISPATCH
        return DoomVerdict.UNCERTAIN

    def is_doomed(
        self, deadline_at: float, num_output_tokens: int, now: float, prompt_lower: int = 0
    ) -> bool:
        """`now + L(ℓ, p) > D`: provably too late (False without a lower envelope)."""
        lower = self.lower
        return lower is not None and now + lower.at(num_output_tokens, prompt_lower) > deadline_at

    def doomed_after(self, deadline_at: float, num_output_tokens: int, prompt_lower: int) -> float:
        """The instant after which the request is doomed, `D − L(ℓ, p)` (inf: never)."""
        if self.lower is None:
            return float("inf")
        return deadline_at - self.lower.at(num_output_tokens, prompt_lower)
