"""`floorguard simulate`: a scenario through the guard or a comparison stack, simulated."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from floorguard.baselines.flow_control import FlowControlOptions, MappingFault
from floorguard.baselines.registry import POLICIES, RateLimits, StackOptions
from floorguard.cli._common import fmt
from floorguard.errors import FloorguardError
from floorguard.learners.registry import LEARNERS, LearnerOptions
from floorguard.profiles import PROFILES, get_profile
from floorguard.sim.scenarios import (
    PACE_JITTER_S,
    SCENARIOS,
    Scenario,
    create_scenario,
    trace_replay,
)
from floorguard.sim.workloads import (
    FixedLength,
    PacedArrivals,
    PoissonArrivals,
    Stream,
    SyntheticStream,
)

if TYPE_CHECKING:  # each loads when its command runs, not for the parser (`--help`)
    from floorguard.datacenter import Fleet
    from floorguard.proxy.config.guard import GuardServerConfig

__all__ = ["pool_scenarios", "register", "run", "scenario_from", "stack_options_from"]


def register(commands: Any) -> None:
    sim = commands.add_parser("simulate", help="run a scenario on the simulator")
    sim.add_argument(
        "--scenario",
        default="marquee",
        choices=[*sorted(SCENARIOS), "trace"],
        help="a named scenario, or 'trace' to replay --trace FILE",
    )
    sim.add_argument(
        "--policy",
        default="guard",
        choices=sorted(POLICIES),
        help="the guard, or a comparison stack (docs/design.md §7)",
    )
    sim.add_argument(
        "--learner",
        default=None,
        help=f"one of {', '.join(sorted(LEARNERS))}, or package.module:factory (default "
        "always-admit; with --config, the config's own learner)",
    )
    sim.add_argument(
        "--beta",
        type=float,
        default=1.0,
        help="miscalibration β of the predictor learners (admit iff β·pred ≤ SLO)",
    )
    sim.add_argument("--reps", type=int, default=1, help="independent seeded runs (default 1)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help=f"service profile override: {', '.join(sorted(PROFILES))} or a calibrated .yaml",
    )
    sim.add_argument("--floor", type=int, help="B: credits per window of every assured tenant")
    sim.add_argument("--slots", type=int, help="C: slots of every backend")
    sim.add_argument("--deadline-ms", type=float, help="deadline budget of every contract")
    sim.add_argument(
        "--trace-out",
        type=Path,
        help="write the decision log (JSONL); with --reps > 1, one file per rep "
        "named FILE-repN.jsonl",
    )
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    _serve_arguments(sim)
    _stacks_arguments(sim)
    _replay_arguments(sim)
    _fleet_arguments(sim)
    sim.set_defaults(run=run)


def _serve_arguments(sim: argparse.ArgumentParser) -> None:
    """The guard's own options: one argument group."""
    serve = sim.add_argument_group(
        "a serve config (--config): each pool under its own contracts, slots and profile"
    )
    serve.add_argument(
        "--config",
        type=Path,
        help="a `floorguard serve` config: simulate each pool (`models:`) with every assured "
        "tenant offering its floor B per window and the opportunistic tenants a flood",
    )
    serve.add_argument(
        "--flood",
        type=float,
        default=2.0,
        help="with --config: the opportunistic load × the pool's saturated capacity (default 2)",
    )
    serve.add_argument("--duration-s", type=float, default=12.0, help="with --config (default 12)")


def _stacks_arguments(sim: argparse.ArgumentParser) -> None:
    """The comparison stacks' options: one argument group."""
    stacks = sim.add_argument_group("comparison stacks")
    stacks.add_argument(
        "--mapping-fault",
        choices=[m.value for m in MappingFault],
        default="none",
        help="flow-control: swap the classes' objectives",
    )
    stacks.add_argument(
        "--saturation-queue-depth",
        type=int,
        default=5,
        help="flow-control: waiting requests per backend that mean saturated",
    )
    stacks.add_argument(
        "--queue-ttl-ms",
        type=float,
        help="flow-control: queue TTL (default: each request's deadline budget)",
    )
    stacks.add_argument(
        "--rate-limit-assured-per-s",
        type=float,
        help="rate-limit-class: assured bucket rate (default B/W)",
    )
    stacks.add_argument("--rate-limit-opportunistic-per-s", type=float, default=4.0)
    stacks.add_argument("--rate-limit-flat-per-s", type=float, default=10.0)
    stacks.add_argument(
        "--rate-limit-burst-s", type=float, default=1.0, help="bucket size, in seconds of its rate"
    )


