"""Learners by name, each built from a seeded generator (no global random state)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from floorguard.core.learner import Learner
from floorguard.errors import ConfigError
from floorguard.learners.adversaries import AlwaysAdmit, AlwaysReject, RandomLearner

__all__ = ["LEARNERS", "create_learner"]

LEARNERS: dict[str, Callable[[np.random.Generator], Learner]] = {
    "always-admit": lambda rng: AlwaysAdmit(),
    "always-reject": lambda rng: AlwaysReject(),
    "random": RandomLearner,
}


def create_learner(name: str, rng: np.random.Generator) -> Learner:
    factory = LEARNERS.get(name)
    if factory is None:
        raise ConfigError("learner", name, f"must be one of {sorted(LEARNERS)}")
    return factory(rng)
