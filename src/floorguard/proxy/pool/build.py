"""What a pool is built from, beside it: its guard core over the fleet's floor and shares,
with the shipped learner builder (`create_learner`, the one the simulator uses)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from floorguard.core.events import TraceEvent
from floorguard.core.guard import Guard
from floorguard.learners.registry import create_learner
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.proxy.pool.fleet import PoolFleet

__all__ = ["pool_guard"]


def pool_guard(
    config: GuardServerConfig,
    fleet: PoolFleet,
    *,
    asks_over_http: bool,
    sink: Callable[[TraceEvent], None],
    seed: int,
    now: float,
) -> Guard:
    """A pool's guard core: its configuration with the slot shares the fleet gives this
    replica (the configured replica count until the membership is heard), its learner
    (none where the HTTP callout answers every ask) and the fleet's shared floor (None:
    the guard's own)."""
    configured = config.store.replicas if config.store is not None else 1
    guard_config = dataclasses.replace(
        config.guard_config(),
        slots=fleet.shares(config.backends, frozenset(), configured),
    )
    learner = (
        None
        if asks_over_http
        else create_learner(config.learner, np.random.default_rng(seed), config.learner_config())
    )
    return Guard(guard_config, learner=learner, store=fleet.floor, sink=sink, started_at=now)