def _replay_arguments(sim: argparse.ArgumentParser) -> None:
    """Trace replay: one argument group."""
    replay = sim.add_argument_group("trace replay (--scenario trace)")
    replay.add_argument("--trace", help="an Azure LLM inference or BurstGPT CSV file")
    replay.add_argument("--assured-fraction", type=float, default=0.3)
    replay.add_argument("--trace-offset-s", type=float, default=0.0)
    replay.add_argument("--trace-duration-s", type=float, default=120.0)
    replay.add_argument("--speedup", type=float, default=1.0)
    replay.add_argument("--max-tokens", type=int, default=48, help="output cap (ℓ)")


def _fleet_arguments(sim: argparse.ArgumentParser) -> None:
    """The fleet: one argument group."""
    fleet = sim.add_argument_group(
        "the fleet (docs/replicas.md): replicas sharing one floor store and the backends"
    )
    fleet.add_argument("--replicas", type=int, help="R guard replicas: simulate a fleet")
    fleet.add_argument("--backends", type=int, default=6, help="M backends (default 6)")
    fleet.add_argument("--tenants", type=int, default=12, help="T assured tenants (default 12)")
    fleet.add_argument("--slot-mode", choices=["leased", "partition"], default="leased")
    fleet.add_argument(
        "--skew",
        default="0",
        help="load-balancer skew s (replica r gets a share ∝ (r+1)^−s); a comma list sweeps "
        "it for both slot modes",
    )
    fleet.add_argument("--opportunistic-per-s", type=float, help="default: 2× the capacity")
    fleet.add_argument("--store-rtt-ms", type=float, default=0.5)
    fleet.add_argument(
        "--window-s", type=float, default=1.0, help="W: the floor's window (default 1.0)"
    )
    fleet.add_argument(
        "--store-outage", metavar="START:END", help="Redis unreachable from START to END s"
    )
    fleet.add_argument("--figure", type=Path, help="with a --skew sweep: draw it here (PNG)")


def scenario_from(args: argparse.Namespace) -> Scenario:
    deadline_s = args.deadline_ms / 1e3 if args.deadline_ms is not None else None
    if args.scenario == "trace":
        if not args.trace:
            raise FloorguardError("--scenario trace needs --trace FILE (Azure or BurstGPT CSV)")
        base = trace_replay(
            args.trace,
            assured_fraction=args.assured_fraction,
            offset_s=args.trace_offset_s,
            duration_s=args.trace_duration_s,
            speedup=args.speedup,
            max_tokens=args.max_tokens,
        )
    else:
        base = create_scenario(args.scenario)
    return base.with_overrides(
        floor=args.floor, slots=args.slots, deadline_s=deadline_s, profile=args.profile
    )


def stack_options_from(args: argparse.Namespace) -> StackOptions:
    return StackOptions(
        rate_limits=RateLimits(
            assured_per_s=args.rate_limit_assured_per_s,
            opportunistic_per_s=args.rate_limit_opportunistic_per_s,
            flat_per_s=args.rate_limit_flat_per_s,
            burst_s=args.rate_limit_burst_s,
        ),
        flow_control=FlowControlOptions(
            mapping_fault=MappingFault(args.mapping_fault),
            queue_depth_threshold=args.saturation_queue_depth,
            queue_ttl_s=args.queue_ttl_ms / 1e3 if args.queue_ttl_ms is not None else None,
        ),
    )


def run(args: argparse.Namespace, console: Console) -> int:
    if args.reps < 1:
        raise FloorguardError(f"--reps = {args.reps}: must be ≥ 1")
    if args.replicas is not None:
        return _run_fleet(args, console)
    if args.config is not None:
        return _run_pools(args, console)
    from floorguard.sim.simulate import simulate  # noqa: PLC0415  # see the imports

    scenario = scenario_from(args)
    with Progress(console=console, transient=True, disable=args.reps == 1) as progress:
        task = progress.add_task(f"{scenario.name} × {args.reps} reps", total=args.reps)
        summary = simulate(
            scenario,
            policy=args.policy,
            learner=args.learner or "always-admit",
            beta=args.beta,
            reps=args.reps,
            seed=args.seed,
            stack_options=stack_options_from(args),
            trace_out=args.trace_out,
            on_rep=lambda: progress.advance(task),
        )
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary, console)
    return 0


