"""The comparison stacks (design §7), one module each, plus a registry by `--policy` name."""

from floorguard.baselines.flow_control import (
    FlowControlOptions,
    FlowControlStack,
    MappingFault,
    Objective,
)
from floorguard.baselines.rate_limit import RateLimitStack, TokenBucket
from floorguard.baselines.registry import POLICIES, RateLimits, Stack, StackOptions, create_stack
from floorguard.baselines.server import ServerOrder, ServerStack
from floorguard.baselines.server_priority import ServerPriorityStack
from floorguard.baselines.unguarded import UnguardedStack

__all__ = [
    "POLICIES",
    "FlowControlOptions",
    "FlowControlStack",
    "MappingFault",
    "Objective",
    "RateLimitStack",
    "RateLimits",
    "ServerOrder",
    "ServerPriorityStack",
    "ServerStack",
    "Stack",
    "StackOptions",
    "TokenBucket",
    "UnguardedStack",
    "create_stack",
]
