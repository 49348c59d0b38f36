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

from floorguard.analysis.plot import subplots
from floorguard.analysis.summary import pool_runs
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.proxy.process.app import GuardRunner, create_app
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
                # the excess refused, as published: the table's assured lateness is then
                # the floor's alone (serve's default `spare` would serve some as surplus)
                {
                    "tenant": ASSURED,
                    "class": "assured",
                    "floor": 6,
                    "deadline_ms": 1820,
                    "excess_policy": "reject",
                },
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


WORKLOAD = (
    "assured Poisson 6/s (B = 6 per 1-s window), opportunistic gamma 16/s (CV 2.9), "
    "ℓ = 16, d = 1820 ms; v100-moe emulated, C = 4"
)

CAPTION = (
    "attainment: of the assured requests within the floor (the first B of each window), the "
    "share completed by its deadline.  miss: late / admitted.  unmet: (refused + dropped + "
    "late + failed + aborted) / offered — the guard refuses assured requests beyond B (429), "
    "so its unmet counts refusals, not lateness."
)


def run_demo(*, duration_s: float = 12.0, seed: int = 0, png: Path | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    result = asyncio.run(_demo(duration_s, seed))
    result["wall_s"] = time.perf_counter() - started
    result["workload"] = f"{duration_s:g} s: {WORKLOAD}"
    result["seed"] = seed
    if png is not None:
        try:
            _plot(result, png)
            result["png"] = str(png)
        except OSError as exc:  # a read-only root: the PNG's directory, matplotlib's cache
            result["png"] = None
            result["png_error"] = (
                f"the figure was not written ({exc}); pass --png PATH in a writable "
                "directory (and, where no home or temporary directory is writable, set "
                "MPLCONFIGDIR to one)"
            )
        except ModuleNotFoundError as exc:  # installed without the `eval` extra
            result["png"] = None
            result["png_error"] = (
                f"the figure was not drawn ({exc.name} is not installed: "
                "pip install 'floorguard[eval]')"
            )
    return result


_SIDES = (("guard", "#1a7f37"), ("unguarded", "#9a6700"))


def _bars(ax: Any, values: list[float], *, ylabel: str, fmt: str, top: float | None) -> None:
    names = [side for side, _ in _SIDES]
    bars = ax.bar(names, values, color=[colour for _, colour in _SIDES], width=0.55)
    ax.bar_label(bars, labels=[fmt.format(v) for v in values], padding=3)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top if top is not None else max([*values, 1e-9]) * 1.25)
    ax.spines[["top", "right"]].set_visible(False)


def _plot(result: dict[str, Any], png: Path) -> None:
    guard, unguarded = result["guard"], result["unguarded"]
    fig, axes = subplots(2, 2, figsize=(9.5, 7.2))
    (attain, miss), (goodput, outcomes) = axes

    def pct(side: dict[str, Any], *key: str) -> float:
        value = side[key[0]][key[1]] if len(key) == 2 else side[key[0]]
        return 100.0 * (value or 0.0)

    _bars(attain, [pct(guard, "assured", "attainment"), pct(unguarded, "assured", "attainment")],
          ylabel="floor-entitled on time (%)", fmt="{:.1f} %", top=112)  # fmt: skip
    attain.set_title("Is the floor served by its deadline?  (higher is better)", fontsize=10)
    _bars(miss, [pct(guard, "assured", "miss"), pct(unguarded, "assured", "miss")],
          ylabel="assured late / admitted (%)", fmt="{:.1f} %", top=112)  # fmt: skip
    miss.set_title("Are admitted assured requests late?  (lower is better)", fontsize=10)
    _bars(goodput, [guard["goodput_per_s"] or 0.0, unguarded["goodput_per_s"] or 0.0],
          ylabel="completed by the deadline (req/s)", fmt="{:.1f} /s", top=None)  # fmt: skip
    goodput.set_title("How much finishes on time?  (higher is better)", fontsize=10)

    parts = (("on time", "#1a7f37"), ("late", "#cf222e"), ("refused", "#bc4c00"),
             ("dropped", "#8250df"))  # fmt: skip
    bottoms = [0.0, 0.0]
    for part, colour in parts:
        counts = []
        for side in (guard, unguarded):
            a = side["assured"]
            counts.append(
                {
                    "on time": a["completed"] - a["late"],
                    "late": a["late"],
                    "refused": a["rejected"],
                    "dropped": a["dropped"],
                }[part]
            )
        bars = outcomes.bar(["guard", "unguarded"], counts, bottom=bottoms, color=colour,
                            width=0.55, label=part)  # fmt: skip
        outcomes.bar_label(bars, labels=[str(c) if c else "" for c in counts], label_type="center",
                           color="white", fontsize=9)  # fmt: skip
        bottoms = [b + c for b, c in zip(bottoms, counts, strict=True)]
    outcomes.set_ylabel("assured requests")
    outcomes.set_title("What became of every assured request?", fontsize=10)
    outcomes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    outcomes.spines[["top", "right"]].set_visible(False)

    fig.suptitle("floorguard demo: the same bursty workload, guarded and not", y=0.99)
    subtitle = (
        f"{result['workload']}\nseed {result['seed']} · {result['num_requests']} requests "
        "per side, fired open-loop at both at once"
    )
    fig.text(0.5, 0.955, subtitle, ha="center", va="top", fontsize=8.5, color="#57606a")
    fig.text(0.01, 0.01, CAPTION, fontsize=8, color="#57606a", wrap=True)
    fig.tight_layout(rect=(0, 0.07, 1, 0.9))
    fig.savefig(png, dpi=110)
