"""`floorguard bench …`: throughput measured beside a reference in the same run.

The machine is shared and noisy, so every figure is the best of `repeats` alternating
measurements and is printed next to a reference measured in the same process; the ratio is
the number to compare across machines, not the absolute rate.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from floorguard._compiled import running
from floorguard.core.guard import Dispatch, Guard
from floorguard.core.request import Request
from floorguard.learners.adversaries import AlwaysAdmit
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import Scenario, marquee
from floorguard.sim.workloads import build_requests

__all__ = ["bench_fleet", "bench_sim"]


def _best(fn: Callable[[], float], repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def reference_loop(requests: list[Request], service_s: float, num_slots: int) -> float:
    """A bare heap-driven loop, no guard: arrivals and completions through one heap, FIFO
    into `num_slots` slots with a fixed service. Returns its wall time."""
    started = time.perf_counter()
    heap: list[tuple[float, int, int, Request | None]] = [
        (r.arrival_at, 1, i, r) for i, r in enumerate(requests)
    ]
    heapq.heapify(heap)
    queue: deque[Request] = deque()
    free, seq = num_slots, len(requests)
    while heap:
        at, kind, _, request = heapq.heappop(heap)
        if kind == 0:
            free += 1
        else:
            queue.append(request)  # type: ignore[arg-type]
        while free and queue:
            queue.popleft()
            free -= 1
            seq += 1
            heapq.heappush(heap, (at + service_s, 0, seq, None))
    return time.perf_counter() - started


def _decision_loop(guard_factory: Callable[[], Guard], requests: list[Request]) -> float:
    """Per request: admission, dispatch and completion through a bare guard (no backend)."""
    guard = guard_factory()
    started = time.perf_counter()
    for request in requests:
        now = request.arrival_at
        guard.on_arrival(request, now)
        for decision in guard.poll(now):
            if isinstance(decision, Dispatch):
                guard.finish(decision.request.request_id, now, "complete")
    return time.perf_counter() - started


def _reference_decision_loop(requests: list[Request]) -> float:
    """The same per-request shape with only a dict and a deque: the floor of any guard."""
    queue: deque[Request] = deque()
    in_flight: dict[object, Request] = {}
    started = time.perf_counter()
    for request in requests:
        queue.append(request)
        while queue:
            r = queue.popleft()
            in_flight[r.request_id] = r
            del in_flight[r.request_id]
    return time.perf_counter() - started


def bench_sim(*, duration_s: float = 600.0, repeats: int = 3) -> dict[str, Any]:
    scenario: Scenario = marquee(duration_s=duration_s)
    requests = build_requests(scenario.streams, np.random.default_rng(0).spawn(3)[0])
    n = len(requests)
    guarded = _best(lambda: simulate_once(scenario, seed=0, record=False).wall_s, repeats)
    traced = _best(lambda: simulate_once(scenario, seed=0, record=True).wall_s, repeats)
    reference = _best(lambda: reference_loop(requests, 0.42, scenario.slots[0]), repeats)
    config = scenario.guard_config()
    decision = _best(
        lambda: _decision_loop(lambda: Guard(config, learner=AlwaysAdmit()), requests), repeats
    )
    bare = _best(lambda: _reference_decision_loop(requests), repeats)
    return {
        "scenario": f"marquee, {duration_s:g} s of arrivals, guard + always-admit learner",
        "core": running(),
        "num_requests": n,
        "sim_requests_per_s": n / guarded,
        "sim_traced_requests_per_s": n / traced,
        "reference_requests_per_s": n / reference,
        "sim_over_reference": reference / guarded,
        "decision_us": decision / n * 1e6,
        "reference_decision_us": bare / n * 1e6,
        "decision_over_reference": decision / bare,
        "repeats": repeats,
    }


def bench_fleet(*, repeats: int = 3, **fleet: Any) -> dict[str, Any]:
    """Simulated requests per wall second at fleet scale (default 8 replicas × 64 backends
    × 50 assured tenants, leased slots: every lease call runs), beside the single-backend
    marquee in the same run (both record their decision logs)."""
    from floorguard.datacenter import Fleet, simulate_fleet  # noqa: PLC0415  # the datacenter is heavy

    scale = Fleet(**{"replicas": 8, "backends": 64, "tenants": 50, "floor": 2, **fleet})
    one = Fleet(
        **{**fleet, "replicas": 1, "backends": 1, "tenants": 1, "floor": 2},
        duration_s=scale.duration_s * 100,
    )  # the same simulator, one backend carrying the same per-backend load, as long
    single = marquee(duration_s=scale.duration_s * 10)
    n_single = simulate_once(single, seed=0, record=False).num_requests
    single_s = _best(lambda: simulate_once(single, seed=0, record=True).wall_s, repeats)

    def best(f: Fleet) -> Any:
        return min((simulate_fleet(f, seed=0, verify=False) for _ in range(repeats)),
                   key=lambda r: r.wall_s)  # fmt: skip

    big, small = best(scale), best(one)
    return {
        "fleet": f"{scale.replicas} replicas × {scale.backends} backends (C = {scale.slots}) × "
        f"{scale.tenants} assured tenants, {scale.slot_mode} slots, {scale.duration_s:g} s",
        "fleet_requests": big.num_requests,
        "fleet_requests_per_s": big.requests_per_wall_s,
        "one_backend_fleet_requests_per_s": small.requests_per_wall_s,
        "fleet_over_one_backend": big.requests_per_wall_s / small.requests_per_wall_s,
        "single_backend_simulator_requests_per_s": n_single / single_s,
        "fleet_over_single_backend_simulator": big.requests_per_wall_s / (n_single / single_s),
        "repeats": repeats,
    }
