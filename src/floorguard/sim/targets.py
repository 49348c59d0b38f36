"""Measure a profile's SPEC §5 targets on the simulator itself.

Each figure comes from runs through the full guard, measured from the trace exactly as any
other run is (service = dispatch → completion). `tests/unit/test_calibration.py` compares
them with the published targets; `floorguard bench calibration` prints them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from floorguard.analysis.records import fold_trace
from floorguard.core.contract import Contract, ContractClass
from floorguard.profiles import ServiceProfile
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import Scenario, marquee
from floorguard.sim.workloads import FixedLength, PacedArrivals, SyntheticStream

__all__ = [
    "CalibrationReport",
    "fit_coupling_shape",
    "fit_scale",
    "light_mean_ms",
    "measure_profile",
    "saturated_capacity",
]

_NO_DEADLINE_S = 1e6


@dataclass(frozen=True)
class CalibrationReport:
    profile: str
    batch1_median_ms: float
    light_mean_ms: float
    flood_mean_ms: float
    flood_max_ms: float
    flood_num_completed: int
    mu_sat_per_s: float
    full_batch_ms: dict[int, float]
    ceiling_ms: float
    """`s_max(16)` of the profile."""


def _services(scenario: Scenario, seeds: range) -> list[float]:
    out: list[float] = []
    for seed in seeds:
        run = simulate_once(scenario, seed=seed)
        assert run.events is not None
        out += [r.service_s for r in fold_trace(run.events).records if r.outcome == "completed"]
    return out


def _paced(
    profile: ServiceProfile, *, rate_per_s: float, duration_s: float, tokens: int, slots: int = 4
) -> Scenario:
    """One tenant, paced arrivals, no deadline pressure and no doom gate."""
    return Scenario(
        name="paced",
        contracts=(Contract("probe", ContractClass.OPPORTUNISTIC, _NO_DEADLINE_S),),
        streams=(
            SyntheticStream("probe", PacedArrivals(rate_per_s), FixedLength(tokens), duration_s),
        ),
        profile=profile,
        slots=(slots,),
        doom_gate=False,
    )


def saturated_capacity(profile: ServiceProfile, tokens: int, slots: int = 4) -> tuple[float, float]:
    """(completions per second, mean service) with a queue that never empties: 400 requests
    arrive within a few seconds; the middle 80 % of completions are measured."""
    scenario = _paced(profile, rate_per_s=400 / 2.0, duration_s=2.0, tokens=tokens, slots=slots)
    run = simulate_once(scenario, seed=0)
    assert run.events is not None
    done = sorted(
        (r for r in fold_trace(run.events).records if r.outcome == "completed"),
        key=lambda r: r.ended_at,
    )
    lo, hi = len(done) // 10, len(done) * 9 // 10
    steady = done[lo:hi]
    rate = (len(steady) - 1) / (steady[-1].ended_at - steady[0].ended_at)
    return rate, float(np.mean([r.service_s for r in steady]))


def light_mean_ms(profile: ServiceProfile, seeds: range = range(10)) -> float:
    """Mean service of the marquee's assured stream alone (SPEC §5's "light load")."""
    scenario = replace(marquee(opportunistic_rate_per_s=0), profile=profile)
    return float(np.mean(_services(scenario, seeds))) * 1e3


def _bisect(
    f: Callable[[float], float],
    target: float,
    lo: float,
    hi: float,
    *,
    increasing: bool,
    iterations: int = 30,
) -> float:
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_coupling_shape(base: ServiceProfile, target_light_ms: float = 386.0) -> float:
    """The `coupling_shape` whose light-load mean is `target_light_ms` (smaller shape, more
    early slowdown, longer light-load service)."""
    return _bisect(
        lambda r: light_mean_ms(replace(base, coupling_shape=r)),
        target_light_ms,
        0.0,
        1.0,
        increasing=False,
    )


def fit_scale(base: ServiceProfile, name: str, target_light_ms: float) -> float:
    """The duration scale factor that gives `base`'s shape a light-load mean of
    `target_light_ms`."""
    return _bisect(
        lambda f: light_mean_ms(base.scaled(name, f)), target_light_ms, 0.05, 2.0, increasing=True
    )


def measure_profile(profile: ServiceProfile, *, num_flood_reps: int = 24) -> CalibrationReport:
    batch1 = _services(_paced(profile, rate_per_s=0.5, duration_s=200.0, tokens=16), range(1))
    flood = _services(replace(marquee(), profile=profile), range(num_flood_reps))
    mu_sat, _ = saturated_capacity(profile, 16)
    full = {tokens: saturated_capacity(profile, tokens)[1] * 1e3 for tokens in (64, 128, 256)}
    return CalibrationReport(
        profile=profile.name,
        batch1_median_ms=float(np.median(batch1)) * 1e3,
        light_mean_ms=light_mean_ms(profile),
        flood_mean_ms=float(np.mean(flood)) * 1e3,
        flood_max_ms=max(flood) * 1e3,
        flood_num_completed=len(flood),
        mu_sat_per_s=mu_sat,
        full_batch_ms=full,
        ceiling_ms=profile.ceiling.at(16) * 1e3,
    )
