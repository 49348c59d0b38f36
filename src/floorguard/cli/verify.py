"""`floorguard verify`: a decision log checked for AF, DR, ORDER, SLOTS, MEMORY, TERMINAL (and
SF)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from floorguard.analysis.checker import check_fleet, check_trace, format_prefix
from floorguard.analysis.report import CheckReport, Violation
from floorguard.core.events import TraceEvent, read_jsonl
from floorguard.proxy.observe.decision_log import rotated_segments

__all__ = ["register", "run"]


def register(commands: Any) -> None:
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
    verify.add_argument(
        "--rotated",
        action="store_true",
        help="each log was rotated (decision_log_rotate): read its segments LOG.<time>-<n> "
        "in order, then LOG, as one log",
    )
    verify.add_argument("--json", action="store_true")

    verify.set_defaults(run=run)


def _read(path: Path, rotated: bool, torn: list[int]) -> list[TraceEvent]:
    """One log; `rotated`: its segments in order, then the file itself. Lines a dying
    writer left half-written are skipped and counted in `torn`."""
    segments = rotated_segments(path) if rotated else [path]
    return [e for segment in segments for e in read_jsonl(str(segment), torn)]


def run(args: argparse.Namespace, console: Console) -> int:
    torn: list[int] = []
    logs = [_read(path, args.rotated, torn) for path in args.trace]
    if args.fleet or len(logs) > 1:
        report = check_fleet(logs, allow_open=args.allow_open)
    else:
        report = check_trace(logs[0], allow_open=args.allow_open)
    report.num_torn_lines = len(torn)
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
                    "num_ttft_late": report.num_ttft_late,
                    "outcomes": dict(report.counts),
                    "violations": [asdict(v) for v in report.violations[:100]],
                    "conditional": [asdict(v) for v in report.conditional[:100]],
                    "store_degraded_s": report.degraded_s,
                    "fleet_peak_in_flight": report.fleet_peak_in_flight,
                    "num_died_open": report.num_died_open,
                    "num_torn_lines": report.num_torn_lines,
                },
                indent=2,
            )
        )
    else:
        _say(report, args, logs, failed, console)
    return 1 if failed else 0


def _say(
    report: CheckReport,
    args: argparse.Namespace,
    logs: list[list[TraceEvent]],
    failed: list[Violation],
    console: Console,
) -> None:
    """The report in words (without `--json`)."""
    console.print(
        f"{report.num_requests} requests, {report.num_events} events: "
        f"{report.num_entitled} floor-entitled, {report.num_drops} drops, "
        f"outcomes {dict(report.counts)}"
    )
    if report.num_sf_late:
        console.print(
            f"SF: {report.num_sf_late} floor-entitled requests completed late "
            f"(conditional property, docs/design.md §6)"
        )
    ttft = [v for v in report.conditional if v.prop == "TTFT"]
    if report.num_ttft_late:
        console.print(
            f"TTFT: {report.num_ttft_late} floor-entitled first token(s) late, "
            f"{len(ttft)} of them conditional (outside docs/design.md §19's region, or the "
            "backend's)",
            markup=False,
        )
    degraded = [(path, s) for path, s in zip(args.trace, report.degraded_s, strict=False) if s]
    for path, seconds in degraded:
        console.print(
            f"store: {path} decided on its store's fallback for {seconds:.1f} s",
            markup=False,
        )
    for backend, peak in report.fleet_peak_in_flight.items():
        console.print(f"fleet: at most {peak} in flight at {backend}", markup=False)
    if report.num_died_open or report.num_torn_lines:
        console.print(
            f"restarts: {report.num_died_open} request(s) were in flight at a replica "
            f"that died (its log starts again); {report.num_torn_lines} half-written "
            "line(s) a dying writer left, skipped",
            markup=False,
        )
    store = [v for v in report.conditional if v.prop != "TTFT"]
    if store:
        console.print(
            f"AF conditional on the store: {len(store)} finding(s) in windows "
            "where a replica decided on its fallback (docs/replicas.md), e.g. " + store[0].message,
            markup=False,
        )
    if failed:
        if len(logs) > 1:
            console.print(f"in {args.trace[failed[0].log]}:", markup=False)
        console.print(format_prefix(logs[failed[0].log], failed[0]), markup=False, highlight=False)
        console.print(f"FAIL: {len(failed)} violation(s)")
    else:
        console.print(
            "OK: AF, DR, ORDER, SLOTS, MEMORY, TERMINAL hold"
            + (", SF holds" if args.strict_sf else "")
        )
