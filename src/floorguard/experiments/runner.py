"""Run experiments: fan the (condition × rep) runs out over a process pool, then write each
experiment's tidy CSV, full JSONL, Markdown table and figures, and the report.

Seeds are common random numbers: a run's seed depends on the experiment, the rep and the
trace slice only, so conditions compared within an experiment (guard vs unguarded, β, d,
FIFO vs priority) see identical arrivals.
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from floorguard.experiments.conditions import Condition, run_condition
from floorguard.experiments.spec import Experiment, Row
from floorguard.experiments.tables import markdown_table, summarize, write_csv

__all__ = ["ExperimentResult", "progress_bar", "run_experiments", "seed_for", "write_rows"]


def progress_bar(console: Console) -> Progress:
    """The experiment runners' progress: description, bar, done/total, elapsed."""
    return Progress(
        *Progress.get_default_columns()[:2],
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def seed_for(experiment_id: str, rep: int, condition: Condition) -> int:
    entropy = [zlib.crc32(experiment_id.encode()), rep, condition.slice_index]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


@dataclass
class ExperimentResult:
    experiment: Experiment
    rows: list[Row]
    table_md: str
    figures: list[Path]
    wall_s: float


def _tasks(
    experiments: Sequence[Experiment], reps: int | None, quick: bool
) -> list[tuple[str, int, int, Condition, int]]:
    tasks = []
    for experiment in experiments:
        n = reps if reps is not None else (experiment.quick_reps if quick else experiment.reps)
        for index, condition in enumerate(experiment.grid(quick)):
            for rep in range(n):
                tasks.append(
                    (experiment.id, index, rep, condition, seed_for(experiment.id, rep, condition))
                )
    return tasks


def _run_task(task: tuple[str, int, int, Condition, int]) -> tuple[str, int, int, Row, float]:
    experiment_id, index, rep, condition, seed = task
    started = time.perf_counter()
    row = run_condition(condition, seed)
    row["rep"] = rep
    return experiment_id, index, rep, row, time.perf_counter() - started


def run_experiments(
    experiments: Sequence[Experiment],
    *,
    out: Path,
    reps: int | None = None,
    quick: bool = False,
    workers: int | None = None,
    console: Console | None = None,
) -> list[ExperimentResult]:
    console = console or Console(stderr=True)
    tasks = _tasks(experiments, reps, quick)
    collected: dict[str, list[tuple[int, int, Row]]] = {e.id: [] for e in experiments}
    cpu_s: dict[str, float] = dict.fromkeys(collected, 0.0)
    workers = workers or os.cpu_count() or 1
    with (
        ProcessPoolExecutor(max_workers=workers) as pool,
        progress_bar(console) as progress,
    ):
        bar = progress.add_task(
            f"{len(experiments)} experiment(s), {workers} workers", total=len(tasks)
        )
        futures = [pool.submit(_run_task, task) for task in tasks]
        for future in as_completed(futures):
            experiment_id, index, rep, row, seconds = future.result()
            collected[experiment_id].append((index, rep, row))
            cpu_s[experiment_id] += seconds
            progress.advance(bar)
    results = []
    for experiment in experiments:
        rows = [row for _, _, row in sorted(collected[experiment.id], key=lambda t: t[:2])]
        results.append(_write(experiment, rows, out / experiment.id, cpu_s[experiment.id]))
    return results


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def write_rows(rows: Sequence[Row], folder: Path, stem: str = "runs") -> None:
    """`STEM.csv` and `STEM.jsonl` in `folder`: one row per run; NaN is JSON null."""
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(rows, folder / f"{stem}.csv")
    with (folder / f"{stem}.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps({k: _jsonable(v) for k, v in row.items()}, default=str) + "\n")


def _write(experiment: Experiment, rows: list[Row], folder: Path, cpu_s: float) -> ExperimentResult:
    write_rows(rows, folder)
    table = markdown_table(experiment, summarize(rows))
    if experiment.extra is not None:
        table += "\n\n" + experiment.extra(rows)
    (folder / "table.md").write_text(
        f"# {experiment.id}: {experiment.title}\n\n{experiment.caption}\n\n{table}\n"
    )
    figures = [draw(rows, folder) for draw in experiment.figures]
    return ExperimentResult(experiment, rows, table, figures, cpu_s)
