"""The pure guard core: no I/O, no clock reads; every call takes `now`."""

from floorguard.core.contract import (
    AffineEnvelope,
    Contract,
    ContractClass,
    DispatchOrder,
    ExcessPolicy,
    GuardConfig,
    MeterKind,
    WindowSchedule,
)
from floorguard.core.events import EventKind, TraceEvent
from floorguard.core.guard import Guard
from floorguard.core.learner import Learner, LoadSnapshot, Proposal
from floorguard.core.ledger import Ledger
from floorguard.core.monitors import AssumptionReport, assumption_report, assumptions_of
from floorguard.core.request import Request
from floorguard.core.surface import (
    Admission,
    Dispatch,
    Drop,
    LearnerAsk,
    Pending,
    RejectReason,
    Sink,
    Stack,
    StoreCall,
)

__all__ = [
    "Admission",
    "AffineEnvelope",
    "AssumptionReport",
    "Contract",
    "ContractClass",
    "Dispatch",
    "DispatchOrder",
    "Drop",
    "EventKind",
    "ExcessPolicy",
    "Guard",
    "GuardConfig",
    "Learner",
    "LearnerAsk",
    "Ledger",
    "LoadSnapshot",
    "MeterKind",
    "Pending",
    "Proposal",
    "RejectReason",
    "Request",
    "Sink",
    "Stack",
    "StoreCall",
    "TraceEvent",
    "WindowSchedule",
    "assumption_report",
    "assumptions_of",
]
