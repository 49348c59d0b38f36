"""`unguarded`: the learner's admission straight into the backend's own FIFO queue.

What operators run without a floor: every request, assured or not, is admitted or rejected
by the untrusted learner alone; nothing reorders or protects the assured class.
"""

from __future__ import annotations

from floorguard.baselines.server import Decision, ServerOrder, ServerStack
from floorguard.core.contract import Contract
from floorguard.core.learner import Proposal
from floorguard.core.request import Request

__all__ = ["UnguardedStack"]


class UnguardedStack(ServerStack):
    name = "unguarded"
    server_order = ServerOrder.FIFO
    consults_learner = True

    def _decide(
        self, request: Request, contract: Contract, now: float, proposal: Proposal | None
    ) -> Decision:
        if proposal is None:
            return Decision("learner_fault")
        return Decision(None if proposal.admit else "learner_reject")
