"""floorguard: a trusted assured-SLO floor under untrusted learned admitters."""

from floorguard import _compiled  # noqa: F401  first: it picks the build before the core loads
from floorguard.core import (
    AffineEnvelope,
    Contract,
    ContractClass,
    DispatchOrder,
    ExcessPolicy,
    Guard,
    GuardConfig,
    Learner,
    MeterKind,
    Proposal,
    Request,
    WindowSchedule,
)
from floorguard.errors import ConfigError, FloorguardError, TraceError, WorkloadError
from floorguard.store import CreditStore, MemoryCreditStore

__version__ = "0.1.0"

__all__ = [
    "AffineEnvelope",
    "ConfigError",
    "Contract",
    "ContractClass",
    "CreditStore",
    "DispatchOrder",
    "ExcessPolicy",
    "FloorguardError",
    "Guard",
    "GuardConfig",
    "Learner",
    "MemoryCreditStore",
    "MeterKind",
    "Proposal",
    "Request",
    "TraceError",
    "WindowSchedule",
    "WorkloadError",
    "__version__",
]
