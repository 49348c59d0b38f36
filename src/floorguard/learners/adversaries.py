"""Adversarial and trivial learners (docs/design.md §7): they show what the floor holds against."""

from __future__ import annotations

import numpy as np

from floorguard.core.contract import ContractClass
from floorguard.core.learner import LoadSnapshot, Proposal
from floorguard.core.request import Request

__all__ = ["AlwaysAdmit", "AlwaysReject", "Liar", "RandomLearner"]

_ADMIT = Proposal(admit=True)
_REJECT = Proposal(admit=False)


class AlwaysAdmit:
    """Admits every surplus request: the miscalibrated learner that floods the fleet."""

    name = "always-admit"

    def propose(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> Proposal:
        return _ADMIT


class AlwaysReject:
    """Rejects every surplus request: the floor must still admit the entitled."""

    name = "always-reject"

    def propose(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> Proposal:
        return _REJECT


class RandomLearner:
    """Admits with probability `admit_probability`, with a random hint and random relabels."""

    name = "random"

    def __init__(self, rng: np.random.Generator, admit_probability: float = 0.5) -> None:
        self._rng = rng
        self._admit_probability = admit_probability

    def propose(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> Proposal:
        u_admit, u_class, u_hint = self._rng.random(3)
        relabel = ContractClass.ASSURED if u_class < 0.5 else ContractClass.OPPORTUNISTIC
        return Proposal(bool(u_admit < self._admit_probability), relabel, float(u_hint))


class Liar:
    """Admits everything and lies about it: inverted priority hints (assured to the back,
    opportunistic to the front) and assured↔opportunistic relabels. The floor is drawn from
    the authenticated class, so none of this can move an entitled request."""

    name = "liar"

    def propose(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> Proposal:
        if cls is ContractClass.ASSURED:
            return Proposal(True, ContractClass.OPPORTUNISTIC, 1e9)
        return Proposal(True, ContractClass.ASSURED, -1e9)
