"""`/admin/status`: what an operator reads off one guard, as one JSON object."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from floorguard.core.guard import Guard

__all__ = ["guard_status"]


def guard_status(
    guard: Guard,
    now: float,
    *,
    backends_healthy: Sequence[bool],
    store: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The window and each assured tenant's credits left, the queues and slots, the
    monitors, the design §6 report, and the shared floor's state (`store`) when there is one."""
    schedule = guard.config.schedule
    return {
        "now": now,
        "window": {
            "index": schedule.index_at(now),
            "window_s": schedule.window_s,
            "origin_at": schedule.origin_at,
            "credits_left": {
                c.tenant: guard.credits_left(c.tenant, now)
                for c in guard.config.contracts
                if c.assured
            },
            "floors": {
                c.tenant: guard.effective_floor(c) for c in guard.config.contracts if c.assured
            },
        },
        "queues": {
            "queued": guard.num_queued,
            "queued_entitled": guard.num_queued_entitled,
            "in_flight": [guard.in_flight_on(b) for b in range(len(guard.config.slots))],
            "slots": list(guard.config.slots),
            "backends_healthy": list(backends_healthy),
        },
        "monitors": {
            "max_service_s": guard.envelope.max_service_s,
            "above_ceiling": guard.envelope.num_above_upper,
            "below_lower": guard.envelope.num_below_lower,
            "max_assured_backlog": guard.backlog.max_backlog,
            "capacity_per_s": guard.capacity.estimate_per_s,
            "capacity_alarms": guard.capacity.num_alarms,
            "learner_faults": guard.stats.learner_faults,
        },
        "assumptions": asdict(guard.assumptions()),
        **({"store": store} if store is not None else {}),
    }