def pool_scenarios(
    config: GuardServerConfig, *, duration_s: float, flood: float
) -> dict[str | None, Scenario]:
    """Each pool of a serve config as a scenario: its contracts, windows, slots, dispatch,
    meter, profile and doom gate as the guard would run them; every assured tenant paced at
    its floor (B per window, design §10's jitter), the opportunistic tenants sharing a Poisson
    flood of `flood` × the pool's saturated capacity; ℓ = `limits.default_max_tokens`."""
    from floorguard.sim.targets import saturated_capacity  # noqa: PLC0415  # see the imports

    tokens = config.limits.default_max_tokens
    out: dict[str | None, Scenario] = {}
    for name, pool in config.pools().items():
        if pool.profile is None:
            raise FloorguardError(f"--config: pool {name or ''} has no profile to simulate")
        profile = get_profile(pool.profile)
        guard = pool.guard_config()
        capacity = sum(saturated_capacity(profile, tokens, c)[0] for c in guard.slots)
        window = guard.schedule.window_s
        lengths = FixedLength(tokens)
        streams: list[Stream] = [
            SyntheticStream(
                c.tenant,
                PacedArrivals(c.floor / window, min(PACE_JITTER_S, 0.5 * window / c.floor)),
                lengths,
                duration_s,
            )
            for c in guard.contracts
            if c.assured and c.floor > 0
        ]
        flooders = [c.tenant for c in guard.contracts if not c.assured]
        streams += [
            SyntheticStream(
                t, PoissonArrivals(flood * capacity / len(flooders)), lengths, duration_s
            )
            for t in flooders
            if flood > 0
        ]
        out[name] = Scenario(
            name=f"model {name}" if name is not None else "serve config",
            contracts=guard.contracts,
            streams=tuple(streams),
            profile=profile,
            slots=guard.slots,
            schedule=guard.schedule,
            dispatch=guard.dispatch,
            surplus=guard.surplus,
            meter=guard.meter,
            doom_gate=pool.doom_gate,
            queue_limits=guard.queue_limits,
        )
    return out


def _run_pools(args: argparse.Namespace, console: Console) -> int:
    if not args.duration_s > 0 or args.flood < 0:
        raise FloorguardError("--duration-s must be > 0 and --flood ≥ 0")
    from floorguard.proxy.config.guard import load_config  # noqa: PLC0415  # see the imports
    from floorguard.sim.simulate import simulate  # noqa: PLC0415

    config = load_config(args.config)
    pools = config.pools()
    summaries = {}
    for name, scenario in pool_scenarios(
        config, duration_s=args.duration_s, flood=args.flood
    ).items():
        learner, options, note = _pool_learner(pools[name], args)
        summaries[name] = simulate(
            scenario, policy="guard", learner=learner, beta=args.beta, reps=args.reps,
            seed=args.seed, learner_options=options,
        )  # fmt: skip
        summaries[name]["learner_from"] = note
        if not args.json:
            console.print(f"[dim]{scenario.name}: learner {learner} ({note})[/]")
    if args.json:
        out = summaries.get(None, {"pools": summaries})
        print(json.dumps(out, indent=2))
        return 0
    for summary in summaries.values():
        _print_summary(summary, console)
    return 0


def _pool_learner(
    pool: GuardServerConfig, args: argparse.Namespace
) -> tuple[str, LearnerOptions | None, str]:
    """The learner a pool's simulation runs, its options, and why: `--learner` where given,
    else the config's own with its options as `serve` builds them — except an
    out-of-process one (`learner: http`), which the simulator cannot call."""
    if args.learner is not None:
        return args.learner, None, "--learner"
    if pool.learner == "http":
        return "always-admit", None, "the config's learner is http: out of process, so always-admit"
    return pool.learner, pool.learner_config(), "the config's learner and learner_options"


def _print_summary(s: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"{s['scenario']} · policy {s['policy']} · learner {s['learner']} · "
        f"{s['profile']} · B={s['floor']} C={s['slots']} "
        f"d={s['deadline_ms']:.0f} ms · {s['reps']} rep(s)"
    )
    for column in ("class", "offered", "admitted", "rejected", "dropped", "late", "miss", "unmet"):
        table.add_column(column, justify="right")
    for name in ("assured", "opportunistic"):
        c = s[name]
        table.add_row(
            name,
            *(str(c[k]) for k in ("offered", "admitted", "rejected", "dropped", "late")),
            fmt(c["miss"], True),
            fmt(c["unmet"], True),
        )
    console.print(table)
    a, region = s["assured"], s["assumptions"]
    console.print(
        f"floor-entitled attainment {fmt(a['attainment'], True)} of {a['entitled']} "
        f"(worst phase {fmt(a['attainment_worst_phase'], True)} at φ = "
        f"{a['worst_phase_ms']:.0f} ms) · ρ_eff {s['rho_eff']:.2f} · "
        f"max Q_A {s['max_assured_backlog']}"
    )
    where = "inside" if region["inside"] else "outside"
    console.print(
        f"docs/design.md §6 region: {where}"
        + ("" if region["inside"] else f" ({'; '.join(region['reasons'])})")
    )
    console.print(f"{s['num_requests']} simulated requests in {s['wall_s']:.2f} s")


