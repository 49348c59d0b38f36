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
