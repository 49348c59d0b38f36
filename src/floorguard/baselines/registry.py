"""Stacks by `--policy` name. `guard` and `gated-fifo` are floorguard's own `Guard`; the
rest are the comparison stacks of docs/design.md §7, all behind the same driver surface."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from floorguard.baselines.flow_control import FlowControlOptions, FlowControlStack
from floorguard.baselines.rate_limit import RateLimitStack, TokenBucket
from floorguard.baselines.server_priority import ServerPriorityStack
from floorguard.baselines.unguarded import UnguardedStack
from floorguard.core.contract import ContractClass, DispatchOrder, GuardConfig
from floorguard.core.guard import Guard
from floorguard.core.learner import Learner
from floorguard.core.surface import Sink, Stack
from floorguard.errors import ConfigError, require

__all__ = ["POLICIES", "RateLimits", "Stack", "StackOptions", "create_stack"]


@dataclass(frozen=True)
class RateLimits:
    """Static token buckets (`--rate-limit-*`). Defaults: assured at its floor `B/W`, the
    opportunistic class at 4/s, the flat cap at 10/s (≈ μ_sat of v100-moe at C = 4); each
    bucket holds one second of its rate."""

    assured_per_s: float | None = None
    opportunistic_per_s: float = 4.0
    flat_per_s: float = 10.0
    burst_s: float = 1.0

    def __post_init__(self) -> None:
        require(self.burst_s > 0, "rate_limit_burst_s", self.burst_s, "must be > 0")

    def _bucket(self, rate: float) -> TokenBucket:
        return TokenBucket(rate, max(1.0, rate * self.burst_s))

    def per_class(self, config: GuardConfig) -> dict[ContractClass, TokenBucket]:
        assured = self.assured_per_s
        if assured is None:
            assured = config.total_floor / config.schedule.window_s
        return {
            ContractClass.ASSURED: self._bucket(assured),
            ContractClass.OPPORTUNISTIC: self._bucket(self.opportunistic_per_s),
        }

    def flat(self) -> TokenBucket:
        return self._bucket(self.flat_per_s)


@dataclass(frozen=True)
class StackOptions:
    rate_limits: RateLimits = field(default_factory=RateLimits)
    flow_control: FlowControlOptions = field(default_factory=FlowControlOptions)


def _guard(
    config: GuardConfig,
    learner: Learner,
    options: StackOptions,
    sink: Sink | None,
    started_at: float,
) -> Stack:
    return Guard(config, learner=learner, sink=sink, started_at=started_at)


def _gated_fifo(
    config: GuardConfig,
    learner: Learner,
    options: StackOptions,
    sink: Sink | None,
    started_at: float,
) -> Stack:
    return Guard(
        replace(config, dispatch=DispatchOrder.FIFO),
        learner=learner,
        sink=sink,
        started_at=started_at,
    )


POLICIES: dict[str, Callable[[GuardConfig, Learner, StackOptions, Sink | None, float], Stack]] = {
    "guard": _guard,
    "gated-fifo": _gated_fifo,
    "unguarded": lambda config, learner, options, sink, at: UnguardedStack(
        config, learner=learner, sink=sink, started_at=at
    ),
    "server-priority": lambda config, learner, options, sink, at: ServerPriorityStack(
        config, sink=sink, started_at=at
    ),
    "rate-limit-class": lambda config, learner, options, sink, at: RateLimitStack(
        config, buckets=lambda: options.rate_limits.per_class(config), sink=sink, started_at=at
    ),
    "rate-limit-flat": lambda config, learner, options, sink, at: RateLimitStack(
        config, flat=options.rate_limits.flat(), sink=sink, started_at=at
    ),
    "flow-control": lambda config, learner, options, sink, at: FlowControlStack(
        config, options=options.flow_control, sink=sink, started_at=at
    ),
}


def create_stack(
    policy: str,
    config: GuardConfig,
    *,
    learner: Learner,
    options: StackOptions | None = None,
    sink: Sink | None = None,
    started_at: float = 0.0,
) -> Stack:
    factory = POLICIES.get(policy)
    if factory is None:
        raise ConfigError("policy", policy, f"must be one of {sorted(POLICIES)}")
    return factory(config, learner, options or StackOptions(), sink, started_at)
