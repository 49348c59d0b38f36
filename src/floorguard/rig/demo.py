"""`floorguard demo`: the HTTP guard for real on loopback, beside an unguarded path.

Two identical emulated backends (v100-moe, 4 slots); the guard (JWT identity, B = 6,
d = 1820 ms, always-admit learner) in front of one; the other takes requests directly
(admit-all, FIFO — what runs without a floor). The same bursty two-tenant workload — assured
Poisson 6/s, opportunistic gamma arrivals at 16/s with interarrival CV 2.9, ℓ = 16 — is fired
open-loop at both at once; each side is measured from the client.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import jwt
import numpy as np
from aiohttp import web

from floorguard.analysis.summary import pool_runs
from floorguard.experiments.figures import subplots
from floorguard.proxy.app import GuardRunner, create_app
from floorguard.proxy.config import GuardServerConfig
from floorguard.rig.emulator import Emulator, create_emulator_app
from floorguard.rig.loadgen import measure_client, replay
from floorguard.sim.workloads import (
    FixedLength,
    GammaArrivals,
    PoissonArrivals,
    SyntheticStream,
    build_requests,
)

__all__ = ["run_demo"]

ASSURED, OPPORTUNISTIC = "acme", "free-tier"


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = GuardRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _guard_config(backend: str, secret: str) -> GuardServerConfig:
    return GuardServerConfig.model_validate(
        {
            "contracts": [
                {"tenant": ASSURED, "class": "assured", "floor": 6, "deadline_ms": 1820},
                {"tenant": OPPORTUNISTIC, "class": "opportunistic", "deadline_ms": 1820},
            ],
            "backends": [{"url": backend, "slots": 4}],
            "identity": {"mode": "jwt", "jwt": {"algorithms": ["HS256"], "secret": secret}},
        }
    )


async def _demo(duration_s: float, seed: int) -> dict[str, Any]:
    secret = secrets.token_hex(32)
    runners = []
    try:
        for emulator_seed in (1, 2):
            runners.append(
                await _serve(create_emulator_app(Emulator("v100-moe", 4, seed=emulator_seed)))
            )
        config = _guard_config(runners[0][1], secret)
        runners.append(await _serve(create_app(config)))
        guard_url, direct_url = runners[2][1], runners[1][1]
        streams = [
            SyntheticStream(ASSURED, PoissonArrivals(6.0), FixedLength(16), duration_s),
            SyntheticStream(OPPORTUNISTIC, GammaArrivals(16.0, 2.9), FixedLength(16), duration_s),
        ]
        requests = build_requests(streams, np.random.default_rng(seed))
        expires = time.time() + 3600
        headers = {
            t: {
                "Authorization": "Bearer "
                + jwt.encode({"sub": t, "exp": expires}, secret, algorithm="HS256")
            }
            for t in (ASSURED, OPPORTUNISTIC)
        }
        guarded, direct = await asyncio.gather(
            replay(requests, guard_url, headers), replay(requests, direct_url, {})
        )
        guard_config = config.guard_config()
        return {
            "guard": pool_runs([measure_client(guarded, guard_config)]),
            "unguarded": pool_runs([measure_client(direct, guard_config)]),
            "num_requests": len(requests),
        }
    finally:
        for runner, _ in runners:
            await runner.cleanup()


def run_demo(*, duration_s: float = 12.0, seed: int = 0, png: Path | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    result = asyncio.run(_demo(duration_s, seed))
    result["wall_s"] = time.perf_counter() - started
    result["workload"] = (
        f"{duration_s:g} s: assured Poisson 6/s (B = 6), opportunistic gamma "
        "16/s CV 2.9, ℓ = 16, d = 1820 ms; v100-moe emulated, C = 4"
    )
    if png is not None:
        _plot(result, png)
        result["png"] = str(png)
    return result


def _plot(result: dict[str, Any], png: Path) -> None:
    labels = ["assured miss", "assured unmet", "floor attainment", "opportunistic unmet"]
    fig, ax = subplots(figsize=(7.5, 3.8))
    for i, side in enumerate(("guard", "unguarded")):
        s = result[side]
        values = [
            s["assured"]["miss"] or 0,
            s["assured"]["unmet"] or 0,
            s["assured"]["attainment"] or 0,
            s["opportunistic"]["unmet"] or 0,
        ]
        ax.bar(np.arange(len(labels)) + (i - 0.5) * 0.38, values, 0.38, label=side)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylim(0, 1.05)
    ax.set_title("floorguard demo: the same bursty workload, guarded and not")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
