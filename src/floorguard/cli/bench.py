"""`floorguard bench …`: each benchmark beside a reference measured in the same run. A
bench's modules are imported when it runs, not when the parser is built (`--help` stays
fast: the experiment suite and the simulator load in a second or more)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from floorguard.cli._common import print_result
from floorguard.errors import FloorguardError

__all__ = ["register", "run"]


def _bench(name: str) -> Any:
    """`floorguard.bench.<name>`, imported now (a bench's modules are heavy)."""
    return importlib.import_module(f"floorguard.bench.{name}")


def register(commands: Any) -> None:
    bench = commands.add_parser("bench", help="benchmarks, each beside a reference")
    kinds = bench.add_subparsers(dest="bench", required=True)
    sim_cmd = kinds.add_parser("sim", help="simulated requests/s and µs per decision")
    sim_cmd.add_argument("--duration-s", type=float, default=600.0)
    sim_cmd.add_argument("--repeats", type=int, default=3)
    sim_cmd.add_argument(
        "--fleet",
        action="store_true",
        help="requests per wall second at fleet scale (8 replicas × 64 backends × 50 "
        "tenants) beside the single-backend figure",
    )
    sim_cmd.add_argument("--json", action="store_true")
    bench_proxy_cmd = kinds.add_parser("proxy", help="latency and throughput the guard adds")
    bench_proxy_cmd.add_argument("--requests", type=int, default=400)
    bench_proxy_cmd.add_argument("--repeats", type=int, default=2)
    bench_proxy_cmd.add_argument(
        "--workers",
        type=int,
        default=None,
        help="instead: a guard with `workers: N` beside one with a single worker, both on a "
        "local redis-server (requests/s at concurrency 32, CPU-seconds per request)",
    )
    bench_proxy_cmd.add_argument(
        "--client",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="with --workers: the load generator (auto: wrk where installed, which leaves "
        "the cores to the guard; else this process's aiohttp client)",
    )
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
    bench_cal = kinds.add_parser(
        "calibration", help="each profile against the published targets (docs/design.md §5, §11)"
    )
    bench_cal.add_argument(
        "--fit", action="store_true", help="also re-run the least-squares fit (minutes)"
    )
    bench_cal.add_argument("--json", action="store_true")
    bench_backlog_cmd = kinds.add_parser(
        "backlog",
        help="what requests waiting inside a vLLM server cost the ones it runs "
        "(beside an empty queue)",
    )
    bench_backlog_cmd.add_argument(
        "--backend", required=True, help="a vLLM server run with --scheduling-policy priority"
    )
    bench_backlog_cmd.add_argument("--model", required=True, help="its served model name")
    bench_backlog_cmd.add_argument(
        "--slots", type=int, default=4, help="its --max-num-seqs (default 4)"
    )
    bench_backlog_cmd.add_argument(
        "--waiting",
        default="0,100,300",
        help="backlog sizes to hold in its queue, comma-separated (default 0,100,300)",
    )
    bench_backlog_cmd.add_argument("--repeats", type=int, default=3)
    bench_backlog_cmd.add_argument("--json", action="store_true")
    bench_handoff_cmd = kinds.add_parser(
        "handoff",
        help="the hand-off into a freed slot through the guard, beside the backend's own "
        "queue (the dispatch gap)",
    )
    bench_handoff_cmd.add_argument("--backend", required=True, help="an OpenAI-compatible URL")
    bench_handoff_cmd.add_argument("--model", required=True, help="its served model name")
    bench_handoff_cmd.add_argument("--slots", type=int, default=4, help="its concurrency (4)")
    bench_handoff_cmd.add_argument("--requests", type=int, default=60, help="per path and rep")
    bench_handoff_cmd.add_argument("--tokens", type=int, default=16, help="output tokens (16)")
    bench_handoff_cmd.add_argument("--repeats", type=int, default=2)
    bench_handoff_cmd.add_argument("--json", action="store_true")
    bench_tenants_cmd = kinds.add_parser(
        "tenants",
        help="µs per decision and the core configuration's build as tenants (10 – 100,000) "
        "and backends (1 – 256) grow, beside the smallest",
    )
    bench_tenants_cmd.add_argument(
        "--serve",
        action="store_true",
        help="`serve` itself at 10, 1,000 and 100,000 tenants and 1, 16 and 256 backends: its "
        "start (exec to listening), a SIGHUP reload and its resident memory, against an "
        "emulated backend (each backend one of its loopback addresses)",
    )
    bench_tenants_cmd.add_argument("--requests", type=int, default=20_000, help="per cell")
    bench_tenants_cmd.add_argument("--repeats", type=int, default=3)
    bench_tenants_cmd.add_argument("--json", action="store_true")
    bench.set_defaults(run=run)


def run(args: argparse.Namespace, console: Console) -> int:  # noqa: PLR0912  # one per bench
    if args.bench == "handoff":
        return _handoff(args, console)
    if args.bench == "backlog":
        return _backlog(args, console)
    if args.bench == "tenants":
        return _tenants(args, console)
    if args.bench == "sim" and args.fleet:
        result = _bench("sim").bench_fleet(repeats=args.repeats)
    elif args.bench == "sim":
        result = _bench("sim").bench_sim(duration_s=args.duration_s, repeats=args.repeats)
    elif args.bench == "proxy" and args.workers is not None:
        result = _bench("workers").bench_workers(
            workers=args.workers, requests=args.requests, repeats=args.repeats, client=args.client
        )
    elif args.bench == "proxy":
        result = _bench("proxy").bench_proxy(requests=args.requests, repeats=args.repeats)
    elif args.bench == "soak":
        if not args.minutes > 0 or not args.overload > 0:
            raise FloorguardError("--minutes and --overload must be > 0")
        result = _bench("soak").bench_soak(minutes=args.minutes, overload=args.overload)
    elif args.bench == "store":
        if args.requests < args.concurrency or args.concurrency < 1:
            raise FloorguardError("--requests must be ≥ --concurrency ≥ 1")
        result = _bench("store").bench_store(
            redis_url=args.redis,
            requests=args.requests,
            concurrency=args.concurrency,
            repeats=args.repeats,
        )
    else:

        def progress(evaluations: int, cost: float) -> None:
            if evaluations % 50 == 0:
                console.print(f"fit: {evaluations} evaluations, sum of squares {cost:.4f}")

        result = _bench("calibration").bench_calibration(fit=args.fit, progress=progress)
        if not args.json:
            _bench("calibration").render_calibration(result, console)
            return 0
    print_result(result, args.json, console)
    return 0


def _tenants(args: argparse.Namespace, console: Console) -> int:
    if args.requests < 1 or args.repeats < 1:
        raise FloorguardError("--requests and --repeats must be ≥ 1")
    if args.serve:
        return _serve_tenants(args, console)
    result = _bench("tenants").bench_tenants(requests=args.requests, repeats=args.repeats)
    if args.json:
        print_result(result, True, console)
        return 0
    title = f"a decision and a configuration by tenants and backends ({result['core']})"
    table = Table(title=title)
    for column in ("tenants", "backends", "config built (s)", "µs / decision", "× smallest"):
        table.add_column(column, justify="right")
    for row in result["rows"]:
        table.add_row(
            f"{row['tenants']:,}",
            str(row["backends"]),
            f"{row['config_s']:.3f}",
            f"{row['decision_us']:.2f}",
            f"{row['decision_over_smallest']:.2f}",
        )
    console.print(table)
    return 0


def _serve_tenants(args: argparse.Namespace, console: Console) -> int:
    def say(line: str) -> None:
        console.print(line, style="dim")

    result = _bench("tenants").bench_serve_tenants(progress=None if args.json else say)
    if args.json:
        print_result(result, True, console)
        return 0
    table = Table(title=f"serve as tenants and backends grow ({result['core']})")
    columns = ("tenants", "backends", "file", "start (s)", "× smallest", "reload (s)",
               "RSS (MiB)", "KiB / tenant")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for row in result["rows"]:
        per = row["kib_per_tenant"]
        table.add_row(
            f"{row['tenants']:,}",
            str(row["backends"]),
            row["format"],
            f"{row['start_s']:.2f}",
            f"{row['start_over_smallest']:.2f}",
            f"{row['reload_s']:.2f}",
            f"{row['rss_mib']:.0f}",
            "—" if per is None else f"{per:.2f}",
        )
    console.print(table)
    return 0


def _handoff(args: argparse.Namespace, console: Console) -> int:
    def on_path(rep: int, name: str, row: dict[str, float]) -> None:
        console.print(
            f"rep {rep + 1}: {name}: median hand-off {row['median_ms']:.1f} ms", style="dim"
        )

    result = _bench("handoff").bench_handoff(
        args.backend, args.model, slots=args.slots, requests=args.requests,
        tokens=args.tokens, repeats=args.repeats, progress=None if args.json else on_path,
    )  # fmt: skip
    return _emit(result, args, console, _bench("handoff").render_handoff)


def _backlog(args: argparse.Namespace, console: Console) -> int:
    try:
        sizes = [int(n) for n in args.waiting.split(",") if n.strip()]
    except ValueError:
        raise FloorguardError(
            f"--waiting {args.waiting!r}: must be comma-separated whole numbers"
        ) from None

    def on_rep(rep: int, waiting: int, row: dict[str, float]) -> None:
        console.print(
            f"rep {rep + 1}: {waiting} waiting: step {row['held_step_ms']:.1f} ms, "
            f"service {row['held_service_ms']:.0f} ms",
            style="dim",
        )

    result = _bench("backlog").bench_backlog(
        args.backend, args.model, slots=args.slots, sizes=sizes, repeats=args.repeats,
        progress=None if args.json else on_rep,
    )  # fmt: skip
    return _emit(result, args, console, _bench("backlog").render_backlog)


def _emit(
    result: dict[str, Any],
    args: argparse.Namespace,
    console: Console,
    render: Callable[[dict[str, Any], Console], None],
) -> int:
    """JSON on stdout with `--json`, else the bench's own tables."""
    if args.json:
        print_result(result, True, console)
    else:
        render(result, console)
    return 0
