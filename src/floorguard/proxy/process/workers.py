"""`serve` with `workers: N > 1`: this process supervises N serving processes on one port.

Each worker is `floorguard serve --config FILE --worker I`: the configuration as it applies
to worker `I` (`GuardServerConfig.for_worker`), listening with SO_REUSEPORT, so the kernel
spreads new connections over the workers; the floor, the slots and the waiting board are
shared through the configured store exactly as between replicas (docs/design.md §13). The
supervisor only starts, signals and restarts them: SIGTERM / SIGINT drain every worker and
it exits 0 when all of them did; SIGHUP reloads every worker; a worker that dies is started
again (a new replica name: its request ids never repeat a former self's in its log), unless
workers die within `QUICK_S` of starting `QUICK_DEATHS` times in a row — a configuration
that cannot serve — when it stops the rest and exits 1. Each worker gets SIGTERM if the
supervisor itself is killed (Linux's parent-death signal), so none is left orphaned.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from floorguard.clock import Clock, MonotonicClock

__all__ = ["supervise"]

log = logging.getLogger("floorguard.workers")

QUICK_S = 5.0
QUICK_DEATHS = 3
_POLL_S = 0.1
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """SIGTERM this worker when the supervisor dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(config_path: Path, index: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "floorguard", "serve", "--config", str(config_path)]
    return subprocess.Popen(  # the hook makes one syscall and takes no lock: safe here
        [*command, "--worker", str(index)],
        preexec_fn=_die_with_parent,  # noqa: PLW1509
    )


def supervise(
    config_path: Path,
    workers: int,
    *,
    drain_timeout_s: float,
    spawn: Callable[[Path, int], subprocess.Popen[bytes]] = _spawn,
) -> int:
    """Run `workers` workers of `config_path` until SIGTERM / SIGINT; 0 when every worker
    drained and exited 0, else 1."""
    supervisor = _Supervisor(config_path, workers, drain_timeout_s, spawn)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, supervisor.on_signal)
    return supervisor.run()


class _Supervisor:
    def __init__(
        self,
        config_path: Path,
        workers: int,
        drain_timeout_s: float,
        spawn: Callable[[Path, int], subprocess.Popen[bytes]],
        *,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._path, self._spawn, self._drain_s = config_path, spawn, drain_timeout_s
        self._now = (MonotonicClock() if clock is None else clock).now
        self._sleep = sleep
        self._received: list[int] = []
        self._children = {i: spawn(config_path, i) for i in range(workers)}
        self._started = dict.fromkeys(self._children, self._now())
        self._stopping_at: float | None = None
        self._failed = False
        self._quick = 0
        """Workers in a row that died within `QUICK_S` of starting."""

    def on_signal(self, signum: int, _: FrameType | None) -> None:
        self._received.append(signum)

    def run(self) -> int:
        while not self._done():
            self._take_signals()
            if self._stopping_at is None:
                self._restart_the_dead()
            self._sleep(_POLL_S)
        codes = {i: child.wait() for i, child in self._children.items()}
        if any(codes.values()):
            log.error("workers exited with %s", codes)
        return 1 if self._failed or any(codes.values()) else 0

    def _live(self) -> list[subprocess.Popen[bytes]]:
        return [child for child in self._children.values() if child.poll() is None]

    def _stop(self, *, failed: bool = False) -> None:
        self._failed |= failed
        if self._stopping_at is None:
            self._stopping_at = self._now()
            for child in self._live():
                child.send_signal(signal.SIGTERM)

    def _take_signals(self) -> None:
        while self._received:
            if self._received.pop(0) != signal.SIGHUP:
                self._stop()
                continue
            log.info("SIGHUP: every worker reloads its configuration")
            for child in self._live():
                child.send_signal(signal.SIGHUP)

    def _restart_the_dead(self) -> None:
        for index, child in self._children.items():
            code = child.poll()
            if code is None:
                continue
            lived = self._now() - self._started[index]
            self._quick = self._quick + 1 if lived < QUICK_S else 0
            if self._quick >= QUICK_DEATHS:
                log.error(
                    "worker %d exited with %s after %.1f s, the %d-th in a row to die within "
                    "%.0f s of starting: stopping the others", index, code, lived, self._quick,
                    QUICK_S,
                )  # fmt: skip
                self._stop(failed=True)
                return
            log.error("worker %d exited with %s after %.1f s: started again", index, code, lived)
            self._children[index] = self._spawn(self._path, index)
            self._started[index] = self._now()

    def _done(self) -> bool:
        """Stopping and every worker gone; one that outlives its drain is killed."""
        if self._stopping_at is None:
            return False
        live = self._live()
        if live and self._now() - self._stopping_at > self._drain_s + 10:
            for child in live:
                log.error("worker pid %d outlived its drain: killed", child.pid)
                child.kill()
            self._failed = True
        return not live
