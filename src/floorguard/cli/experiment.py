"""`floorguard experiment`: the docs/design.md §10 suite, on the simulator or on a real backend."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from floorguard.errors import FloorguardError

__all__ = ["register", "run"]


def register(commands: Any) -> None:
    experiment = commands.add_parser("experiment", help="the docs/design.md §10 experiment suite")
    actions = experiment.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="list the catalogue")
    run_parser = actions.add_parser("run", help="run experiments by id, or all")
    run_parser.add_argument("ids", nargs="+", help="experiment ids (E1 … E23), or 'all'")
    run_parser.add_argument("--out", type=Path, default=Path("out/experiments"))
    run_parser.add_argument("--reps", type=int, help="override every experiment's reps")
    run_parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller grids and 2 reps (smoke); with --backend, 1 rep",
    )
    run_parser.add_argument("--workers", type=int, help="worker processes (default: all cores)")
    run_parser.add_argument("--burstgpt", help="a real BurstGPT CSV to add to E12's sources")
    run_parser.add_argument(
        "--results-md",
        type=Path,
        help="also write the full report with inline tables here (docs/results.md); with "
        "--backend, the fidelity section of that file",
    )
    real = run_parser.add_argument_group(
        "on a real backend (E1, E3, E4, E5, E8; E21, E22, E23 alone; docs/vllm.md)",
        "run the experiments against an OpenAI-compatible backend with C slots (vLLM: "
        "--max-num-seqs C --scheduling-policy priority), rescaled to its measured capacity, "
        "each beside the simulator's prediction for its calibrated profile; the short grids "
        "(E1: β ∈ {0, 1}), 9 reps. E21 and E22 run alone on a backend started with a small KV "
        "cache (their conditions for that cache; --profile from one calibrated with a full "
        "cache)",
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

    experiment.set_defaults(run=run)


def run(args: argparse.Namespace, console: Console) -> int:
    # the suite loads in a second or more: imported when it runs, not for `--help`
    from floorguard.experiments.catalogue import catalogue  # noqa: PLC0415
    from floorguard.experiments.real import (  # noqa: PLC0415
        OWN_SECTION,
        REAL_EXPERIMENTS,
        run_on_backend,
    )
    from floorguard.experiments.report import run_suite  # noqa: PLC0415

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
            ids = [i for i in REAL_EXPERIMENTS if i not in OWN_SECTION]
        if not args.model:
            raise FloorguardError("--backend needs --model (the name the backend serves)")
        command = " ".join(
            ["floorguard experiment run", *args.ids, "--backend", args.backend]
            + ["--model", args.model]
            + (["--quick"] if args.quick else [])
            + ([f"--reps {args.reps}"] if args.reps else [])
            + ([f"--duration-s {args.duration_s:g}"] if args.duration_s else [])
        )
        run_on_backend(
            [experiments[i] for i in ids],
            args.backend,
            args.model,
            profile=args.profile,
            out=args.out,
            reps=args.reps,
            quick=args.quick,
            duration_s=args.duration_s,
            results_md=args.results_md,
            command=command,
            console=console,
        )
        return 0
    if args.model or args.profile or args.duration_s:
        raise FloorguardError("--model, --profile and --duration-s go with --backend")
    run_suite(
        [experiments[i] for i in ids],
        out=args.out,
        reps=args.reps,
        quick=args.quick,
        workers=args.workers,
        results_md=args.results_md,
        command="floorguard experiment run "
        + " ".join(args.ids)
        + (" --quick" if args.quick else ""),
        console=console,
    )
    return 0
