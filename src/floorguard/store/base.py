"""The `CreditStore` interface: the atomic part of the reservation meter (docs/design.md §18.3).

The meter decides policy; a store only performs one atomic operation per admission:
"in the window that holds this instant, take `weight` of `capacity` credits if they fit".
It answers granted/denied and the window index it used, so a remote store that reads its
own clock (Redis `TIME`, a later issue) slots in without the meter changing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from mypy_extensions import mypyc_attr

from floorguard.windows import WindowSchedule

__all__ = ["CreditStore", "Grant", "StoreUnavailable"]


class StoreUnavailable(Exception):  # noqa: N818  # a state, as the policies name it
    """The store could not answer a call (unreachable, timed out, refused): the caller's
    fallback policy decides. The only store error the rest of floorguard catches; the
    Redis store turns its client's errors into it."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent
        """The call may have reached the store and run (a reply that timed out, a
        connection lost after sending); False where it certainly did not (no connection
        could be had)."""


class Grant(NamedTuple):
    granted: bool
    window_index: int
    """The window `k` the credits were taken from (or would have been)."""
    remaining: int
    """Credits left in that window after this call."""
    floor: int | None = None
    """The window's floor as a shared store pinned it at the window's first take (the
    `floor` of the replica that took first); None: the caller's own governs."""


@mypyc_attr(allow_interpreted_subclasses=True)  # the shared floor and Redis's extend it
class CreditStore(ABC):
    """Per-key, per-window credit counters with one atomic take-if-fits operation."""

    @abstractmethod
    def acquire(
        self,
        key: str,
        weight: int,
        capacity: int,
        schedule: WindowSchedule,
        now: float,
        *,
        floor: int | None = None,
    ) -> Grant:
        """Take `weight` credits from `key`'s current window if `used + weight ≤ capacity`.

        `now` is the caller's clock; a store with an authoritative clock of its own may use
        that instead, and reports the window it used in the grant. `floor`: the contract's
        `B` (≥ `capacity`); a store several replicas share may pin the window's floor to
        the first caller's and judge later calls against it (`Grant.floor`).
        """

    @abstractmethod
    def remaining(self, key: str, capacity: int, schedule: WindowSchedule, now: float) -> int:
        """Credits left for `key` in the window that holds `now` (read-only)."""
