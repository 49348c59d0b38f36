"""`floorguard screen`: the static timing screen (docs/design.md §9) for one configuration."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:  # a serve config's modules load with it (`_from_serve_config`), not for --help
    from floorguard.proxy.config.guard import GuardServerConfig

__all__ = ["register", "run"]


def register(commands: Any) -> None:
    scr = commands.add_parser("screen", help="the static timing screen (docs/design.md §9)")
    scr.add_argument(
        "--config",
        type=Path,
        required=True,
        help="YAML or JSON: floor, slots, window_s, dispatch, admission, "
        "assured_rate_per_s, opportunistic_rate_per_s, service_s, s_max_s; or a "
        "`floorguard serve` config (B = its assured floors, C = its slots, ŝ from its profile)",
    )
    scr.add_argument(
        "--opportunistic-per-s",
        type=float,
        default=0.0,
        help="with a serve config: the admitted opportunistic load (default 0)",
    )
    scr.add_argument(
        "--deadline-ms",
        type=float,
        help="the deadline to screen against; with a serve config, default: each pool's "
        "tightest assured contract deadline",
    )
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


def _from_serve_config(
    args: argparse.Namespace, service_s: float | None, console: Console
) -> dict[str | None, ScreenConfig]:
    """The screen's view of a `floorguard serve` config, per pool (`models:`; one pool
    without): B = the assured tenants' floors summed, C = its slots summed, its window and
    dispatch; ŝ from `--service-samples`, else `--aggregation` of its profile's services
    under a saturating flood (simulated, C = 4); `s_max` its profile's ceiling at
    `limits.default_max_tokens`."""
    from floorguard.proxy.config.guard import load_config  # noqa: PLC0415  # see the imports

    config = load_config(args.config)
    return {
        name: _pool_screen(args, pool, service_s, console, name)
        for name, pool in config.pools().items()
    }


def _pool_screen(
    args: argparse.Namespace,
    config: GuardServerConfig,
    service_s: float | None,
    console: Console,
    name: str | None,
) -> ScreenConfig:
    if service_s is None and config.profile is None:
        raise FloorguardError(
            f"--config {args.config}: no profile to take ŝ from; give --service-samples"
        )
    from floorguard.proxy.process.serve import screen_config  # noqa: PLC0415

    derived = screen_config(
        config,
        service_s=service_s,
        aggregation=args.aggregation,
        opportunistic_per_s=args.opportunistic_per_s,
    )
    if not args.json:
        console.print(
            (f"model {name}: " if name is not None else "")
            + f"from the serve config: B = {derived.floor} (its assured floors), C = "
            f"{derived.slots}, W = {derived.window_s:g} s, {derived.dispatch.value} dispatch, "
            f"ŝ = {derived.service_s * 1e3:.0f} ms ({args.aggregation}), opportunistic "
            f"{derived.opportunistic_rate_per_s:g}/s",
            markup=False,
        )
    return derived


def _contract_deadlines(args: argparse.Namespace) -> dict[str | None, float]:
    """Per pool of a serve config, its tightest assured contract's deadline budget (s)."""
    from floorguard.proxy.config.guard import load_config  # noqa: PLC0415  # see the imports

    out = {}
    for name, pool in load_config(args.config).pools().items():
        tokens = pool.limits.default_max_tokens
        budgets = [c.deadline_for(tokens) for c in pool.guard_config().contracts if c.assured]
        if not budgets:
            of = f"model {name}" if name is not None else "the config"
            raise FloorguardError(
                f"--config {args.config}: {of} has no assured contract to screen; give "
                "--deadline-ms"
            )
        out[name] = min(budgets)
    return out


def run(args: argparse.Namespace, console: Console) -> int:
    from floorguard.proxy.config.yamlfile import parse_yaml  # noqa: PLC0415  # see the imports

    try:
        data = parse_yaml(args.config.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FloorguardError(f"--config {args.config}: cannot read it ({exc})") from exc
    if not isinstance(data, dict):
        raise FloorguardError(f"--config {args.config}: expected a mapping of keys to values")
    service_s = None
    if args.service_samples is not None:
        samples = read_service_samples(str(args.service_samples))
        service_s = aggregate(samples, args.aggregation)
    deadlines: dict[str | None, float] = {}
    if "contracts" in data and ("backends" in data or "models" in data):
        configs = _from_serve_config(args, service_s, console)
        if args.deadline_ms is None:
            deadlines = _contract_deadlines(args)
    else:
        configs = {None: ScreenConfig.from_dict(data, service_s)}
        if args.deadline_ms is None:
            raise FloorguardError(f"--config {args.config} names no contract: give --deadline-ms")
    verdicts = {
        name: screen(
            c, args.deadline_ms / 1e3 if args.deadline_ms is not None else deadlines[name],
            args.model,
        )
        for name, c in configs.items()
    }  # fmt: skip
    if args.json:
        out = (
            verdicts[None].as_dict()
            if None in verdicts
            else {"pools": {name: v.as_dict() for name, v in verdicts.items()}}
        )
        print(json.dumps(out, indent=2))
        return 0
    for name, verdict in verdicts.items():
        of = f"model {name}: " if name is not None else ""
        console.print(
            of + ("ACCEPT" if verdict.accept else "REJECT") + ": " + "; ".join(verdict.reasons),
            markup=False,
        )
        region = (
            "inside"
            if verdict.inside_region
            else ("outside (" + "; ".join(verdict.region_reasons) + ")")
        )
        console.print(f"{of}docs/design.md §6 region: {region}", markup=False)
    console.print(
        "A screen, not a proof: P95 is an aggregate obligation (docs/design.md §1); the "
        "runtime guard enforces the per-request floor.",
        markup=False,
    )
    return 0
