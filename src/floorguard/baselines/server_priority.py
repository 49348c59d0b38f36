"""`server-priority`: admit everything and hand each request a priority, vLLM semantics.

The backend's waiting queue is ordered by `(priority, arrival)` (assured 0, opportunistic 1;
lower first) and a running request is never preempted when the slots are full (docs/design.md §5): a
priority-jumped request still waits for a running slot. No floor, no admission control.
"""

from __future__ import annotations

from floorguard.baselines.server import Decision, ServerOrder, ServerStack
from floorguard.core.contract import Contract
from floorguard.core.learner import Proposal
from floorguard.core.request import Request

__all__ = ["ServerPriorityStack"]


class ServerPriorityStack(ServerStack):
    name = "server-priority"
    server_order = ServerOrder.PRIORITY

    def _decide(
        self, request: Request, contract: Contract, now: float, proposal: Proposal | None
    ) -> Decision:
        return Decision(None, float(contract.cls.backend_priority))
