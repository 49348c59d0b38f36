"""The request as the core sees it: identity already bound, sizes already known."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Request", "RequestId"]

RequestId = int | str


@dataclass(frozen=True, slots=True)
class Request:
    request_id: RequestId
    tenant: str
    """The authenticated tenant; its contract fixes the class before any learner runs."""
    arrival_at: float
    num_output_tokens: int
    """The output cap ℓ (`max_tokens`); the service envelopes are functions of it."""
    num_prompt_tokens: int = 0
    """The prompt's tokens as metered: exact, or an upper bound where the driver could only
    bound them (the HTTP edge without a tokenizer, design §12). The meter and `s_max` use it."""
    min_prompt_tokens: int | None = None
    """A lower bound on the prompt's tokens where `num_prompt_tokens` is not exact (None: it
    is exact). The doom gate's `L` uses this one, so a drop stays a proof (DR)."""

    @property
    def prompt_tokens_lower(self) -> int:
        """The prompt tokens `L` may count: never more than the prompt really has."""
        return self.num_prompt_tokens if self.min_prompt_tokens is None else self.min_prompt_tokens
