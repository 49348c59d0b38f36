"""Evaluate the screen honestly (SPEC §9): cells are (configuration, deadline) pairs whose
outcome re-thresholds *measured* assured sojourns at each of 33 deadlines; a configuration's
runs are never re-run per deadline.

The outcome of a cell is the measured assured SLO: the 95th percentile of admitted assured
sojourns (pooled over the test runs) is within the deadline. The screen's *accept* is
scored for precision, recall, agreement and coverage, with 95 % intervals from a bootstrap
that resamples whole configurations, beside two baselines: always-reject and service-only
(accept iff ŝ ≤ D).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from floorguard.analysis.stats import Interval, cluster_bootstrap
from floorguard.core.contract import DispatchOrder
from floorguard.screen.model import ScreenConfig, aggregate, screen, service_only

__all__ = [
    "DEADLINES_S",
    "Cell",
    "Scores",
    "cells_for",
    "clustered_scores",
    "held_out",
    "score",
]

DEADLINES_S = tuple(d / 1000 for d in range(300, 3501, 100))
"""The 33 deadlines every configuration is re-thresholded at: 300, 400, …, 3500 ms."""

Row = dict[str, Any]


@dataclass(frozen=True)
class Cell:
    config: str
    deadline_s: float
    rho_hat: float
    predicted_s: float
    measured_p95_s: float
    met: bool
    accept: bool
    service_only: bool
    always_reject: bool = False


def screen_config(row: Row, service_s: float) -> ScreenConfig:
    """The screen's view of an experiment condition: the same B, C, W, loads and dispatch."""
    dispatch = DispatchOrder.FIFO if row["policy"] == "gated-fifo" else DispatchOrder.ASSURED_FIRST
    return ScreenConfig(
        floor=row["floor"],
        slots=row["slots"],
        service_s=service_s,
        dispatch=dispatch,
        assured_rate_per_s=row["assured_rate"],
        opportunistic_rate_per_s=row["opp_rate"],
    )


def cells_for(
    config: str, calibration: Sequence[Row], test: Sequence[Row], aggregation: str
) -> list[Cell]:
    """All 33 cells of one configuration: ŝ from the calibration runs' service samples, the
    outcome from the test runs' assured sojourns (run-level disjoint when they differ)."""
    s_hat = aggregate([s for r in calibration for s in r["services"]], aggregation)
    sojourns = [s for r in test for s in r["a_sojourns"]]
    p95 = float(np.percentile(sojourns, 95)) if sojourns else float("inf")
    base = screen_config(test[0], s_hat)
    out = []
    for deadline in DEADLINES_S:
        verdict = screen(base, deadline)
        out.append(
            Cell(
                config,
                deadline,
                verdict.rho_hat,
                verdict.predicted_sojourn_s,
                p95,
                p95 <= deadline,
                verdict.accept,
                service_only(s_hat, deadline),
            )
        )
    return out


@dataclass(frozen=True)
class Scores:
    n: int
    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def agreement(self) -> float | None:
        return (self.tp + self.tn) / self.n if self.n else None

    @property
    def coverage(self) -> float | None:
        return (self.tp + self.fp) / self.n if self.n else None


def score(cells: Sequence[Cell], verdict: str = "accept") -> Scores:
    tp = fp = fn = tn = 0
    for cell in cells:
        accept = getattr(cell, verdict)
        if accept and cell.met:
            tp += 1
        elif accept:
            fp += 1
        elif cell.met:
            fn += 1
        else:
            tn += 1
    return Scores(len(cells), tp, fp, fn, tn)


METRICS: dict[str, Callable[[Scores], float | None]] = {
    "precision": lambda s: s.precision,
    "recall": lambda s: s.recall,
    "agreement": lambda s: s.agreement,
    "coverage": lambda s: s.coverage,
}


def clustered_scores(
    cells: Sequence[Cell], verdict: str = "accept", num_resamples: int = 1000
) -> dict[str, Interval]:
    """Each metric with a 95 % bootstrap interval resampling whole configurations."""
    by_config: dict[str, list[Cell]] = {}
    for cell in cells:
        by_config.setdefault(cell.config, []).append(cell)
    clusters = list(by_config.values())

    def metric_of(
        metric: Callable[[Scores], float | None],
    ) -> Callable[[Sequence[list[Cell]]], float | None]:
        return lambda groups: metric(score([c for g in groups for c in g], verdict))

    return {
        name: cluster_bootstrap(clusters, metric_of(metric), num_resamples=num_resamples)
        for name, metric in METRICS.items()
    }


def held_out(
    runs_by_config: dict[str, list[Row]], fraction: float, aggregation: str
) -> list[Scores]:
    """Rotated k-fold, run-level disjoint: in fold i, `ŝ` comes from a rotating block of
    ⌈fraction·reps⌉ runs and the outcome from the remaining runs of the same configuration."""
    reps = min(len(runs) for runs in runs_by_config.values())
    size = max(1, min(reps - 1, round(fraction * reps)))
    folds = []
    for fold in range(reps):
        cells: list[Cell] = []
        for config, runs in runs_by_config.items():
            chosen = {(fold + j) % reps for j in range(size)}
            calibration = [r for i, r in enumerate(runs[:reps]) if i in chosen]
            test = [r for i, r in enumerate(runs[:reps]) if i not in chosen]
            cells += cells_for(config, calibration, test, aggregation)
        folds.append(score(cells))
    return folds
