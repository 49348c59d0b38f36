"""The untrusted learners, one module each, plus a registry."""

from floorguard.learners.adversaries import AlwaysAdmit, AlwaysReject, Liar, RandomLearner
from floorguard.learners.latency import (
    LatencyModel,
    LatencyPredictorAdmitter,
    ShedPolicy,
    fit_latency_model,
)
from floorguard.learners.registry import LEARNERS, LearnerOptions, create_learner

__all__ = [
    "LEARNERS",
    "AlwaysAdmit",
    "AlwaysReject",
    "LatencyModel",
    "LatencyPredictorAdmitter",
    "LearnerOptions",
    "Liar",
    "RandomLearner",
    "ShedPolicy",
    "create_learner",
    "fit_latency_model",
]
