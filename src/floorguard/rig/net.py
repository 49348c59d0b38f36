"""Loopback helpers shared by the benchmarks, the local Redis launcher and the tests."""

from __future__ import annotations

import socket

__all__ = ["free_ports"]


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now (bound together, then released)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [int(s.getsockname()[1]) for s in sockets]
    for s in sockets:
        s.close()
    return ports
