"""Evaluate the screens honestly (design §9): cells are (configuration, deadline) pairs whose
outcome re-thresholds *measured* assured sojourns at each of 33 deadlines; a configuration's
runs are never re-run per deadline.

The outcome of a cell is the measured assured SLO: the 95th percentile of admitted assured
sojourns (pooled over the test runs) is within the deadline. Each screen's *accept* is scored
for precision, recall, agreement and coverage, with 95 % intervals from a bootstrap that
resamples whole configurations, beside two baselines: always-reject and service-only
(accept iff ŝ ≤ D). Both screens see the same inputs from the calibration runs: ŝ by an
aggregation of their service samples, and the opportunistic rate they admitted (under a
learner the admitted surplus is measured, not configured).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from floorguard.analysis.stats import Interval, cluster_bootstrap
from floorguard.core.contract import DispatchOrder
from floorguard.screen.model import ScreenConfig, ScreenModel, aggregate, predict, service_only

__all__ = [
    "BASELINES",
    "DEADLINES_S",
    "VERDICTS",
    "Cell",
    "Scores",
    "cells_for",
    "clustered_scores",
    "held_out",
    "score",
]

DEADLINES_S = tuple(d / 1000 for d in range(300, 3501, 100))
"""The 33 deadlines every configuration is re-thresholded at: 300, 400, …, 3500 ms."""

BASELINES = ("service-only", "always-reject")
VERDICTS = (*(m.value for m in ScreenModel), *BASELINES)
"""Every verdict a cell carries: the two screens, then the two baselines."""

Row = Mapping[str, Any]
"""A run's row (the experiments' `RunRow` is one)."""


@dataclass(frozen=True)
class Cell:
    config: str
    deadline_s: float
    rho_hat: float
    """The runs' offered ρ̂ (offered load / measured μ_sat), the grids' axis."""
    service_s: float
    """ŝ from the calibration runs."""
    measured_p95_s: float
    met: bool
    predicted_s: dict[str, float]
    """Each screen's predicted assured sojourn (`math.inf`: unbounded)."""
    accepts: dict[str, bool]
    """Each verdict in `VERDICTS`."""
    dispatch: str = "assured-first"
    admitted_load: float = 0.0
    """What the stack in front admitted, as the screens see it: (admitted assured +
    admitted opportunistic rate) · ŝ / C."""
    competing_load: float = 0.0
    """The first-moment screen's `ρ_rel`: the admitted work that competes with an assured
    request (assured-first: the assured load alone; FIFO: all of it). Past 1 its queue has
    no steady state and the screen's mean wait is unbounded."""


def screen_config(row: Row, service_s: float, opportunistic_rate_per_s: float) -> ScreenConfig:
    """The screens' view of an experiment condition: the same B, C, W and dispatch, the
    offered assured rate (the shipped meter decides what is admitted) and the admitted
    opportunistic rate."""
    dispatch = DispatchOrder.FIFO if row["policy"] == "gated-fifo" else DispatchOrder.ASSURED_FIRST
    return ScreenConfig(
        floor=row["floor"],
        slots=row["slots"],
        service_s=service_s,
        window_s=row.get("window_s", 1.0),
        dispatch=dispatch,
        assured_rate_per_s=row["assured_rate"],
        opportunistic_rate_per_s=opportunistic_rate_per_s,
    )


def cells_for(
    config: str, calibration: Sequence[Row], test: Sequence[Row], aggregation: str
) -> list[Cell]:
    """All 33 cells of one configuration: ŝ and the admitted opportunistic rate from the
    calibration runs, the outcome from the test runs' assured sojourns (run-level disjoint
    when they differ)."""
    s_hat = aggregate([s for r in calibration for s in r["services"]], aggregation)
    opportunistic = float(np.mean([r["o_admitted_per_s"] for r in calibration]))
    sojourns = [s for r in test for s in r["a_sojourns"]]
    p95 = float(np.percentile(sojourns, 95)) if sojourns else float("inf")
    rho_hat = float(np.mean([r["rho_hat"] for r in test]))
    base = screen_config(test[0], s_hat, opportunistic)
    predictions = {m.value: predict(base, m) for m in ScreenModel}
    predicted = {name: p.sojourn_s for name, p in predictions.items()}
    assured = predictions[ScreenModel.FIRST_MOMENT.value].admitted_assured_per_window
    admitted_load = (assured / base.window_s + opportunistic) * s_hat / base.slots
    return [
        Cell(
            config,
            deadline,
            rho_hat,
            s_hat,
            p95,
            p95 <= deadline,
            predicted,
            {
                **{name: sojourn <= deadline for name, sojourn in predicted.items()},
                "service-only": service_only(s_hat, deadline),
                "always-reject": False,
            },
            base.dispatch.value,
            admitted_load,
            predictions[ScreenModel.FIRST_MOMENT.value].rho_rel,
        )
        for deadline in DEADLINES_S
    ]


@dataclass(frozen=True)
class Scores:
    n: int
    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def accepts(self) -> int:
        return self.tp + self.fp

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

    def __add__(self, other: Scores) -> Scores:
        return Scores(
            self.n + other.n,
            self.tp + other.tp,
            self.fp + other.fp,
            self.fn + other.fn,
            self.tn + other.tn,
        )


def score(cells: Sequence[Cell], verdict: str) -> Scores:
    tp = fp = fn = tn = 0
    for cell in cells:
        accept = cell.accepts[verdict]
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
    cells: Sequence[Cell], verdict: str, num_resamples: int = 1000
) -> dict[str, Interval]:
    """Each metric with a 95 % bootstrap interval resampling whole configurations (each
    configuration's confusion counts are one cluster)."""
    by_config: dict[str, list[Cell]] = {}
    for cell in cells:
        by_config.setdefault(cell.config, []).append(cell)
    clusters = [score(group, verdict) for group in by_config.values()]

    def metric_of(
        metric: Callable[[Scores], float | None],
    ) -> Callable[[Sequence[Scores]], float | None]:
        return lambda groups: metric(sum(groups, Scores(0, 0, 0, 0, 0)))

    return {
        name: cluster_bootstrap(clusters, metric_of(metric), num_resamples=num_resamples)
        for name, metric in METRICS.items()
    }


def held_out(
    runs_by_config: Mapping[str, Sequence[Row]], fraction: float, aggregation: str
) -> tuple[int, list[list[Cell]]]:
    """Rotated k-fold, run-level disjoint: in fold i, ŝ (and the admitted opportunistic
    rate) come from a rotating block of `round(fraction·reps)` runs (at least one, at most
    reps − 1) and the outcome from the remaining runs of the same configuration. Returns
    the block size and each fold's cells."""
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
        folds.append(cells)
    return size, folds
