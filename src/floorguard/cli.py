"""The `floorguard` command line.

floorguard simulate --scenario marquee [--policy guard] [--learner NAME] [--reps N] …
floorguard verify TRACE.jsonl [--strict-sf] [--allow-open] [--json]
floorguard bench sim|calibration [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from aiohttp import web
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from floorguard.analysis.checker import check_fleet, check_trace, format_prefix
from floorguard.analysis.metrics import RunMetrics, measure
from floorguard.analysis.records import fold_trace
from floorguard.analysis.summary import pool_runs
from floorguard.baselines.flow_control import FlowControlOptions, MappingFault
from floorguard.baselines.registry import POLICIES, RateLimits, StackOptions
from floorguard.bench.calibration import bench_calibration
from floorguard.bench.proxy import bench_proxy
from floorguard.bench.sim import bench_sim
from floorguard.bench.soak import bench_soak
from floorguard.bench.store import bench_store
from floorguard.calibrate import calibrate
from floorguard.core.events import read_jsonl, write_jsonl
from floorguard.core.ledger import assumptions_of
from floorguard.errors import FloorguardError
from floorguard.experiments.catalogue import catalogue
from floorguard.experiments.figures import real_vs_sim
from floorguard.experiments.real import (
    REAL_EXPERIMENTS,
    RealBackend,
    fidelity_report,
    run_real_experiments,
    served_runs,
)
from floorguard.experiments.report import write_real_section, write_report
from floorguard.experiments.runner import run_experiments
from floorguard.experiments.spec import Experiment
from floorguard.learners.registry import LEARNERS, LearnerOptions, needs_latency_model
from floorguard.profiles import PROFILES, save_profile
from floorguard.proxy.config import load_config
from floorguard.proxy.serve import run_guard
from floorguard.rig.demo import run_demo
from floorguard.rig.emulator import Emulator, create_emulator_app
from floorguard.rig.loadgen import measure_client, replay
from floorguard.screen.model import (
    AGGREGATIONS,
    ScreenConfig,
    aggregate,
    read_service_samples,
    screen,
)
from floorguard.sim.probe import fit_probe_model
from floorguard.sim.run import SimRun, simulate_once
from floorguard.sim.scenarios import SCENARIOS, Scenario, create_scenario, trace_replay
from floorguard.sim.workloads import build_requests

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="floorguard", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

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
        help="the guard, or a comparison stack (SPEC §7)",
    )
    sim.add_argument(
        "--learner",
        default="always-admit",
        help=f"one of {', '.join(sorted(LEARNERS))}, or package.module:factory",
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
    replay = sim.add_argument_group("trace replay (--scenario trace)")
    replay.add_argument("--trace", help="an Azure LLM inference or BurstGPT CSV file")
    replay.add_argument("--assured-fraction", type=float, default=0.3)
    replay.add_argument("--trace-offset-s", type=float, default=0.0)
    replay.add_argument("--trace-duration-s", type=float, default=120.0)
    replay.add_argument("--speedup", type=float, default=1.0)
    replay.add_argument("--max-tokens", type=int, default=48, help="output cap (ℓ)")

    verify = commands.add_parser("verify", help="check a decision log for AF, DR, SF, order")
    verify.add_argument(
        "trace",
        type=Path,
        nargs="+",
        help="a decision log; several: replicas sharing one floor (AF checked fleet-wide)",
    )
    verify.add_argument(
        "--fleet",
        action="store_true",
        help="the log(s) come from replicas sharing a Redis floor (implied by several logs)",
    )
    verify.add_argument(
        "--strict-sf",
        action="store_true",
        help="also fail on late floor-entitled completions (SF is conditional)",
    )
    verify.add_argument(
        "--allow-open",
        action="store_true",
        help="accept requests with no terminal outcome yet (a live log)",
    )
    verify.add_argument("--json", action="store_true")

    _add_experiment(commands)
    _add_screen(commands)
    _add_http(commands)
    _add_bench(commands)
    return parser


def _add_experiment(commands: Any) -> None:
    experiment = commands.add_parser("experiment", help="the SPEC §10 experiment suite")
    actions = experiment.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="list the catalogue")
    run = actions.add_parser("run", help="run experiments by id, or all")
    run.add_argument("ids", nargs="+", help="experiment ids (E1 … E19), or 'all'")
    run.add_argument("--out", type=Path, default=Path("out/experiments"))
    run.add_argument("--reps", type=int, help="override every experiment's reps")
    run.add_argument(
        "--quick",
        action="store_true",
        help="smaller grids and 2 reps (smoke); with --backend, 1 rep",
    )
    run.add_argument("--workers", type=int, help="worker processes (default: all cores)")
    run.add_argument("--burstgpt", help="a real BurstGPT CSV to add to E12's sources")
    run.add_argument(
        "--results-md",
        type=Path,
        help="also write the full report with inline tables here (docs/results.md); with "
        "--backend, the fidelity section of that file",
    )
    real = run.add_argument_group(
        "on a real backend (E1, E3, E8; docs/vllm.md)",
        "run the experiments against an OpenAI-compatible backend with C slots (vLLM: "
        "--max-num-seqs C --scheduling-policy priority), rescaled to its measured capacity, "
        "each beside the simulator's prediction for its calibrated profile; the short grids "
        "(E1: β ∈ {0, 1}), 3 reps",
    )
    real.add_argument("--backend", help="the backend's base URL, e.g. http://127.0.0.1:8001")
    real.add_argument("--model", help="the model name the backend serves (with --backend)")
    real.add_argument(
        "--profile",
        type=Path,
        help="its calibrated profile (floorguard calibrate --out); default: calibrate it "
        "first (OUT/profile.yaml)",
    )
    real.add_argument(
        "--duration-s", type=float, help="arrivals per run, seconds (default: marquee 12 s × k)"
    )


def _add_screen(commands: Any) -> None:
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
        default="mean",
        help="how ŝ is taken from the samples (default mean)",
    )
    scr.add_argument("--json", action="store_true")


def _add_http(commands: Any) -> None:
    load = commands.add_parser("load", help="open-loop load against an OpenAI-compatible URL")
    load.add_argument("--target", required=True, help="base URL (the guard or a backend)")
    load.add_argument("--scenario", choices=sorted(SCENARIOS), default="marquee")
    load.add_argument("--trace", help="replay an Azure or BurstGPT CSV instead (30 % assured)")
    load.add_argument("--trace-duration-s", type=float, default=60.0)
    load.add_argument(
        "--model", default="floorguard", help="the model name to ask for (vLLM checks it)"
    )
    load.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="TENANT=JWT",
        help="bearer token per tenant (repeatable)",
    )
    load.add_argument("--json", action="store_true")
    demo = commands.add_parser("demo", help="the guard on loopback beside an unguarded path")
    demo.add_argument("--duration-s", type=float, default=12.0, help="seconds of arrivals")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--png", type=Path, default=Path("floorguard-demo.png"))
    demo.add_argument("--json", action="store_true")
    serve = commands.add_parser("serve", help="run the HTTP guard in front of backends")
    serve.add_argument("--config", type=Path, required=True, help="YAML (examples/guard.yaml)")
    cal = commands.add_parser(
        "calibrate", help="probe an OpenAI-compatible backend and fit a service profile"
    )
    cal.add_argument("--backend", required=True, help="the backend's base URL")
    cal.add_argument("--model", required=True, help="the model name it serves")
    cal.add_argument("--slots", type=int, default=4, help="its --max-num-seqs (C)")
    cal.add_argument("--reps", type=int, default=3, help="samples per output length, alone")
    cal.add_argument("--name", default="calibrated", help="the profile's name")
    cal.add_argument("--out", type=Path, help="write the profile (YAML) here")
    cal.add_argument("--json", action="store_true")
    emulate = commands.add_parser("emulate", help="an OpenAI-compatible emulated backend")
    emulate.add_argument(
        "--profile",
        default="v100-moe",
        metavar="NAME|FILE",
        help=f"{', '.join(sorted(PROFILES))} or a calibrated profile .yaml",
    )
    emulate.add_argument("--slots", type=int, default=4)
    emulate.add_argument("--host", default="127.0.0.1")
    emulate.add_argument("--port", type=int, default=8001)
    emulate.add_argument(
        "--scheduling-policy",
        choices=["fcfs", "priority"],
        default="fcfs",
        help="priority: serve waiting requests by vLLM's (priority, arrival)",
    )


def _add_bench(commands: Any) -> None:
    bench = commands.add_parser("bench", help="benchmarks, each beside a reference")
    kinds = bench.add_subparsers(dest="bench", required=True)
    bench_sim = kinds.add_parser("sim", help="simulated requests/s and µs per decision")
    bench_sim.add_argument("--duration-s", type=float, default=600.0)
    bench_sim.add_argument("--repeats", type=int, default=3)
    bench_sim.add_argument("--json", action="store_true")
    bench_proxy_cmd = kinds.add_parser("proxy", help="latency and throughput the guard adds")
    bench_proxy_cmd.add_argument("--requests", type=int, default=400)
    bench_proxy_cmd.add_argument("--repeats", type=int, default=2)
    bench_proxy_cmd.add_argument("--json", action="store_true")
    bench_store_cmd = kinds.add_parser(
        "store", help="admissions/s with the Redis floor beside raw EVALSHA/s"
    )
    bench_store_cmd.add_argument(
        "--redis", default=None, help="a Redis URL (default: a throw-away local redis-server)"
    )
    bench_store_cmd.add_argument("--requests", type=int, default=6_000)
    bench_store_cmd.add_argument("--concurrency", type=int, default=32)
    bench_store_cmd.add_argument("--repeats", type=int, default=3)
    bench_store_cmd.add_argument("--json", action="store_true")
    bench_soak_cmd = kinds.add_parser(
        "soak", help="sustained overload: the floor per window, p99, RSS and descriptors"
    )
    bench_soak_cmd.add_argument("--minutes", type=float, default=5.0)
    bench_soak_cmd.add_argument(
        "--overload", type=float, default=10.0, help="opportunistic load × backend capacity"
    )
    bench_soak_cmd.add_argument("--json", action="store_true")
    bench_cal = kinds.add_parser("calibration", help="each profile against SPEC §5's targets")
    bench_cal.add_argument("--fit", action="store_true", help="also re-run the bisection fits")
    bench_cal.add_argument("--json", action="store_true")


def _rep_seeds(seed: int, reps: int) -> list[int]:
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(reps)]


def _trace_path(base: Path, rep: int, reps: int) -> Path:
    return base if reps == 1 else base.with_name(f"{base.stem}-rep{rep}{base.suffix or '.jsonl'}")


def _scenario(args: argparse.Namespace) -> Scenario:
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


def _stack_options(args: argparse.Namespace) -> StackOptions:
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


def _learner_options(args: argparse.Namespace, scenario: Scenario) -> LearnerOptions:
    """β and the SLO for the predictors, with a model fitted once on probes of this backend."""
    model = None
    if needs_latency_model(args.learner):
        model = fit_probe_model(scenario.profile, scenario.slots[0], seed=args.seed)
    slo_s = min(c.deadline_budget_s for c in scenario.contracts)
    return LearnerOptions(beta=args.beta, slo_s=slo_s, latency_model=model)


def _assumptions(scenario: Scenario, runs: list[SimRun]) -> dict[str, Any]:
    return asdict(assumptions_of(scenario.guard_config(), [r.guard for r in runs]))


def cmd_simulate(args: argparse.Namespace, console: Console) -> int:
    if args.reps < 1:
        raise FloorguardError(f"--reps = {args.reps}: must be ≥ 1")
    scenario = _scenario(args)
    started = time.perf_counter()
    learner_options = _learner_options(args, scenario)
    stack_options = _stack_options(args)
    runs: list[SimRun] = []
    metrics: list[RunMetrics] = []
    with Progress(console=console, transient=True, disable=args.reps == 1) as progress:
        task = progress.add_task(f"{scenario.name} × {args.reps} reps", total=args.reps)
        for rep, seed in enumerate(_rep_seeds(args.seed, args.reps)):
            run = simulate_once(
                scenario,
                seed=seed,
                policy=args.policy,
                learner=args.learner,
                learner_options=learner_options,
                stack_options=stack_options,
            )
            assert run.events is not None
            if args.trace_out is not None:
                write_jsonl(run.events, str(_trace_path(args.trace_out, rep, args.reps)))
            metrics.append(measure(fold_trace(run.events)))
            run.events = None  # keep the monitors, not the log
            runs.append(run)
            progress.advance(task)
    sim_wall_s = sum(r.wall_s for r in runs)
    num_requests = sum(r.num_requests for r in runs)
    summary = {
        "scenario": scenario.name,
        "policy": args.policy,
        "learner": args.learner,
        "profile": scenario.profile.name,
        "seed": args.seed,
        "floor": scenario.guard_config().total_floor,
        "slots": scenario.slots[0],
        "deadline_ms": min(c.deadline_budget_s for c in scenario.contracts) * 1e3,
        **pool_runs(metrics),
        "assumptions": _assumptions(scenario, runs),
        "learner_faults": sum(r.guard.stats.learner_faults for r in runs),
        "beta": args.beta,
        "learner_model": (
            learner_options.latency_model.as_dict()
            if learner_options.latency_model is not None
            else None
        ),
        "reps": args.reps,
        "num_requests": num_requests,
        "wall_s": time.perf_counter() - started,
        "sim_requests_per_s": num_requests / sim_wall_s if sim_wall_s > 0 else None,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary, console)
    return 0


def _fmt(value: Any, percent: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:.1%}" if percent else str(value)


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
            _fmt(c["miss"], True),
            _fmt(c["unmet"], True),
        )
    console.print(table)
    a, region = s["assured"], s["assumptions"]
    console.print(
        f"floor-entitled attainment {_fmt(a['attainment'], True)} of {a['entitled']} "
        f"(worst phase {_fmt(a['attainment_worst_phase'], True)} at φ = "
        f"{a['worst_phase_ms']:.0f} ms) · ρ_eff {s['rho_eff']:.2f} · "
        f"max Q_A {s['max_assured_backlog']}"
    )
    where = "inside" if region["inside"] else "outside"
    console.print(
        f"SPEC §6 region: {where}"
        + ("" if region["inside"] else f" ({'; '.join(region['reasons'])})")
    )
    console.print(f"{s['num_requests']} simulated requests in {s['wall_s']:.2f} s")


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    logs = [list(read_jsonl(str(path))) for path in args.trace]
    if args.fleet or len(logs) > 1:
        report = check_fleet(logs, allow_open=args.allow_open)
    else:
        report = check_trace(logs[0], allow_open=args.allow_open)
    failed = report.failed(args.strict_sf)
    if args.json:
        print(
            json.dumps(
                {
                    "ok": not failed,
                    "num_events": report.num_events,
                    "num_requests": report.num_requests,
                    "num_entitled": report.num_entitled,
                    "num_drops": report.num_drops,
                    "num_sf_late": report.num_sf_late,
                    "outcomes": dict(report.counts),
                    "violations": [asdict(v) for v in report.violations[:100]],
                },
                indent=2,
            )
        )
    else:
        console.print(
            f"{report.num_requests} requests, {report.num_events} events: "
            f"{report.num_entitled} floor-entitled, {report.num_drops} drops, "
            f"outcomes {dict(report.counts)}"
        )
        if report.num_sf_late:
            console.print(
                f"SF: {report.num_sf_late} floor-entitled requests completed late "
                f"(conditional property, SPEC §6)"
            )
        if failed:
            if len(logs) > 1:
                console.print(f"in {args.trace[failed[0].log]}:", markup=False)
            console.print(
                format_prefix(logs[failed[0].log], failed[0]), markup=False, highlight=False
            )
            console.print(f"FAIL: {len(failed)} violation(s)")
        else:
            console.print(
                "OK: AF, DR, ORDER, SLOTS, TERMINAL hold" + (", SF holds" if args.strict_sf else "")
            )
    return 1 if failed else 0


def cmd_experiment(args: argparse.Namespace, console: Console) -> int:
    experiments = catalogue(getattr(args, "burstgpt", None))
    if args.action == "list":
        for e in experiments.values():
            console.print(f"[bold]{e.id}[/bold]  {e.title}  ({e.reps} reps)")
        return 0
    ids = list(experiments) if args.ids == ["all"] else [i.upper() for i in args.ids]
    unknown = [i for i in ids if i not in experiments]
    if unknown:
        raise FloorguardError(f"unknown experiment(s) {unknown}: choose from {list(experiments)}")
    if args.reps is not None and args.reps < 1:
        raise FloorguardError(f"--reps = {args.reps}: must be ≥ 1")
    if args.backend is not None:
        if args.ids == ["all"]:
            ids = list(REAL_EXPERIMENTS)
        return _experiment_on_backend(args, [experiments[i] for i in ids], console)
    if args.model or args.profile or args.duration_s:
        raise FloorguardError("--model, --profile and --duration-s go with --backend")
    started = time.perf_counter()
    results = run_experiments(
        [experiments[i] for i in ids],
        out=args.out,
        reps=args.reps,
        quick=args.quick,
        workers=args.workers,
        console=console,
    )
    wall_s = time.perf_counter() - started
    command = "floorguard experiment run " + " ".join(args.ids) + (" --quick" if args.quick else "")
    preamble = (
        f"Generated by `{command}` in {wall_s:.0f} s wall time on "
        f"{os.cpu_count()} cores (all on the simulator). Every table and reading below comes "
        "from that run; rerun the command to regenerate this file."
    )
    report = write_report(
        results, args.out / "report.md", title="floorguard experiments", preamble=preamble
    )
    console.print(
        f"wrote {report} ({len(results)} experiments, "
        f"{sum(len(r.rows) for r in results)} runs, {wall_s:.1f} s)"
    )
    if args.results_md is not None:
        write_report(
            results,
            args.results_md,
            title="Results",
            preamble=preamble,
            inline_tables=True,
            figure_dir=args.results_md.parent / "figures",
        )
        console.print(f"wrote {args.results_md}")
    return 0


def _experiment_on_backend(
    args: argparse.Namespace, experiments: list[Experiment], console: Console
) -> int:
    if not args.model:
        raise FloorguardError("--backend needs --model (the name the backend serves)")
    if args.duration_s is not None and args.duration_s <= 0:
        raise FloorguardError(f"--duration-s = {args.duration_s}: must be > 0")
    args.out.mkdir(parents=True, exist_ok=True)
    profile = args.profile
    if profile is None:
        slots = experiments[0].grid(True)[0].slots
        console.print(f"calibrating {args.backend} ({args.model}, C = {slots})…", markup=False)
        calibrated = calibrate(args.backend, args.model, slots=slots, name=args.model)
        profile = args.out / "profile.yaml"
        save_profile(
            calibrated.profile, profile, measured=calibrated.measured(args.backend, args.model)
        )
    backend = RealBackend.from_profile(args.backend, args.model, profile)
    started = time.perf_counter()
    results = run_real_experiments(
        experiments,
        backend,
        out=args.out,
        reps=args.reps,
        quick=args.quick,
        duration_s=args.duration_s,
        console=console,
    )
    wall_s = time.perf_counter() - started
    command = " ".join(
        ["floorguard experiment run", *args.ids, "--backend", args.backend, "--model", args.model]
        + (["--quick"] if args.quick else [])
        + ([f"--reps {args.reps}"] if args.reps else [])
        + ([f"--duration-s {args.duration_s:g}"] if args.duration_s else [])
    )
    points = [p for r in results for p in r.points()]
    real_vs_sim(points, args.out / "fidelity.png")
    body = fidelity_report(results, backend, command=command, wall_s=wall_s, figure="fidelity.png")
    report = args.out / "fidelity.md"
    report.write_text(body + "\n")
    console.print(f"wrote {report} ({served_runs(results)} runs on the backend, {wall_s:.0f} s)")
    if args.results_md is not None:
        figure = args.results_md.parent / "figures" / "fidelity_real_vs_sim.png"
        figure.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.out / "fidelity.png", figure)
        body = fidelity_report(
            results,
            backend,
            command=command,
            wall_s=wall_s,
            figure=str(figure.relative_to(args.results_md.parent)),
        )
        write_real_section(args.results_md, body)
        console.print(f"wrote the real-backend section of {args.results_md} and {figure}")
    return 0


def cmd_screen(args: argparse.Namespace, console: Console) -> int:
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
    verdict = screen(ScreenConfig.from_dict(data, service_s), args.deadline_ms / 1e3)
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


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    if args.duration_s <= 0:
        raise FloorguardError(f"--duration-s = {args.duration_s}: must be > 0")
    console.print(
        "starting two emulated backends, the guard and an unguarded path on "
        f"loopback; {args.duration_s:g} s of bursty two-tenant traffic…",
        markup=False,
    )
    result = run_demo(duration_s=args.duration_s, seed=args.seed, png=args.png)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title=f"floorguard demo · {result['workload']}")
    table.add_column("")
    for side in ("guard", "unguarded"):
        table.add_column(side, justify="right")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("assured offered", lambda s: str(s["assured"]["offered"])),
        ("assured late", lambda s: str(s["assured"]["late"])),
        ("assured miss", lambda s: _fmt(s["assured"]["miss"], True)),
        ("assured unmet", lambda s: _fmt(s["assured"]["unmet"], True)),
        ("floor-entitled attainment", lambda s: _fmt(s["assured"]["attainment"], True)),
        ("opportunistic unmet", lambda s: _fmt(s["opportunistic"]["unmet"], True)),
        ("on-time goodput /s", lambda s: f"{s['goodput_per_s']:.1f}"),
    ]
    for label, cell in rows:
        table.add_row(label, cell(result["guard"]), cell(result["unguarded"]))
    console.print(table)
    console.print(
        f"figure: {result['png']} · {result['num_requests']} requests per side · "
        f"{result['wall_s']:.0f} s",
        markup=False,
    )
    return 0


def cmd_load(args: argparse.Namespace, console: Console) -> int:
    scenario = (
        trace_replay(args.trace, duration_s=args.trace_duration_s)
        if args.trace
        else create_scenario(args.scenario)
    )
    tokens = dict(t.split("=", 1) for t in args.token if "=" in t)
    if len(tokens) != len(args.token):
        raise FloorguardError("--token takes TENANT=JWT")
    headers = {tenant: {"Authorization": f"Bearer {jwt_}"} for tenant, jwt_ in tokens.items()}
    requests = build_requests(scenario.streams, np.random.default_rng(0))
    console.print(f"firing {len(requests)} requests open-loop at {args.target}…", markup=False)
    results = asyncio.run(replay(requests, args.target, headers, model=args.model))
    summary = pool_runs([measure_client(results, scenario.guard_config())])
    summary["num_requests"] = len(requests)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        console.print_json(json.dumps(summary))
    return 0


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    config = load_config(args.config)
    backends = [b.url for b in config.backends]

    def listening(url: str) -> None:
        console.print(f"floorguard guarding {backends} on {url}", markup=False)

    try:
        run_guard(config, listening)
    except OSError as exc:  # the port is taken, the address is not this host's, …
        raise FloorguardError(f"cannot listen on {config.host}:{config.port}: {exc}") from exc
    return 0


def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    if args.reps < 1:
        raise FloorguardError(f"--reps = {args.reps}: must be ≥ 1")
    if not args.json:
        console.print(f"probing {args.backend} ({args.model}, C = {args.slots})…", markup=False)
    result = calibrate(args.backend, args.model, slots=args.slots, reps=args.reps, name=args.name)
    measured = result.measured(args.backend, args.model)
    if args.out is not None:
        save_profile(result.profile, args.out, measured=measured)
    p = result.profile
    summary = {
        "profile": {
            "prefill_ms": p.prefill_s * 1e3,
            "step_1_ms": p.step_1_s * 1e3,
            "step_full_ms": p.step_full_s * 1e3,
            "coupling_shape": p.coupling_shape,
            "jitter_mean": p.jitter_mean,
            "jitter_cap": p.jitter_cap,
            "L_ms_at_16": p.lower.at(16) * 1e3,
            "s_max_ms_at_16": p.ceiling.at(16) * 1e3,
            "prefill_ms_per_1k_prompt_tokens": p.prefill_per_prompt_token_s * 1e6,
            "L_prefill_ms_per_1k_prompt_tokens": p.lower_per_prompt_token_s * 1e6,
        },
        "mu_sat_per_s": result.mu_sat_per_s,
        "residuals": result.residuals,
        "out": str(args.out) if args.out else None,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        console.print_json(json.dumps(summary))
    return 0


def cmd_emulate(args: argparse.Namespace, console: Console) -> int:
    if args.slots < 1:
        raise FloorguardError(f"--slots = {args.slots}: must be ≥ 1")
    emulator = Emulator(
        args.profile, args.slots, priority_scheduling=args.scheduling_policy == "priority"
    )
    console.print(
        f"emulated backend ({args.profile}, {args.slots} slots) on http://{args.host}:{args.port}",
        markup=False,
    )
    web.run_app(create_emulator_app(emulator), host=args.host, port=args.port, print=None)
    return 0


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    if args.bench == "sim":
        result = bench_sim(duration_s=args.duration_s, repeats=args.repeats)
    elif args.bench == "proxy":
        result = bench_proxy(requests=args.requests, repeats=args.repeats)
    elif args.bench == "soak":
        if not args.minutes > 0 or not args.overload > 0:
            raise FloorguardError("--minutes and --overload must be > 0")
        result = bench_soak(minutes=args.minutes, overload=args.overload)
    elif args.bench == "store":
        if args.requests < args.concurrency or args.concurrency < 1:
            raise FloorguardError("--requests must be ≥ --concurrency ≥ 1")
        result = bench_store(
            redis_url=args.redis,
            requests=args.requests,
            concurrency=args.concurrency,
            repeats=args.repeats,
        )
    else:
        result = bench_calibration(fit=args.fit)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print_json(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(stderr=True) if getattr(args, "json", False) else Console()
    commands = {
        "screen": cmd_screen,
        "serve": cmd_serve,
        "demo": cmd_demo,
        "load": cmd_load,
        "emulate": cmd_emulate,
        "calibrate": cmd_calibrate,
        "simulate": cmd_simulate,
        "verify": cmd_verify,
        "experiment": cmd_experiment,
        "bench": cmd_bench,
    }
    try:
        return commands[args.command](args, console)
    except FloorguardError as exc:
        print(f"floorguard {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
