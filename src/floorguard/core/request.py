"""The request as the core sees it: identity already bound, sizes already known."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Request", "RequestId"]

RequestId = int | str


@dataclass(slots=True)
class Request:
    """Built once by its driver and not changed after (every reader treats it so); not a
    frozen dataclass, whose generated `__init__` is interpreted Python even in a compiled
    build (≈ 9,000 instructions a request on the HTTP path: docs/benchmarks.md)."""

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

    def __init__(  # noqa: PLR0917
        self,
        request_id: RequestId,
        tenant: str,
        arrival_at: float,
        num_output_tokens: int,
        num_prompt_tokens: int = 0,
        min_prompt_tokens: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.tenant = tenant
        self.arrival_at = arrival_at
        self.num_output_tokens = num_output_tokens
        self.num_prompt_tokens = num_prompt_tokens
        self.min_prompt_tokens = min_prompt_tokens

    @property
    def prompt_tokens_lower(self) -> int:
        """The prompt tokens `L` may count: never more than the prompt really has."""
        return self.num_prompt_tokens if self.min_prompt_tokens is None else self.min_prompt_tokens
