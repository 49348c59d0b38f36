"""The doom gate (DR, docs/design.md §1 and §4.3): drop only what provably cannot finish in time.

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

    def bounds(
        self, num_output_tokens: int, prompt_lower: int = 0, prompt_upper: int = 0
    ) -> tuple[float | None, float | None]:
        """`(L(ℓ, p_lower), U(ℓ, p_upper))`, None where there is no envelope: computed once
        per admitted request (its ticket keeps them)."""
        lower, upper = self.lower, self.upper
        return (
            lower.at(num_output_tokens, prompt_lower) if lower is not None else None,
            upper.at(num_output_tokens, prompt_upper) if upper is not None else None,
        )

    def first_token_lower(self, prompt_lower: int = 0) -> float | None:
        """A lower bound on a request's time from dispatch to its first token: the lower
        envelope at ℓ = 0, its prefill (`L(0, p)`). None without an envelope, or with one
        that has no per-token term: a constant `L` bounds whole services only, and would
        call a first token doomed that can still come in time (docs/design.md §19)."""
        lower = self.lower
        if lower is None or lower.per_token_s <= 0:
            return None
        return lower.at(0, prompt_lower)

    @staticmethod
    def verdict(
        deadline_at: float, lower_s: float | None, upper_s: float | None, now: float
    ) -> DoomVerdict:
        """Drop iff `now + L > D`; dispatch when `now + U ≤ D` (or no `U`); else uncertain."""
        if lower_s is not None and now + lower_s > deadline_at:
            return DoomVerdict.DROP
        if upper_s is None or now + upper_s <= deadline_at:
            return DoomVerdict.DISPATCH
        return DoomVerdict.UNCERTAIN

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
        lower_s, upper_s = self.bounds(num_output_tokens, prompt_lower, prompt_upper)
        return self.verdict(deadline_at, lower_s, upper_s, now)
