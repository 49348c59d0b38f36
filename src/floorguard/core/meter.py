"""The reservation meter (GroupTB, SPEC §4.1): which assured arrivals are floor-entitled."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from floorguard.core.contract import Contract, MeterKind, WindowSchedule
from floorguard.core.request import Request
from floorguard.store.base import CreditStore, Grant

__all__ = ["MeterDecision", "MeterVerdict", "ReservationMeter"]


class MeterVerdict(StrEnum):
    ENTITLED = "entitled"
    """The weight fit the window's remaining credits: admitted from the floor (AF)."""
    BURST_EXCESS = "burst_excess"
    """The window's credits are spent; the contract's excess policy applies."""
    COST_EXCESS = "cost_excess"
    """The weight exceeds the whole floor: it can never fit (token meter)."""


class MeterDecision(NamedTuple):
    verdict: MeterVerdict
    window_index: int
    remaining: int


class ReservationMeter:
    """Charges assured requests against `B` credits per window, through a `CreditStore`."""

    def __init__(self, schedule: WindowSchedule, store: CreditStore, kind: MeterKind) -> None:
        self._schedule = schedule
        self._store = store
        self._kind = kind

    def weight(self, request: Request) -> int:
        """`w(R)`: 1, or prompt tokens + output cap (SPEC §3)."""
        if self._kind is MeterKind.COUNT:
            return 1
        return request.num_prompt_tokens + request.num_output_tokens

    def charge(
        self,
        contract: Contract,
        request: Request,
        now: float,
        floor: int | None = None,
        grant: Grant | None = None,
    ) -> MeterDecision:
        """One store call per admission; a cost-excess request (heavier than the contract's
        whole `B`) never reaches the store. `floor` overrides the credits available this
        window (a lowered effective floor); what exceeds it is burst-excess. `grant`: the
        driver already made this store call (`store_call`), asynchronously; it is used as
        the store's answer."""
        floor = contract.floor if floor is None else floor
        weight = self.weight(request)
        if weight > contract.floor:
            index = self._schedule.index_at(now)
            return MeterDecision(MeterVerdict.COST_EXCESS, index, -1)
        if grant is None:
            grant = self._store.acquire(contract.tenant, weight, floor, self._schedule, now)
        verdict = MeterVerdict.ENTITLED if grant.granted else MeterVerdict.BURST_EXCESS
        return MeterDecision(verdict, grant.window_index, grant.remaining)

    def remaining(self, contract: Contract, now: float) -> int:
        return self._store.remaining(contract.tenant, contract.floor, self._schedule, now)
