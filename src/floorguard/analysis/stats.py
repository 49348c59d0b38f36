"""Statistics for the experiment suite (docs/design.md §8).

The run (or trace slice) is the replication unit. Per condition:

* `clopper_pearson(k, n)`: exact two-sided interval for a run-level proportion (k of n runs
  met the criterion), computed per condition, never pooled across conditions;
* `wilson(k, n)`: request-level interval (k of n requests). Requests in one run share load
  and are correlated, so this interval is *optimistic*; tables label it so;
* `spearman(x, y)`: rank correlation with average ranks for ties (tie-corrected) and its
  two-sided p-value;
* `cluster_bootstrap(clusters, statistic)`: resample whole clusters (configurations, runs)
  with replacement, so within-cluster correlation is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple, TypeVar

import numpy as np
from scipy import stats

__all__ = ["Interval", "clopper_pearson", "cluster_bootstrap", "spearman", "wilson"]

T = TypeVar("T")


class Interval(NamedTuple):
    estimate: float | None
    low: float | None
    high: float | None

    def fmt(self, digits: int = 3) -> str:
        if self.estimate is None or self.low is None or self.high is None:
            return "–"
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _binomial(k: int, n: int, method: Literal["exact", "wilson"], confidence: float) -> Interval:
    if n <= 0:
        return Interval(None, None, None)
    if not 0 <= k <= n:
        raise ValueError(f"k = {k}: must be within [0, n = {n}]")
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method=method)
    return Interval(k / n, float(ci.low), float(ci.high))


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> Interval:
    return _binomial(k, n, "exact", confidence)


def wilson(k: int, n: int, confidence: float = 0.95) -> Interval:
    return _binomial(k, n, "wilson", confidence)


class Correlation(NamedTuple):
    rho: float | None
    p_value: float | None
    n: int


def spearman(x: Sequence[float], y: Sequence[float]) -> Correlation:
    """Tie-corrected Spearman ρ (Pearson on average ranks) with its two-sided p-value; None
    when fewer than 3 pairs or a constant side make it undefined."""
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} vs {len(y)})")
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return Correlation(None, None, len(x))
    result = stats.spearmanr(x, y)
    return Correlation(float(result.statistic), float(result.pvalue), len(x))


def cluster_bootstrap(
    clusters: Sequence[T],
    statistic: Callable[[Sequence[T]], float | None],
    *,
    num_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile interval of `statistic` over resamples of whole clusters."""
    if not clusters:
        return Interval(None, None, None)
    estimate = statistic(clusters)
    rng = np.random.default_rng(seed)
    n = len(clusters)
    values = []
    for _ in range(num_resamples):
        value = statistic([clusters[i] for i in rng.integers(0, n, n)])
        if value is not None:
            values.append(value)
    if not values:
        return Interval(estimate, None, None)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Interval(estimate, float(low), float(high))
