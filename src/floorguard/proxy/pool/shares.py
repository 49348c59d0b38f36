"""What a pool's slots are in a fleet, and across a reload: each backend's share for this
replica (a partition follows the live replica count, design §14), the capacities the decision
log records, and the backends by position after a reload (kept, removed, appended)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from floorguard.core.contract import GuardConfig
from floorguard.proxy.config.guard import BackendSpec, GuardServerConfig

__all__ = ["Reload", "capacities", "merge_backends", "slot_shares"]

log = logging.getLogger("floorguard.proxy")


def slot_shares(
    backends: Sequence[BackendSpec],
    removed: frozenset[int],
    count: int,
    *,
    partitioned: bool,
    capacity_of: Callable[[BackendSpec], int | None],
    where: str = "",
) -> tuple[int, ...]:
    """Each backend's slots for this replica: with partitioned slots in a fleet of `count`,
    `min(slots, ⌊capacity / count⌋)` where the backend's capacity is known (declared, else
    reported: `capacity_of`), so the live replicas' shares never sum past it; else `slots`.
    Removed backends: 0. A fleet with more replicas than a backend has slots gives some a
    share of 0; if every share here is 0 the replica keeps one slot on its largest backend
    (logged: the backend may then run more than its capacity)."""
    shares = []
    for i, backend in enumerate(backends):
        capacity = capacity_of(backend)
        if i in removed:
            shares.append(0)
        elif partitioned and capacity is not None:
            shares.append(min(backend.slots, capacity // count))
        else:
            shares.append(backend.slots)
    if not any(shares):
        kept = max(
            (i for i in range(len(backends)) if i not in removed),
            key=lambda i: capacity_of(backends[i]) or 0,
        )
        shares[kept] = 1
        log.warning(
            "%d replicas live%s, more than the backends have slots for: this replica "
            "keeps one slot on %s (its capacity may be exceeded; lease the slots, "
            "docs/replicas.md)",
            count,
            where,
            backends[kept].url,
        )
    return tuple(shares)


def capacities(
    backends: Sequence[BackendSpec], capacity_of: Callable[[BackendSpec], int | None]
) -> tuple[int | None, ...]:
    """Each backend's capacity as the decision log records it (for `verify`'s SLOTS across
    replicas); () when none is known."""
    capacity = tuple(capacity_of(b) for b in backends)
    return capacity if any(c is not None for c in capacity) else ()


@dataclasses.dataclass(frozen=True)
class Reload:
    """A pool's part of a reload, validated (`Pool.plan_reload`), not yet applied."""

    config: GuardServerConfig
    backends: list[BackendSpec]
    removed: frozenset[int]
    guard_config: GuardConfig

    def changes(
        self, running: GuardConfig, backends: Sequence[BackendSpec], removed: frozenset[int]
    ) -> dict[str, Any]:
        """What it changes in a pool running `running` over `backends` (`removed` of them
        draining): tenants added and removed, floors changed, backends added and removed (by
        URL); only what changes."""
        old = {c.tenant: c for c in running.contracts}
        new = {c.tenant: c for c in self.guard_config.contracts}
        out: dict[str, Any] = {
            "tenants_added": sorted(new.keys() - old.keys()),
            "tenants_removed": sorted(old.keys() - new.keys()),
            "floors_changed": {
                t: [old[t].floor, new[t].floor]
                for t in sorted(old.keys() & new.keys())
                if old[t].floor != new[t].floor
            },
            "backends_added": [b.url for b in self.backends[len(backends) :]],
            "backends_removed": [self.backends[i].url for i in sorted(self.removed - removed)],
        }
        return {k: v for k, v in out.items() if v}


def merge_backends(
    running: Sequence[BackendSpec], wanted: Sequence[BackendSpec]
) -> tuple[list[BackendSpec], frozenset[int]]:
    """The backends after a reload, by position: each running one where it is (with the
    new `slots` if it is still wanted; removed, draining, if not), then the new ones in
    their order. A backend is its URL."""
    by_url = {b.url.rstrip("/"): b for b in wanted}
    merged, removed = [], set()
    for i, backend in enumerate(running):
        kept = by_url.pop(backend.url.rstrip("/"), None)
        merged.append(kept if kept is not None else backend)
        if kept is None:
            removed.add(i)
    return [*merged, *by_url.values()], frozenset(removed)
