"""What the trace checker reports (`Violation`, `CheckReport`), and what its checks share:
the floors each configuration of a log set, its tolerances and reasons."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from floorguard.core.contract import (
    GuardConfig,
)
from floorguard.core.request import RequestId

__all__ = ["CheckReport", "Floors", "Violation", "floors_of"]

ORDER_TOLERANCE_S = 0.1
"""Fleet ORDER's allowance for the replicas' clocks and the lease round trip: an entitled
request must have waited from before `t − ε` until after `t + ε` for an opportunistic start
at `t` on another replica to count against it."""

LOST_STATE = "lost-state"
"""A `store` event's reason when Redis lost a tenant's count in a window (`tenant`,
`window`): that window was closed to fresh takes, so its AF findings are conditional."""


@dataclass(frozen=True)
class Violation:
    prop: str
    index: int
    """Position of the violating event in the log (0-based); the bad prefix is [0, index]."""
    request_id: RequestId | None
    message: str
    log: int = 0
    """Which log (`check_fleet`: its position in the list given)."""


@dataclass
class CheckReport:
    num_events: int = 0
    num_requests: int = 0
    num_entitled: int = 0
    num_drops: int = 0
    num_sf_late: int = 0
    num_ttft_late: int = 0
    """Floor-entitled requests whose first token was (or, from their start, had to be)
    late by their TTFT: violations inside design §19's region, conditional outside it."""
    violations: list[Violation] = field(default_factory=list)
    conditional: list[Violation] = field(default_factory=list)
    """AF findings in windows where a replica decided on its local fallback (the shared
    store unreachable, marked by `store` events): the floor is conditional on the store
    there, as SF is on capacity; and TTFT findings outside design §19's region, or where the
    backend's first token was slower than its ceiling. Reported, never a failure."""
    degraded_s: list[float] = field(default_factory=list)
    """Per log (`check_fleet`): seconds its shared floor spent degraded."""
    fleet_peak_in_flight: dict[str, int] = field(default_factory=dict)
    """Per backend with a recorded capacity (`check_fleet`): the most requests the fleet
    had in flight there at once."""
    counts: Counter[str] = field(default_factory=Counter)
    num_died_open: int = 0
    """Requests a replica still held when it died: its log starts a new life (a `config`
    event that is no reload) with them open. Their clients lost the connection; counted
    here, not as TERMINAL violations, and their slots end where the new life starts."""
    num_torn_lines: int = 0
    """Lines a writer left half-written as it died (the file's last, or the one before a
    new life's `config`): skipped."""

    def failed(self, strict_sf: bool = False) -> list[Violation]:
        return [v for v in self.violations if strict_sf or v.prop != "SF"]

    def ok(self, strict_sf: bool = False) -> bool:
        return not self.failed(strict_sf)


def floors_of(config: GuardConfig) -> dict[str, int]:
    return {c.tenant: c.floor for c in config.contracts if c.assured}


@dataclass
class Floors:
    """Each configuration's floors and the first window they govern: a reload's `config`
    event names its window (docs/design.md §14: a window already open keeps its floors)."""

    changes: list[tuple[float, dict[str, int]]]

    def at(self, window: int) -> dict[str, int]:
        for first, floors in reversed(self.changes):
            if window >= first:
                return floors
        return self.changes[0][1]

    @property
    def tenants(self) -> set[str]:
        return {t for _, floors in self.changes for t in floors}

    @property
    def reloaded(self) -> bool:
        return len(self.changes) > 1
