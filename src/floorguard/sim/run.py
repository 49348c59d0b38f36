"""Drive the guard core on a virtual clock: the same `Guard` the HTTP proxy runs."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from floorguard.baselines.registry import StackOptions, create_stack
from floorguard.core.events import TraceEvent
from floorguard.core.learner import Learner
from floorguard.core.request import Request, RequestId
from floorguard.core.surface import Dispatch, Stack
from floorguard.learners.registry import LearnerOptions, create_learner
from floorguard.sim.backend import KvBatchingBackend, SimBackend, create_backend
from floorguard.sim.engine import Engine, Priority
from floorguard.sim.scenarios import Scenario
from floorguard.sim.serving import Serving
from floorguard.sim.workloads import build_requests

__all__ = ["SimRun", "scenario_requests", "simulate_once"]


@dataclass
class SimRun:
    seed: int
    guard: Stack
    """The stack that ran (the guard, or a comparison stack)."""
    events: list[TraceEvent] | None
    num_requests: int
    end_at: float
    wall_s: float
    preemptions: int = 0
    """Sequences the backends' KV caches preempted (`Scenario.backend_kv_blocks`)."""
    preempted: dict[str, int] = field(default_factory=dict)
    """Those preemptions by the tenant of the sequence preempted."""


class _Simulation(Serving):
    def __init__(
        self, guard: Stack, backends: list[SimBackend], *, record_first_token: bool
    ) -> None:
        super().__init__(Engine(), backends)
        self.guard = guard
        self._record_first_token = record_first_token
        self._kv = any(type(b) is KvBatchingBackend for b in backends)

    def on_arrival(self, request: Request, now: float) -> None:
        self.guard.on_arrival(request, now, request.arrival_at)
        for index in self._dispatch(now):
            self.reschedule(index)
            if self._kv:
                self._first_tokens(index)

    def _dispatch(self, now: float) -> set[int] | tuple[()]:
        """Start what the guard dispatches; returns the backends whose batch changed."""
        decisions = self.guard.poll(now)
        if not decisions:  # most polls (a full backend): nothing to start
            return ()
        touched: set[int] = set()
        for decision in decisions:
            if type(decision) is Dispatch:
                first_token_at = self.backends[decision.backend].join(decision.request, now)
                if self._record_first_token and first_token_at != math.inf:
                    self.engine.schedule(
                        first_token_at,
                        Priority.FIRST_TOKEN,
                        self.on_first_token,
                        decision.request.request_id,
                    )
                touched.add(decision.backend)
        return touched

    def _first_tokens(self, index: int) -> None:
        """First tokens of requests a KV cache held back (`KvBatchingBackend`)."""
        backend = self.backends[index]
        if type(backend) is KvBatchingBackend and backend.first_tokens:
            for request_id, at in backend.first_tokens:
                if self._record_first_token:
                    self.engine.schedule(at, Priority.FIRST_TOKEN, self.on_first_token, request_id)
            backend.first_tokens.clear()

    def on_completion(self, index: int, done: list[RequestId], now: float) -> None:
        for request_id in done:
            self.guard.finish(request_id, now, "complete")
        touched = self._dispatch(now)
        # One event per changed backend, none left stale: this backend's first unless it
        # started work again, then those that did (the order of the events left live when
        # it was rescheduled before the dispatch as well).
        if index not in touched:
            self.reschedule(index)
        for other in touched:
            self.reschedule(other)
        if self._kv:
            for changed in {index, *touched}:
                self._first_tokens(changed)

    def on_first_token(self, request_id: RequestId, now: float) -> None:
        self.guard.on_first_token(request_id, now)


def scenario_requests(scenario: Scenario, seed: int) -> list[Request]:
    """The requests run `seed` of `scenario` offers: the same arrivals whether the simulator
    or a real backend serves them (`floorguard experiment run --backend`)."""
    return build_requests(scenario.streams, np.random.default_rng(seed).spawn(3)[0])


def simulate_once(
    scenario: Scenario,
    *,
    seed: int,
    policy: str = "guard",
    learner: str | Callable[[np.random.Generator], Learner] = "always-admit",
    learner_options: LearnerOptions | None = None,
    stack_options: StackOptions | None = None,
    record: bool = True,
) -> SimRun:
    """One seeded run of `policy` (`--policy`): every offered request ends in one terminal
    outcome before it returns."""
    started = time.perf_counter()
    _, backend_rng, learner_rng = np.random.default_rng(seed).spawn(3)
    requests = scenario_requests(scenario, seed)
    events: list[TraceEvent] | None = [] if record else None
    the_learner = (
        create_learner(learner, learner_rng, learner_options)
        if isinstance(learner, str)
        else learner(learner_rng)
    )
    guard = create_stack(
        policy,
        scenario.guard_config(),
        learner=the_learner,
        options=stack_options,
        sink=events.append if events is not None else None,
        started_at=scenario.schedule.origin_at,
    )
    backend_rngs = backend_rng.spawn(len(scenario.slots))
    kv = scenario.backend_kv_blocks or (None,) * len(scenario.slots)
    priorities = scenario.backend_priority_of()
    backends = [
        create_backend(
            scenario.profile,
            c,
            r,
            blocks,
            block_tokens=scenario.kv_block_tokens,
            priorities=priorities,
        )
        for c, r, blocks in zip(scenario.slots, backend_rngs, kv, strict=True)
    ]
    sim = _Simulation(guard, backends, record_first_token=record)
    sim.engine.preload(Priority.ARRIVAL, sim.on_arrival, [r.arrival_at for r in requests], requests)
    sim.engine.run()
    if guard.num_in_flight or guard.num_queued:
        raise RuntimeError("simulation ended with work left: a request has no terminal outcome")
    caches = [b for b in backends if type(b) is KvBatchingBackend]
    preempted = dict(sum((b.preempted for b in caches), Counter[str]()))
    wall_s = time.perf_counter() - started
    return SimRun(
        seed,
        guard,
        events,
        len(requests),
        sim.engine.now,
        wall_s,
        sum(b.preemptions for b in caches),
        preempted,
    )
