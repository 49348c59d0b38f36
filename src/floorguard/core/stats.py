"""What a stack counts per contract class: offered, admitted, … ended by which outcome
(the `Ledger` keeps them; `floorguard simulate`, the status page and the experiments read
them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from floorguard.core.contract import ContractClass
from floorguard.core.surface import RejectReason

__all__ = ["ClassStats", "GuardStats"]


@dataclass(slots=True)
class ClassStats:
    offered: int = 0
    admitted: int = 0
    entitled: int = 0
    demoted: int = 0
    rejected: int = 0
    dropped: int = 0
    completed: int = 0
    late: int = 0
    failed: int = 0
    aborted: int = 0


@dataclass(slots=True)
class GuardStats:
    per_class: dict[ContractClass, ClassStats] = field(
        default_factory=lambda: {c: ClassStats() for c in ContractClass}
    )
    rejected_by_reason: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(RejectReason, 0)
    )
    """By reason: the guard's `RejectReason`s, and any a comparison stack adds."""
    learner_calls: int = 0
    learner_faults: int = 0
    doom_uncertain: int = 0
    unknown_tenant: int = 0
