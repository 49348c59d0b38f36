"""Learners by name, or by import path `package.module:factory`.

Every learner is built per run from a seeded generator (no global random state) and the
run's `LearnerOptions`. A user's factory is called as `factory(rng)` and must return an
object with `name` and `propose(request, cls, load, now) -> Proposal`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from floorguard.core.learner import Learner
from floorguard.errors import ConfigError
from floorguard.learners.adversaries import AlwaysAdmit, AlwaysReject, Liar, RandomLearner
from floorguard.learners.latency import LatencyModel, LatencyPredictorAdmitter, ShedPolicy

__all__ = ["LEARNERS", "PREDICTORS", "LearnerOptions", "create_learner", "needs_latency_model"]


@dataclass(frozen=True)
class LearnerOptions:
    beta: float = 1.0
    """Miscalibration of the latency predictors (`--beta`)."""
    slo_s: float = 1.820
    """The latency SLO the predictors admit against."""
    latency_model: LatencyModel | None = None
    """The fitted model the predictors use (fit once per command, `sim.probe`)."""


def _predictor(
    policy: ShedPolicy, fixed_beta: float | None = None
) -> Callable[[np.random.Generator, LearnerOptions], Learner]:
    def build(rng: np.random.Generator, options: LearnerOptions) -> Learner:
        if options.latency_model is None:
            raise ConfigError("latency_model", None, "a predictor learner needs a fitted model")
        beta = options.beta if fixed_beta is None else fixed_beta
        return LatencyPredictorAdmitter(
            options.latency_model, beta=beta, slo_s=options.slo_s, policy=policy
        )

    return build


LEARNERS: dict[str, Callable[[np.random.Generator, LearnerOptions], Learner]] = {
    "always-admit": lambda rng, options: AlwaysAdmit(),
    "always-reject": lambda rng, options: AlwaysReject(),
    "random": lambda rng, options: RandomLearner(rng),
    "liar": lambda rng, options: Liar(),
    "predictor-sheddable": _predictor(ShedPolicy.SHEDDABLE_ONLY),
    "predictor-agnostic": _predictor(ShedPolicy.CLASS_AGNOSTIC),
    "calibrated-fifo": _predictor(ShedPolicy.CLASS_AGNOSTIC, fixed_beta=1.0),
}
PREDICTORS = frozenset({"predictor-sheddable", "predictor-agnostic", "calibrated-fifo"})
"""The learners that need a fitted latency model."""


def needs_latency_model(name: str) -> bool:
    return name in PREDICTORS


def _from_import_path(path: str) -> Callable[[np.random.Generator], Learner]:
    module_name, _, attribute = path.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError("learner", path, f"cannot import it ({exc})") from exc
    if not callable(factory):
        raise ConfigError("learner", path, "must name a callable factory(rng) -> Learner")
    return factory  # type: ignore[no-any-return]


def create_learner(
    name: str, rng: np.random.Generator, options: LearnerOptions | None = None
) -> Learner:
    """A registered learner, or `package.module:factory` called as `factory(rng)`."""
    options = options if options is not None else LearnerOptions()
    if ":" in name:
        learner = _from_import_path(name)(rng)
        if not callable(getattr(learner, "propose", None)):
            raise ConfigError("learner", name, "the factory must return an object with propose()")
        return learner
    factory = LEARNERS.get(name)
    if factory is None:
        raise ConfigError(
            "learner", name, f"must be one of {sorted(LEARNERS)} or a package.module:factory path"
        )
    return factory(rng, options)
