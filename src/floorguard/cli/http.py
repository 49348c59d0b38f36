"""The HTTP commands: `serve` (the guard), `calibrate` (a real backend's profile), and the
live rig's `emulate`, `load` and `demo`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from floorguard.cli._common import fmt, port, print_result
from floorguard.errors import FloorguardError
from floorguard.profiles import PROFILES
from floorguard.sim.scenarios import SCENARIOS

# Each command imports what it runs (the HTTP guard, the emulator, the rig) when it runs:
# the parser, and `--help`, need none of them.

__all__ = ["register"]


def register(commands: Any) -> None:
    load = commands.add_parser(
        "load",
        help="open-loop load against an OpenAI-compatible URL",
        description="Fire a scenario's (or a trace's) requests open-loop at --target and "
        "measure them on the client. The requests come from the workload's tenants (the "
        "marquee's: a95, assured, and a10, opportunistic; `--list-tenants` prints any "
        "scenario's): give each a --token and a contract on the guard, or its requests are "
        "refused 401/403 (the summary counts every answer other than a 200 by status and reason).",
    )
    load.add_argument("--target", required=True, help="base URL (the guard or a backend)")
    load.add_argument("--scenario", choices=sorted(SCENARIOS), default="marquee")
    load.add_argument("--trace", help="replay an Azure or BurstGPT CSV instead (30 %% assured)")
    load.add_argument("--trace-duration-s", type=float, default=60.0)
    load.add_argument(
        "--model", default="floorguard", help="the model name to ask for (vLLM checks it)"
    )
    load.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="TENANT=TOKEN",
        help="a tenant's bearer token: a JWT or one of the guard's API keys (repeatable)",
    )
    load.add_argument(
        "--list-tenants", action="store_true", help="print the workload's tenants and exit"
    )
    load.add_argument("--json", action="store_true")
    load.set_defaults(run=run_load)
    demo = commands.add_parser("demo", help="the guard on loopback beside an unguarded path")
    demo.add_argument("--duration-s", type=float, default=12.0, help="seconds of arrivals")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--png", type=Path, default=Path("floorguard-demo.png"))
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(run=run_demo_command)
    serve = commands.add_parser("serve", help="run the HTTP guard in front of backends")
    serve.add_argument("--config", type=Path, required=True, help="YAML (examples/guard.yaml)")
    serve.add_argument(
        "--check",
        action="store_true",
        help="validate the config (every error at once), print the start-up report and "
        "verdicts, and exit: 0 when it would start",
    )
    serve.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # workers: N
    serve.set_defaults(run=run_serve)
    token = commands.add_parser(
        "token", help="mint a tenant's JWT for an HS256 guard config (a test or a trial)"
    )
    token.add_argument("--config", type=Path, required=True, help="the guard's YAML")
    token.add_argument("--tenant", required=True, help="a tenant with a contract there")
    token.add_argument(
        "--ttl-s", type=float, default=3600.0, help="seconds until it expires (default 1 h)"
    )
    token.set_defaults(run=run_token)
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
    cal.set_defaults(run=run_calibrate)
    emulate = commands.add_parser("emulate", help="an OpenAI-compatible emulated backend")
    emulate.add_argument(
        "--profile",
        default="v100-moe",
        metavar="NAME|FILE",
        help=f"{', '.join(sorted(PROFILES))} or a calibrated profile .yaml",
    )
    emulate.add_argument("--slots", type=int, default=4)
    emulate.add_argument(
        "--model",
        help="the model name it serves; a request naming another gets 404, as from vLLM "
        "(default: any name is served)",
    )
    emulate.add_argument("--host", default="127.0.0.1")
    emulate.add_argument("--port", type=port, default=8001)
    emulate.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        help="report a KV cache of this many 16-token blocks in vllm:cache_config_info, as "
        "vLLM does (reported only: the emulator never runs out of memory)",
    )
    emulate.add_argument(
        "--scheduling-policy",
        choices=["fcfs", "priority"],
        default="fcfs",
        help="priority: serve waiting requests by vLLM's (priority, arrival)",
    )
    emulate.set_defaults(run=run_emulate)


def run_demo_command(args: argparse.Namespace, console: Console) -> int:
    from floorguard.rig.demo import CAPTION, run_demo  # noqa: PLC0415  # see the imports

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
    table = Table(title="floorguard demo: guarded and not")
    table.add_column("")
    for side in ("guard", "unguarded"):
        table.add_column(side, justify="right")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("assured offered", lambda s: str(s["assured"]["offered"])),
        ("  refused (beyond B)", lambda s: str(s["assured"]["rejected"])),
        ("  dropped (doomed)", lambda s: str(s["assured"]["dropped"])),
        ("  late", lambda s: str(s["assured"]["late"])),
        ("assured miss (late / admitted)", lambda s: fmt(s["assured"]["miss"], True)),
        ("assured unmet (not on time / offered)", lambda s: fmt(s["assured"]["unmet"], True)),
        ("floor-entitled attainment", lambda s: fmt(s["assured"]["attainment"], True)),
        ("opportunistic unmet", lambda s: fmt(s["opportunistic"]["unmet"], True)),
        ("on-time goodput /s", lambda s: f"{s['goodput_per_s']:.1f}"),
    ]
    for label, cell in rows:
        table.add_row(label, cell(result["guard"]), cell(result["unguarded"]))
    console.print(table)
    console.print(f"workload: {result['workload']} · seed {result['seed']}", markup=False)
    console.print(CAPTION, markup=False)
    figure = result["png"] if result.get("png") else result.get("png_error", "none")
    console.print(
        f"figure: {figure} · {result['num_requests']} requests per side · {result['wall_s']:.0f} s",
        markup=False,
    )
    return 0


def run_load(args: argparse.Namespace, console: Console) -> int:
    import numpy as np  # noqa: PLC0415  # see the imports

    from floorguard.analysis.summary import pool_runs  # noqa: PLC0415
    from floorguard.rig.loadgen import measure_client, refusals, replay  # noqa: PLC0415
    from floorguard.sim.scenarios import create_scenario, trace_replay  # noqa: PLC0415
    from floorguard.sim.workloads import build_requests  # noqa: PLC0415

    scenario = (
        trace_replay(args.trace, duration_s=args.trace_duration_s)
        if args.trace
        else create_scenario(args.scenario)
    )
    tenants = {c.tenant: c.cls.value for c in scenario.contracts}
    if args.list_tenants:
        for tenant, cls in tenants.items():
            print(f"{tenant}\t{cls}")
        return 0
    tokens = dict(t.split("=", 1) for t in args.token if "=" in t)
    if len(tokens) != len(args.token):
        raise FloorguardError("--token takes TENANT=TOKEN")
    strangers = sorted(set(tokens) - set(tenants))
    if strangers:
        raise FloorguardError(
            f"--token for {', '.join(strangers)}: this workload sends only "
            f"{', '.join(f'{t} ({c})' for t, c in tenants.items())}"
        )
    headers = {tenant: {"Authorization": f"Bearer {key}"} for tenant, key in tokens.items()}
    requests = build_requests(scenario.streams, np.random.default_rng(0))
    console.print(
        f"firing {len(requests)} requests open-loop at {args.target} from "
        + ", ".join(f"{t} ({c}{'' if t in tokens else ', no --token'})" for t, c in tenants.items())
        + "…",
        markup=False,
    )
    results = asyncio.run(replay(requests, args.target, headers, model=args.model))
    summary = pool_runs([measure_client(results, scenario.guard_config())])
    summary["num_requests"] = len(requests)
    summary["refusals"] = refusals(results)
    print_result(summary, args.json, console)
    if not args.json and summary["refusals"]:
        console.print(
            "answers other than 200, by status and reason: "
            + ", ".join(f"{k} × {n}" for k, n in summary["refusals"].items()),
            markup=False,
        )
    return 0


def run_token(args: argparse.Namespace, console: Console) -> int:
    import jwt  # noqa: PLC0415  # see the imports

    from floorguard.proxy.config.guard import load_config  # noqa: PLC0415
    from floorguard.proxy.edge.identity import create_identity  # noqa: PLC0415

    """Print a JWT the guard of `--config` accepts for `--tenant`: signed HS256 with its
    secret, the claims it checks (`exp`, `iss` and `aud` where configured, the tenant in
    `tenant_claim`). Public-key configs are signed by the identity provider, not here."""
    if not args.ttl_s > 0:
        raise FloorguardError(f"--ttl-s = {args.ttl_s}: must be > 0")
    config = load_config(args.config)
    identity = config.identity
    if identity.mode != "jwt" or identity.jwt is None or identity.jwt.algorithms != ["HS256"]:
        raise FloorguardError(
            f"--config {args.config}: only an HS256 JWT config can be signed here (its "
            "identity provider signs RS256/ES256 tokens; mtls and header need none)"
        )
    tenants = sorted(c.tenant for c in config.contracts)
    if args.tenant not in tenants:
        raise FloorguardError(f"--tenant {args.tenant}: no contract for it; tenants: {tenants}")
    spec = identity.jwt
    key = create_identity(identity).key  # HS256: (the secret, "HS256")
    assert isinstance(key, tuple)
    secret = key[0]
    claims: dict[str, Any] = {spec.tenant_claim: args.tenant, "exp": int(time.time() + args.ttl_s)}
    if spec.issuer is not None:
        claims["iss"] = spec.issuer
    if spec.audience is not None:
        claims["aud"] = spec.audience
    print(jwt.encode(claims, secret, algorithm="HS256"))
    return 0


def run_serve(args: argparse.Namespace, console: Console) -> int:
    from floorguard.proxy.config.guard import load_config  # noqa: PLC0415  # see the imports
    from floorguard.proxy.process.serve import (  # noqa: PLC0415
        event_loop_line,
        run_guard,
        start_report,
        start_warnings,
    )
    from floorguard.proxy.process.workers import supervise  # noqa: PLC0415

    config = load_config(args.config)
    say = _sayer(config.log_format, console)
    backends = (
        {name: [b.url for b in spec.backends] for name, spec in config.models.items()}
        if config.models is not None
        else [b.url for b in config.backends]
    )
    if args.worker is not None:  # one of `workers: N`, started by the supervisor below
        if not 0 <= args.worker < config.workers:
            raise FloorguardError(f"--worker {args.worker}: not one of workers: {config.workers}")
        mine = config.for_worker(args.worker)

        def worker_listening(url: str, admin: str | None) -> None:
            say(f"worker {args.worker} ({mine.replica}) on {url}, admin {admin}")

        run_guard(mine, worker_listening, str(args.config), args.worker)
        return 0
    for line in [event_loop_line(config), *start_report(config)]:
        say(line)
    warnings = start_warnings(config)
    for warning in warnings:
        say(f"warning: {warning}", warning=True)
    outside = [w for w in warnings if "outside docs/design.md §6's region" in w]
    if config.strict and outside:
        raise FloorguardError(
            "strict: true and " + "; ".join(outside) + " — refusing to start (set the floors, "
            "slots or deadlines inside the region, or strict: false)"
        )
    if args.check:
        return _checked(config, console)

    if config.workers > 1:
        scheme = "https" if config.tls else "http"
        say(
            f"floorguard guarding {backends} on {scheme}://{config.host}:{config.port} with "
            f"{config.workers} workers (admin ports {config.admin.port}–"
            f"{(config.admin.port or 0) + config.workers - 1})"
        )
        return supervise(args.config, config.workers, drain_timeout_s=config.drain_timeout_s)

    def listening(url: str, admin: str | None) -> None:
        admin_line = f" (admin on {admin})" if admin is not None else ""
        say(f"floorguard guarding {backends} on {url}{admin_line}")

    try:
        run_guard(config, listening, str(args.config))
    except OSError as exc:  # the port is taken, the address is not this host's, …
        raise FloorguardError(f"cannot listen on {config.host}:{config.port}: {exc}") from exc
    return 0


class _Say(Protocol):
    def __call__(self, line: str, *, warning: bool = False) -> None: ...


def _sayer(log_format: str, console: Console) -> _Say:
    """How `serve` says its start-up report and where it listens (stdout), with its log
    (stderr) set up to match: text lines, or JSON objects one a line (`log_format`)."""
    if log_format == "json":
        from floorguard.proxy.observe.json_logs import use_json_logs  # noqa: PLC0415

        report = use_json_logs()

        def as_json(line: str, *, warning: bool = False) -> None:
            report.log(logging.WARNING if warning else logging.INFO, line)

        return as_json
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    def as_text(line: str, *, warning: bool = False) -> None:
        console.print(line, markup=False, style="yellow" if warning else None)

    return as_text


def _checked(config: Any, console: Console) -> int:
    """`serve --check`: what start-up would refuse beyond the file itself (the identity's
    secret or keys, a TLS certificate), then a summary; nothing listens, nothing is
    fetched from the backends or Redis."""
    from floorguard.proxy.config.guard import server_ssl_context  # noqa: PLC0415
    from floorguard.proxy.edge.identity import create_identity  # noqa: PLC0415

    create_identity(config.identity)
    if config.tls is not None:
        server_ssl_context(config.tls)
    pools = config.pools()
    backends = sum(len(pool.backends) for pool in pools.values())
    tenants = len({c.tenant for c in config.contracts})
    console.print(
        f"config OK: {tenants} tenant(s), {backends} backend(s) in {len(pools)} pool(s), "
        f"identity {config.identity.mode}; `floorguard serve --config …` would start",
        markup=False,
    )
    return 0


def run_calibrate(args: argparse.Namespace, console: Console) -> int:
    from floorguard.calibrate import calibrate  # noqa: PLC0415  # see the imports

    if args.reps < 1:
        raise FloorguardError(f"--reps = {args.reps}: must be ≥ 1")
    if not args.json:
        console.print(f"probing {args.backend} ({args.model}, C = {args.slots})…", markup=False)
    result = calibrate(args.backend, args.model, slots=args.slots, reps=args.reps, name=args.name)
    if args.out is not None:
        result.save(args.out, backend=args.backend, model=args.model, slots=args.slots)
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
        "first_tokens": result.first_tokens(),
        "residuals": result.residuals,
        "out": str(args.out) if args.out else None,
    }
    print_result(summary, args.json, console)
    return 0


def run_emulate(args: argparse.Namespace, console: Console) -> int:
    from aiohttp import web  # noqa: PLC0415  # see the imports

    from floorguard.rig.emulator import Emulator, create_emulator_app  # noqa: PLC0415

    if args.slots < 1:
        raise FloorguardError(f"--slots = {args.slots}: must be ≥ 1")
    emulator = Emulator(
        args.profile,
        args.slots,
        priority_scheduling=args.scheduling_policy == "priority",
        model=args.model,
        kv_blocks=args.kv_blocks,
    )

    async def serve() -> None:
        runner = web.AppRunner(create_emulator_app(emulator))
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        port = runner.addresses[0][1]  # `--port 0`: the one the system gave
        console.print(
            f"emulated backend ({args.profile}, {args.slots} slots) on http://{args.host}:{port}",
            markup=False,
        )
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(serve())
    except OSError as exc:  # the port is taken, the address is not this host's, …
        raise FloorguardError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    return 0
