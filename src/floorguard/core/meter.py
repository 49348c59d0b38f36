"""The reservation meter (GroupTB, docs/design.md §4.1): what an assured arrival weighs against `B`.

The meter is policy only; the atomic take-if-fits is the credit store's (`StoreCall`,
answered by the driver or by the guard's own store).
"""

from __future__ import annotations

from floorguard.core.contract import Contract, MeterKind
from floorguard.core.request import Request

__all__ = ["ReservationMeter"]


class ReservationMeter:
    def __init__(self, kind: MeterKind) -> None:
        self._kind = kind

    def weight(self, request: Request) -> int:
        """`w(R)`: 1, or prompt tokens + output cap (docs/design.md §3)."""
        if self._kind is MeterKind.COUNT:
            return 1
        return request.num_prompt_tokens + request.num_output_tokens

    @staticmethod
    def is_cost_excess(contract: Contract, weight: int) -> bool:
        """Heavier than the contract's whole `B`: it can never fit, so it never reaches the
        store (the token meter)."""
        return weight > contract.floor
