"""The floorguard exception tree.

    FloorguardError
    ├── ConfigError        a contract, schedule, profile or scenario value is out of range
    ├── WorkloadError      a workload or trace file cannot be read or is malformed
    └── TraceError         a decision log (JSONL trace) cannot be parsed

Every error names what is wrong and what is allowed, so the message alone tells the user
what to change.
"""

from __future__ import annotations

__all__ = ["ConfigError", "FloorguardError", "TraceError", "WorkloadError"]


class FloorguardError(Exception):
    """Base class of every error floorguard raises on purpose."""


class ConfigError(FloorguardError, ValueError):
    """A configuration value is out of range; the message names the field, value and range."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field} = {value!r}: {allowed}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, object, str]]:
        """Pickles whole, so an experiment worker's error reaches the parent as itself."""
        return (type(self), (self.field, self.value, self.allowed))


class ProtocolError(FloorguardError, RuntimeError):
    """A driver broke the stack's surface protocol (`core/surface.py`): answered an arrival
    already decided, or answered a need with the wrong kind of answer. Raised at the call
    site, before any state changes."""


class WorkloadError(FloorguardError, ValueError):
    """A workload specification or trace file is unusable."""


class TraceError(FloorguardError, ValueError):
    """A decision log line is not a valid trace event."""


def require(condition: bool, field: str, value: object, allowed: str) -> None:
    """Raise `ConfigError(field, value, allowed)` unless `condition` holds."""
    if not condition:
        raise ConfigError(field, value, allowed)
