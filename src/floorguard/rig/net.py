"""Loopback helpers shared by the benchmarks, the local Redis launcher and the tests."""

from __future__ import annotations

import socket
import subprocess
import time

__all__ = ["free_port_run", "free_ports", "wait_listening"]


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now (bound together, then released)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [int(s.getsockname()[1]) for s in sockets]
    for s in sockets:
        s.close()
    return ports


def free_port_run(count: int, attempts: int = 100) -> int:
    """A port `p` with `p … p + count − 1` all free on 127.0.0.1 right now (`workers: N`'s
    admin ports)."""
    for _ in range(attempts):
        (start,) = free_ports(1)
        taken: list[socket.socket] = []
        try:
            for port in range(start, start + count):
                probe = socket.socket()
                taken.append(probe)
                probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for probe in taken:
                probe.close()
        return start
    raise RuntimeError(f"no {count} free ports in a row on 127.0.0.1")


def wait_listening(port: int, process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Until something listens on 127.0.0.1:`port`; `RuntimeError` if `process` exits or
    `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"process exited with {process.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {port}") from None
            time.sleep(0.1)
