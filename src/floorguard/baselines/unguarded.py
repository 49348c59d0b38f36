"""`unguarded`: the learner's admission straight into the backend's own FIFO queue.

What operators run without a floor: every request, assured or not, is admitted or rejected
by the untrusted learner alone; nothing reorders or protects the assured class.
"""

from __future__ import annotations

from collections.abc import Callable

from floorguard.baselines.server import Decision, ServerOrder, ServerStack
from floorguard.core.contract import Contract, GuardConfig
from floorguard.core.events import TraceEvent, propose_event
from floorguard.core.learner import Learner, consult
from floorguard.core.request import Request

__all__ = ["UnguardedStack"]


class UnguardedStack(ServerStack):
    name = "unguarded"
    server_order = ServerOrder.FIFO

    def __init__(
        self,
        config: GuardConfig,
        *,
        learner: Learner,
        sink: Callable[[TraceEvent], None] | None = None,
        started_at: float = 0.0,
    ) -> None:
        super().__init__(config, sink=sink, started_at=started_at)
        self._learner = learner

    def _decide(self, request: Request, contract: Contract, now: float) -> Decision:
        self.stats.learner_calls += 1
        consultation = consult(self._learner, request, contract.cls, self.load(), now)
        if self._sink is not None:
            self._sink(propose_event(now, request, contract.cls, consultation))
        if consultation.proposal is None:
            self.stats.learner_faults += 1
            return Decision("learner_fault")
        return Decision(None if consultation.proposal.admit else "learner_reject")
