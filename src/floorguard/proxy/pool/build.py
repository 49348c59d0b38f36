"""What a pool's guard is built from, beside it: its guard core over the fleet's floor and
slot shares, with the shipped learner builder (`create_learner`). The fleet simulator
(`floorguard.datacenter`) builds each of its replicas with this same function."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from floorguard.core.events import TraceEvent
from floorguard.core.guard import Guard
from floorguard.learners.registry import create_learner
from floorguard.proxy.config.guard import BackendSpec, GuardServerConfig, StoreSpec
from floorguard.store.script import ScriptStore
from floorguard.store.shared import SharedFloor

__all__ = ["Shares", "pool_floor", "pool_guard"]

Shares = Callable[[Sequence[BackendSpec], frozenset[int], int], tuple[int, ...]]
"""Each backend's slots for this replica in a fleet of a given count (`slot_shares`)."""


def pool_guard(
    config: GuardServerConfig,
    *,
    shares: Shares,
    floor: SharedFloor | None,
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
        config.guard_config(), slots=shares(config.backends, frozenset(), configured)
    )
    learner = (
        None
        if asks_over_http
        else create_learner(config.learner, np.random.default_rng(seed), config.learner_config())
    )
    return Guard(guard_config, learner=learner, store=floor, sink=sink, started_at=now)


def pool_floor(
    spec: StoreSpec,
    store: ScriptStore,
    *,
    clock: Callable[[], float],
    on_change: Callable[[str, float], None],
    on_lost_state: Callable[[str, int, float], None],
) -> SharedFloor:
    """A pool's shared floor over `store` (its Redis), with the store section's policy, its
    configured replica count (until the membership is heard), retries and retry period."""
    return SharedFloor(
        store,
        policy=spec.on_unavailable,
        replicas=spec.replicas,
        retry_s=spec.retry_s,
        clock=clock,
        attempts=spec.attempts,
        on_change=on_change,
        on_lost_state=on_lost_state,
    )
