"""`floorguard bench calibration`: each service profile against the published targets.

Every target of docs/design.md §5/§11 (`sim.targets.TARGETS`) beside each profile's figure and its
relative residual, and the quantiles of light-load and flood service beside the published
spread. `--fit` re-runs the least-squares fit of v100-moe (and the Ada scale on it) and
reports the fitted parameters beside the shipped ones.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from floorguard.profiles import ADA_FP8, ADA_SCALE, PROFILES, V100_MOE
from floorguard.sim.targets import (
    ADA_BASE_RATE_PER_S,
    ADA_BASE_SERVICE_MS,
    FIT_PARAMETERS,
    TARGETS,
    fit_profile,
    fit_scale,
    flood_services,
    light_services,
    measure_figures,
    paced_services,
    residuals,
    service_quantiles,
)

__all__ = ["PUBLISHED_SPREAD", "bench_calibration", "render_calibration"]

PUBLISHED_SPREAD = {
    "light": "a 386 ms mean; 0.4 % at 234–236 ms, the batch-1 floor; nothing below it",
    "flood": "mean ≈ 460 ms; ≥ 281 ms batched; 601 ms at most; never above 660 ms",
}


def bench_calibration(*, fit: bool = False, progress: Any = None) -> dict[str, Any]:
    profiles = {name: measure_figures(p) for name, p in PROFILES.items()}
    out: dict[str, Any] = {
        "targets": [
            {
                "key": t.key,
                "what": t.what,
                "published": t.published,
                **{name: figures[t.key] for name, figures in profiles.items()},
                "residual": residuals(profiles["v100-moe"])[t.key],
            }
            for t in TARGETS
        ],
        "sum_of_squares": sum(r**2 for r in residuals(profiles["v100-moe"]).values()),
        "ceiling": {
            name: {
                "s_max_16_ms": f["ceiling_ms"],
                "flood_above": f["flood_above_ceiling"],
                "flood_n": f["flood_n"],
            }
            for name, f in profiles.items()
        },
        "quantiles": {
            "light": service_quantiles(light_services(V100_MOE)),
            "flood": service_quantiles(flood_services(V100_MOE)),
        },
        "published_spread": PUBLISHED_SPREAD,
        "ada_base_service": {
            "published": ADA_BASE_SERVICE_MS,
            "ada-fp8": float(np.mean(paced_services(ADA_FP8, ADA_BASE_RATE_PER_S))) * 1e3,
        },
        "parameters": {k: getattr(V100_MOE, k) for k in FIT_PARAMETERS},
    }
    if fit:
        fitted, figures = fit_profile(replace(V100_MOE), progress=progress)
        out["fit"] = {
            "parameters": {k: getattr(fitted, k) for k in FIT_PARAMETERS},
            "sum_of_squares": sum(r**2 for r in residuals(figures).values()),
            "ada_scale": fit_scale(fitted, "ada-fp8"),
            "shipped_ada_scale": ADA_SCALE,
        }
    return out


def render_calibration(result: dict[str, Any], console: Console) -> None:
    names = list(PROFILES)
    table = Table(title="published targets (docs/design.md §5, §11) against each profile")
    for column in ("target", "published", *names, "v100 residual"):
        table.add_column(column, justify="left" if column == "target" else "right")
    for row in result["targets"]:
        table.add_row(
            row["key"],
            f"{row['published']:.4g}",
            *(f"{row[n]:.4g}" for n in names),
            f"{row['residual']:+.1%}",
        )
    console.print(table)
    for row in result["targets"]:
        console.print(f"  {row['key']}: {row['what']}", style="dim")
    console.print(f"v100-moe sum of squared relative residuals: {result['sum_of_squares']:.4f}")
    for name, c in result["ceiling"].items():
        console.print(
            f"{name}: s_max(16) = {c['s_max_16_ms']:.0f} ms; flood services above it: "
            f"{c['flood_above']:.0f} of {c['flood_n']:.0f}"
        )
    quantiles = Table(title="v100-moe service quantiles (ms)")
    keys = [k for k in result["quantiles"]["light"] if k.startswith("q")]
    heads = {"q0": "min", "q1": "max"}
    for column in ("load", *(heads.get(k, f"{float(k[1:]):.1%}") for k in keys), "mean", "n"):
        quantiles.add_column(column, justify="right")
    for load, q in result["quantiles"].items():
        quantiles.add_row(load, *(f"{q[k]:.0f}" for k in keys), f"{q['mean']:.0f}", f"{q['n']:.0f}")
    console.print(quantiles)
    for load, spread in result["published_spread"].items():
        console.print(f"  published {load}: {spread}")
    console.print(
        f"ada-fp8 mean service at its base cell (paced {ADA_BASE_RATE_PER_S:g}/s alone): "
        f"{result['ada_base_service']['ada-fp8']:.1f} ms "
        f"(published {result['ada_base_service']['published']:.0f})"
    )
    if "fit" in result:
        fit = result["fit"]
        console.print(
            f"fit: sum of squares {fit['sum_of_squares']:.4f} (shipped "
            f"{result['sum_of_squares']:.4f}); ada scale {fit['ada_scale']:.4f} (shipped "
            f"{fit['shipped_ada_scale']:.4f})"
        )
        for k, v in fit["parameters"].items():
            console.print(f"  {k}: {v:.6g} (shipped {result['parameters'][k]:.6g})")
