"""The learner interface (docs/design.md §2): an untrusted component that only *proposes*.

A proposal is `(admit, proposed_class, priority_hint)`. The guard applies it to the
opportunistic surplus only; it cannot keep a floor-entitled request out, cannot change the
class the floor is drawn from, and its hint never orders assured work. An exception or a
malformed proposal counts as *reject surplus*, and is counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from floorguard.core.contract import ContractClass
from floorguard.core.request import Request

__all__ = ["Learner", "LoadSnapshot", "Proposal", "is_well_formed"]


@dataclass(slots=True)
class LoadSnapshot:
    """What the guard tells a learner about current load (its features). A fresh one per
    ask: a learner that changes it changes nothing the guard reads."""

    num_in_flight: int
    num_queued_entitled: int
    num_queued_surplus: int
    num_slots: int

    def __init__(
        self, num_in_flight: int, num_queued_entitled: int, num_queued_surplus: int, num_slots: int
    ) -> None:
        self.num_in_flight = num_in_flight  # its own __init__: see Consultation's
        self.num_queued_entitled = num_queued_entitled
        self.num_queued_surplus = num_queued_surplus
        self.num_slots = num_slots


@dataclass(frozen=True, slots=True)
class Proposal:
    admit: bool
    proposed_class: ContractClass | None = None
    """A dispatch-class relabel: inside the surplus, `ASSURED` ranks ahead of the rest."""
    priority_hint: float = 0.0
    """Lower is served sooner, within the surplus only (vLLM's `priority` convention)."""


class Learner(Protocol):
    name: str

    def propose(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> Proposal:
        """Propose for one surplus request; `cls` is its true (authenticated) class."""
        ...


def is_well_formed(proposal: object) -> bool:
    """A proposal the guard will apply: the right type, a real bool, a known class, a finite
    hint. Anything else is a learner fault."""
    if type(proposal) is not Proposal:
        return False
    hint = proposal.priority_hint
    return (
        type(proposal.admit) is bool
        and (proposal.proposed_class is None or type(proposal.proposed_class) is ContractClass)
        and type(hint) in (int, float)
        and math.isfinite(hint)
    )


@dataclass(slots=True)
class Consultation:
    proposal: Proposal | None
    """The proposal to apply, or None when the learner failed."""
    fault: str | None
    """What went wrong (exception or malformed answer), for the trace and the counters."""

    def __init__(self, proposal: Proposal | None, fault: str | None) -> None:
        # its own __init__, compiled with the core: a generated one runs as interpreted
        # Python (core/surface.py)
        self.proposal = proposal
        self.fault = fault


def consult(
    learner: Learner, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
) -> Consultation:
    """Ask an untrusted learner; never raises. Any failure is a fault: reject surplus."""
    try:
        proposal: Any = learner.propose(request, cls, load, now)
    except Exception as exc:  # an untrusted component: any failure is a counted fault
        return Consultation(None, f"{type(exc).__name__}: {exc}"[:120])
    if not is_well_formed(proposal):
        return Consultation(None, f"malformed proposal {proposal!r:.80}")
    return Consultation(proposal, None)
