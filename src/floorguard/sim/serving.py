"""The simulated backends on an engine: each backend's next completion is one live event,
rescheduled whenever its batch changes (a stale one is skipped by its version). The one
simulation loop both drivers share — `sim/run.py` (one stack) and `datacenter.py` (a fleet
of replicas) extend it — so completions are scheduled, invalidated and handled one way.

A base class, not a part the driver holds with a callback: a `Serving` holding its owner's
bound method would be a reference cycle that keeps a finished run (its guard, its whole
decision log) alive until the cyclic collector runs; that cost the traced simulator 10 %
more instructions per request (docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from floorguard.core.request import RequestId
from floorguard.sim.backend import SimBackend
from floorguard.sim.engine import Engine, Priority

__all__ = ["Serving"]


@mypyc_attr(allow_interpreted_subclasses=True)  # the fleet simulator extends it
class Serving:
    def __init__(self, engine: Engine, backends: Sequence[SimBackend]) -> None:
        self.engine = engine
        self.backends = list(backends)
        self._versions = [0] * len(self.backends)

    def on_completion(self, index: int, done: list[RequestId], now: float) -> None:
        """Backend `index` finished `done` at `now` (the driver ends them and refills)."""
        raise NotImplementedError

    def reschedule(self, index: int) -> None:
        """Invalidate the backend's pending completion event and schedule the new one."""
        self._versions[index] += 1
        at = self.backends[index].next_completion_at()
        if at is not None:
            self.engine.schedule(
                at, Priority.COMPLETION, self._on_completion, (index, self._versions[index])
            )

    def _on_completion(self, payload: tuple[int, int], now: float) -> None:
        index, version = payload
        if version != self._versions[index]:
            return
        self.on_completion(index, self.backends[index].complete_due(now), now)
