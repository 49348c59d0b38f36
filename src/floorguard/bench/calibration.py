"""`floorguard bench calibration`: each service profile against SPEC §5's targets."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from floorguard.profiles import PROFILES, V100_MOE
from floorguard.sim.targets import fit_coupling_shape, fit_scale, measure_profile

__all__ = ["bench_calibration"]


def bench_calibration(*, fit: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "targets": {
            "batch1_median_ms": 236,
            "light_mean_ms": 386,
            "flood_mean_ms": 460,
            "flood_max_ms": "≈600 in ~3000 requests",
            "mu_sat_per_s": "9.6–9.7",
            "full_batch_ms": {t: 183 + 14.9 * t for t in (64, 128, 256)},
            "ceiling_ms": 660,
            "ada_light_mean_ms": 214,
        },
        "profiles": {name: asdict(measure_profile(p)) for name, p in PROFILES.items()},
        "linear_coupling": asdict(measure_profile(replace(V100_MOE, coupling_shape=1.0))),
    }
    if fit:
        shape = fit_coupling_shape(replace(V100_MOE, coupling_shape=1.0))
        fitted = replace(V100_MOE, coupling_shape=shape)
        out["fit"] = {
            "v100_coupling_shape": shape,
            "ada_scale": fit_scale(fitted, "ada-fp8", 214.0),
        }
    return out
