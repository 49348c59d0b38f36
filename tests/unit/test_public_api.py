from __future__ import annotations

import floorguard
import floorguard.core
import floorguard.learners
import floorguard.sim
import floorguard.store

DOCUMENTED = {
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
}


def test_top_level_exports_are_the_documented_ones():
    """The public face is small and deliberate: __all__ equals the documented list."""
    assert set(floorguard.__all__) == DOCUMENTED


def test_every_exported_name_exists():
    """Each __all__ entry of every public package resolves."""
    for module in (
        floorguard,
        floorguard.core,
        floorguard.sim,
        floorguard.store,
        floorguard.learners,
    ):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
