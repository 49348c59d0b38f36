"""A user learner loaded by import path in the tests (`tests.plugins:make_learner`)."""

from __future__ import annotations

from floorguard.core.learner import Proposal


class RejectLong:
    name = "reject-long"

    def propose(self, request, cls, load, now):
        return Proposal(admit=request.num_output_tokens <= 16)


def make_learner(rng):
    return RejectLong()


NOT_CALLABLE = 42
