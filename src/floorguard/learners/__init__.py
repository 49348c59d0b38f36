"""The untrusted learners, one module each, plus a registry."""

from floorguard.learners.adversaries import AlwaysAdmit, AlwaysReject, RandomLearner
from floorguard.learners.registry import LEARNERS, create_learner

__all__ = ["LEARNERS", "AlwaysAdmit", "AlwaysReject", "RandomLearner", "create_learner"]
