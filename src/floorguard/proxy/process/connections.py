"""Client connections, bounded below the descriptor limit (1,100 idle connections
at a 1,024-descriptor limit starved the assured tenant and logged 17,000 lines).

At start the soft descriptor limit is raised to the hard one; the cap on open client
connections is what remains after a reserve for everything else the guard opens (its
upstream connector, logs, the store). At the cap, a new connection evicts the oldest one
with no request in progress (an idle keep-alive or one still sending its headers: nothing
admitted is ever cut); with none idle, the new one is closed. Either is said once per
episode, not per accept.
"""

from __future__ import annotations

import logging
import resource
from typing import Protocol

from floorguard.errors import ConfigError

__all__ = ["ConnectionCap", "connection_cap"]

log = logging.getLogger("floorguard.proxy")

RESERVE = 64 + 3 * 128
"""Descriptors kept for everything but client connections and the upstream connector: 64,
and what asyncio accepts in a burst before the cap sees a connection (up to the listen
backlog, 128, per loop turn, for the two or three turns until `connection_made` runs)."""


class _Connection(Protocol):
    @property
    def busy(self) -> bool: ...

    def close_now(self) -> None: ...


class ConnectionCap:
    """The open client connections, oldest first, and their cap."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.num_evicted = 0
        self.num_refused = 0
        self._open: dict[_Connection, None] = {}
        self._said = False

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, connection: _Connection) -> bool:
        """Count a new connection; False when it must be closed (every other one busy)."""
        if len(self._open) >= self.limit:
            idle = next((c for c in self._open if not c.busy), None)
            self._say()
            if idle is None:
                self.num_refused += 1
                return False
            self.num_evicted += 1
            self._open.pop(idle)
            idle.close_now()
        self._open[connection] = None
        return True

    def closed(self, connection: _Connection) -> None:
        self._open.pop(connection, None)
        if self._said and len(self._open) < 0.9 * self.limit:
            self._said = False

    def _say(self) -> None:
        if not self._said:
            self._said = True
            log.warning(
                "client connections at the cap (%d): idle ones are closed for new ones "
                "(said once until below 90%%)",
                self.limit,
            )


def connection_cap(configured: int | None, upstream_connections: int) -> ConnectionCap:
    """Raise the soft descriptor limit to the hard one and size the cap under it: the
    configured cap, or all that the reserve leaves; a configured cap that does not fit is
    a ConfigError naming `max_connections`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    room = soft - upstream_connections - RESERVE
    if configured is None:
        if room < 16:
            raise ConfigError(
                "max_connections",
                None,
                f"the descriptor limit {soft} leaves {room} for client connections after "
                f"{upstream_connections} upstream and {RESERVE} reserved: raise `ulimit -n`",
            )
        return ConnectionCap(room)
    if configured > room:
        raise ConfigError(
            "max_connections",
            configured,
            f"needs {configured + upstream_connections + RESERVE} descriptors; the limit is "
            f"{soft} (raise `ulimit -n`, or lower max_connections to at most {room})",
        )
    return ConnectionCap(configured)
