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
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from floorguard.experiments.conditions import Condition, run_condition
from floorguard.experiments.records import RunRow, run_row
from floorguard.experiments.spec import Experiment, Row
from floorguard.experiments.tables import markdown_table, summarize, write_csv

__all__ = [
    "Done",
    "ExperimentResult",
    "Task",
    "plan",
    "progress_bar",
    "run_experiments",
    "run_tasks",
    "seed_for",
    "write_rows",
]


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
    rows: list[RunRow]
    table_md: str
    figures: list[Path]
    wall_s: float


@dataclass(frozen=True)
class Task:
    """One run of the suite: an experiment's condition (its grid position `index`) and rep."""

    experiment_id: str
    index: int
    rep: int
    condition: Condition
    seed: int

    @property
    def key(self) -> tuple[str, int, int]:
        return self.experiment_id, self.index, self.rep

    def describe(self) -> str:
        return f"{self.experiment_id} {self.condition.policy} c{self.index} rep {self.rep}"


@dataclass(frozen=True)
class Done:
    task: Task
    row: Row
    seconds: float


def plan(
    experiments: Sequence[Experiment],
    reps_of: Callable[[Experiment], int],
    *,
    quick: bool = False,
    select: Callable[[Condition], bool] | None = None,
    transform: Callable[[Condition], Condition] | None = None,
) -> list[Task]:
    """Every (condition × rep) of `experiments`, in grid order: the conditions `select`
    keeps, each `transform`ed (a real backend rescales them) before its seed is drawn."""
    tasks = []
    for experiment in experiments:
        for index, written in enumerate(experiment.grid(quick)):
            if select is not None and not select(written):
                continue
            condition = transform(written) if transform is not None else written
            for rep in range(reps_of(experiment)):
                seed = seed_for(experiment.id, rep, condition)
                tasks.append(Task(experiment.id, index, rep, condition, seed))
    return tasks


def _simulate(task: Task) -> Done:
    started = time.perf_counter()
    row = run_condition(task.condition, task.seed)
    row["rep"] = task.rep
    return Done(task, row, time.perf_counter() - started)


def run_tasks(
    tasks: Sequence[Task],
    run: Callable[[Task], Row] | None = None,
    *,
    console: Console,
    label: str,
    workers: int | None = None,
) -> list[Done]:
    """Every task, in task order. With no `run`, the simulator's runs over a process pool of
    `workers`; with one (a real backend serves one run at a time), each in this process."""
    done: list[Done] = []
    with progress_bar(console) as progress:
        bar = progress.add_task(label, total=len(tasks))
        if run is None:
            with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
                futures = [pool.submit(_simulate, task) for task in tasks]
                for future in as_completed(futures):
                    done.append(future.result())
                    progress.advance(bar)
            order = {task.key: i for i, task in enumerate(tasks)}
            return sorted(done, key=lambda d: order[d.task.key])
        for task in tasks:
            progress.update(bar, description=task.describe())
            started = time.perf_counter()
            row = {**run(task), "rep": task.rep}
            done.append(Done(task, row, time.perf_counter() - started))
            progress.advance(bar)
    return done


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

    def reps_of(experiment: Experiment) -> int:
        if reps is not None:
            return reps
        return experiment.quick_reps if quick else experiment.reps

    tasks = plan(experiments, reps_of, quick=quick)
    workers = workers or os.cpu_count() or 1
    label = f"{len(experiments)} experiment(s), {workers} workers"
    done = run_tasks(tasks, console=console, label=label, workers=workers)
    results = []
    for experiment in experiments:
        mine = [d for d in done if d.task.experiment_id == experiment.id]
        rows = [d.row for d in mine]
        cpu_s = sum(d.seconds for d in mine)
        results.append(_write(experiment, rows, out / experiment.id, cpu_s))
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
    runs = [run_row(row) for row in rows]
    table = markdown_table(experiment, summarize(runs))
    if experiment.extra is not None:
        table += "\n\n" + experiment.extra(runs)
    (folder / "table.md").write_text(
        f"# {experiment.id}: {experiment.title}\n\n{experiment.caption}\n\n{table}\n"
    )
    figures = [draw(runs, folder) for draw in experiment.figures]
    return ExperimentResult(experiment, runs, table, figures, cpu_s)
