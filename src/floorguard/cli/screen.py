"""`floorguard screen`: the static timing screen (SPEC §9) for one configuration."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from floorguard.errors import FloorguardError
from floorguard.screen.model import (
    AGGREGATIONS,
    DEFAULT_MODEL,
    ScreenConfig,
    ScreenModel,
    aggregate,
    read_service_samples,
    screen,
)

__all__ = ["register", "run"]


def register(commands: Any) -> None:
    scr = commands.add_parser("screen", help="the static timing screen (SPEC §9)")
    scr.add_argument(
        "--config",
        type=Path,
        required=True,
        help="YAML or JSON: floor, slots, window_s, dispatch, admission, "
        "assured_rate_per_s, opportunistic_rate_per_s, service_s, s_max_s",
    )
    scr.add_argument("--deadline-ms", type=float, required=True)
    scr.add_argument(
        "--service-samples",
        type=Path,
        help="service times (s): one per line, a JSON list, or a decision log",
    )
    scr.add_argument(
        "--aggregation",
        choices=AGGREGATIONS,
        default="p99",
        help="how ŝ is taken from the samples (default p99: with it both screens' accepts "
        "held in every grid cell of E17 and E18; see docs/screen.md)",
    )
    scr.add_argument(
        "--model",
        choices=[m.value for m in ScreenModel],
        default=DEFAULT_MODEL.value,
        help="first-moment (the published kind: mean service, a mean wait) or makespan "
        f"(floorguard's conservative bound); default {DEFAULT_MODEL.value}, the one whose "
        "accepts the evaluation shows can be trusted (docs/screen.md)",
    )
    scr.add_argument("--json", action="store_true")

    scr.set_defaults(run=run)


def run(args: argparse.Namespace, console: Console) -> int:
    try:
        data = yaml.safe_load(args.config.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FloorguardError(f"--config {args.config}: cannot read it ({exc})") from exc
    if not isinstance(data, dict):
        raise FloorguardError(f"--config {args.config}: expected a mapping of keys to values")
    service_s = None
    if args.service_samples is not None:
        samples = read_service_samples(str(args.service_samples))
        service_s = aggregate(samples, args.aggregation)
    verdict = screen(ScreenConfig.from_dict(data, service_s), args.deadline_ms / 1e3, args.model)
    if args.json:
        print(json.dumps(verdict.as_dict(), indent=2))
    else:
        console.print(
            ("ACCEPT" if verdict.accept else "REJECT") + ": " + "; ".join(verdict.reasons),
            markup=False,
        )
        region = (
            "inside"
            if verdict.inside_region
            else ("outside (" + "; ".join(verdict.region_reasons) + ")")
        )
        console.print(f"SPEC §6 region: {region}", markup=False)
        console.print(
            "A screen, not a proof: P95 is an aggregate obligation (SPEC §1); the "
            "runtime guard enforces the per-request floor.",
            markup=False,
        )
    return 0
