"""`floorguard bench tenants`: what a decision and a configuration cost as the tenants and
the backends grow, each cell beside the smallest one measured in the same run.

Per cell: the core configuration built and validated (`GuardConfig`, what `serve` and a
reload build per pool), and µs per decision — admission, dispatch and completion of each
request through the shipped `Guard` (always-admit learner, every request finishing at
once), the requests spread over every tenant. Not measured here: `serve`'s own start and
reload (its start report, the pydantic configuration) and its memory per tenant.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from floorguard._compiled import running
from floorguard.bench.sim import _best, _decision_loop
from floorguard.core.contract import Contract, ContractClass, GuardConfig
from floorguard.core.guard import Guard
from floorguard.core.request import Request
from floorguard.learners.adversaries import AlwaysAdmit

__all__ = ["bench_tenants"]

TENANTS = (10, 1_000, 100_000)
BACKENDS = (1, 16, 256)


def _config(tenants: int, backends: int) -> GuardConfig:
    """Half the tenants assured (a floor of 2, 20 s deadline), half opportunistic; `backends`
    backends of 8 slots."""
    contracts = tuple(
        Contract(f"t{t}", ContractClass.ASSURED, 20.0, 2)
        if t % 2 == 0
        else Contract(f"t{t}", ContractClass.OPPORTUNISTIC, 20.0)
        for t in range(tenants)
    )
    return GuardConfig(contracts, slots=(8,) * backends)


def _requests(tenants: int, n: int) -> list[Request]:
    """`n` requests 1 ms apart, round-robin over the tenants (a prime stride, so assured and
    opportunistic alternate whatever the count)."""
    return [
        Request(i, f"t{(i * 7919) % tenants}", i * 1e-3, num_output_tokens=64) for i in range(n)
    ]


def bench_tenants(
    *,
    tenants: tuple[int, ...] = TENANTS,
    backends: tuple[int, ...] = BACKENDS,
    requests: int = 20_000,
    repeats: int = 3,
) -> dict[str, Any]:
    rows = []
    for t in tenants:
        reqs = _requests(t, requests)
        for b in backends:
            config = _config(t, b)

            def build(t: int = t, b: int = b) -> float:
                return _timed(lambda: _config(t, b))

            def decide(config: GuardConfig = config, reqs: list[Request] = reqs) -> float:
                return _decision_loop(lambda: Guard(config, learner=AlwaysAdmit()), reqs)

            config_s = _best(build, repeats)
            decision_s = _best(decide, repeats)
            rows.append(
                {
                    "tenants": t,
                    "backends": b,
                    "config_s": config_s,
                    "decision_us": decision_s / requests * 1e6,
                }
            )
    base = rows[0]["decision_us"]
    for row in rows:
        row["decision_over_smallest"] = row["decision_us"] / base
    return {
        "core": running(),
        "requests": requests,
        "repeats": repeats,
        "rows": rows,
    }


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
