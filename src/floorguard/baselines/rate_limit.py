"""`rate-limit-class` and `rate-limit-flat`: static token buckets in front of a FIFO backend.

Per class, each class has its own bucket; flat, one bucket caps all traffic. A request is
admitted iff its bucket holds a whole token; it never waits for one. Neither knows about
windows, deadlines or load — which is what the comparison shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from floorguard.baselines.server import Decision, ServerOrder, ServerStack
from floorguard.core.contract import Contract, ContractClass, GuardConfig
from floorguard.core.learner import Proposal
from floorguard.core.request import Request
from floorguard.core.surface import Sink
from floorguard.errors import require

__all__ = ["RateLimitStack", "TokenBucket"]


@dataclass
class TokenBucket:
    rate_per_s: float
    burst: float
    """Bucket size in requests; it starts full."""

    def __post_init__(self) -> None:
        require(self.rate_per_s >= 0, "rate_per_s", self.rate_per_s, "must be ≥ 0")
        require(self.burst >= 1, "burst", self.burst, "must be ≥ 1 (a whole request)")
        self._tokens = self.burst
        self._last_at: float | None = None

    def take(self, now: float) -> bool:
        if self._last_at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._last_at) * self.rate_per_s)
        self._last_at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class RateLimitStack(ServerStack):
    server_order = ServerOrder.FIFO

    def __init__(
        self,
        config: GuardConfig,
        *,
        buckets: Callable[[], dict[ContractClass, TokenBucket]] | None = None,
        flat: TokenBucket | None = None,
        sink: Sink | None = None,
        started_at: float = 0.0,
    ) -> None:
        super().__init__(config, sink=sink, started_at=started_at)
        require(
            (buckets is None) != (flat is None),
            "rate_limit",
            (buckets, flat),
            "give either per-class buckets or one flat bucket",
        )
        self._by_class = buckets() if buckets is not None else None
        self._flat = flat
        self.name = "rate-limit-flat" if flat is not None else "rate-limit-class"

    def _decide(
        self, request: Request, contract: Contract, now: float, proposal: Proposal | None
    ) -> Decision:
        bucket = self._flat if self._by_class is None else self._by_class[contract.cls]
        assert bucket is not None
        return Decision(None if bucket.take(now) else "rate_limited")