def _fleets(args: argparse.Namespace) -> list[Fleet]:
    from floorguard.datacenter import Fleet, SlotMode  # noqa: PLC0415  # see the imports

    try:
        skews = [float(x) for x in str(args.skew).split(",")]
        outage = (
            tuple(float(x) for x in args.store_outage.split(":")) if args.store_outage else None
        )
    except ValueError as exc:
        raise FloorguardError(f"--skew / --store-outage: not numbers ({exc})") from exc
    if outage is not None and len(outage) != 2:
        raise FloorguardError("--store-outage is START:END in seconds")
    if args.replicas < 1 or args.backends < 1 or args.tenants < 1:
        raise FloorguardError("--replicas, --backends and --tenants must be ≥ 1")
    if not args.window_s > 0:
        raise FloorguardError("--window-s must be > 0")
    modes: list[SlotMode] = ["partition", "leased"] if len(skews) > 1 else [args.slot_mode]
    base: dict[str, Any] = {
        "replicas": args.replicas,
        "backends": args.backends,
        "tenants": args.tenants,
        "store_rtt_s": args.store_rtt_ms / 1e3,
        "store_outage": outage,
        "opportunistic_per_s": args.opportunistic_per_s,
        "learner": args.learner or "always-admit",
        "window_s": args.window_s,
    }
    for name, value in (("floor", args.floor), ("slots", args.slots), ("profile", args.profile)):
        if value is not None:
            base[name] = value
    if args.deadline_ms is not None:
        base["deadline_ms"] = args.deadline_ms
    try:
        return [Fleet(**base, skew=s, slot_mode=m) for s in skews for m in modes]
    except ValueError as exc:
        raise FloorguardError(str(exc)) from exc


def _run_fleet(args: argparse.Namespace, console: Console) -> int:
    from floorguard.datacenter import simulate_fleet  # noqa: PLC0415
    from floorguard.experiments.figures import fleet_figure  # noqa: PLC0415  # see the imports

    fleets = _fleets(args)
    results = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("fleet runs", total=len(fleets) * args.reps)
        for fleet in fleets:
            for rep in range(args.reps):
                results.append(simulate_fleet(fleet, seed=args.seed + rep))
                progress.advance(task)
    if args.figure is not None:
        fleet_figure(results, args.figure)
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
        return 0 if all(r.verify_ok for r in results) else 1
    f = fleets[0]
    table = Table(
        title=f"fleet · {f.replicas} replicas × {f.backends} backends (C = {f.slots}) × "
        f"{f.tenants} assured tenants (B = {f.floor}) · {f.profile}"
    )
    for column in ("slots", "skew", "seed", "floor", "A late", "A p99 ms", "O done", "util",
                   "peak", "verify"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.fleet.slot_mode,
            f"{r.fleet.skew:g}",
            str(r.seed),
            f"{r.floor_admitted}/{r.floor_entitled}",
            str(r.assured_late),
            f"{r.assured_p99_ms:.0f}",
            f"{r.opportunistic_completed}/{r.opportunistic_offered}",
            f"{r.utilization:.3f}",
            f"{r.peak_in_flight}/{r.fleet.slots}",
            "OK" if r.verify_ok else "FAIL: " + "; ".join(r.violations[:2]),
        )
    console.print(table)
    console.print(
        "floor: admitted from the floor / min(B, offered) per tenant and window; A late: of "
        "them, late; O done: opportunistic completed / offered; util: busy slot-seconds / "
        "slot-seconds; peak: most in flight at one backend / C; verify: check_fleet."
    )
    conditional = sum(r.conditional for r in results)
    if conditional:
        console.print(f"AF conditional on the store: {conditional} finding(s) in degraded windows")
    wall = sum(r.wall_s for r in results)
    console.print(f"{sum(r.num_requests for r in results)} simulated requests in {wall:.1f} s")
    return 0 if all(r.verify_ok for r in results) else 1
