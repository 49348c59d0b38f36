"""Tumbling windows on a shared epoch (docs/design.md §1, §3): the arithmetic below both the core
(the meter, the monitors) and the credit stores, which share it and import nothing else."""

from __future__ import annotations

import math
from dataclasses import dataclass

from floorguard.errors import require

__all__ = ["WindowSchedule"]


@dataclass(frozen=True, slots=True)
class WindowSchedule:
    """Tumbling windows `I_k = [origin_at + k·W, origin_at + (k+1)·W)` (docs/design.md §1, §3)."""

    window_s: float = 1.0
    """Window length `W` in seconds."""
    origin_at: float = 0.0
    """The shared epoch `t0`; the contract and the guard must agree on it."""

    def __post_init__(self) -> None:
        require(
            math.isfinite(self.window_s) and self.window_s > 0,
            "window_s",
            self.window_s,
            "must be a finite number of seconds > 0",
        )
        require(math.isfinite(self.origin_at), "origin_at", self.origin_at, "must be finite")

    def index_at(self, at: float) -> int:
        """Window index `k = floor((at − t0) / W)`."""
        return math.floor((at - self.origin_at) / self.window_s)

    def start_of(self, index: int) -> float:
        return self.origin_at + index * self.window_s
