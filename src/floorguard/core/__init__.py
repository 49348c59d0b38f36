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
from floorguard.core.guard import Admission, Completion, Dispatch, Drop, Guard, RejectReason
from floorguard.core.learner import Learner, LoadSnapshot, Proposal
from floorguard.core.monitors import AssumptionReport, assumption_report
from floorguard.core.request import Request

__all__ = [
    "Admission",
    "AffineEnvelope",
    "AssumptionReport",
    "Completion",
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
    "LoadSnapshot",
    "MeterKind",
    "Proposal",
    "RejectReason",
    "Request",
    "TraceEvent",
    "WindowSchedule",
    "assumption_report",
]
