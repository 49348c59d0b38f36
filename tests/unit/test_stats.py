from __future__ import annotations

import pytest

from floorguard.analysis.stats import clopper_pearson, cluster_bootstrap, spearman, wilson


def test_clopper_pearson_matches_known_values():
    """Exact interval: 0 of 10 gives [0, 0.3085]; 10 of 10 gives [0.6915, 1]."""
    none = clopper_pearson(0, 10)
    assert (none.estimate, none.low) == (0.0, 0.0) and none.high == pytest.approx(0.30850, abs=1e-4)
    every = clopper_pearson(10, 10)
    assert every.low == pytest.approx(0.69150, abs=1e-4) and every.high == 1.0


def test_wilson_is_narrower_than_exact_and_handles_empty():
    """Wilson (request level) is narrower than Clopper–Pearson at the same k, n; n = 0 is
    undefined, not an error."""
    exact, approx = clopper_pearson(3, 100), wilson(3, 100)
    assert approx.high - approx.low < exact.high - exact.low
    assert wilson(0, 0).estimate is None and wilson(0, 0).fmt() == "–"
    with pytest.raises(ValueError):
        wilson(5, 3)


def test_spearman_with_ties_and_degenerate_input():
    """Average ranks for ties; a constant side or < 3 pairs is undefined (None)."""
    r = spearman([1, 2, 2, 3, 4], [10, 20, 20, 30, 40])
    assert r.rho == pytest.approx(1.0) and r.p_value < 0.01
    assert spearman([1, 2, 3], [5, 5, 5]).rho is None
    assert spearman([1, 2], [1, 2]).rho is None
    anti = spearman([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1])
    assert anti.rho == pytest.approx(-1.0)


def test_cluster_bootstrap_keeps_clusters_whole():
    """Resampling clusters: identical clusters give a zero-width interval; varied ones do
    not, and the interval contains the estimate."""
    same = cluster_bootstrap(
        [(1, 2)] * 10, lambda cs: sum(a for a, _ in cs) / sum(b for _, b in cs)
    )
    assert same.low == same.high == same.estimate == 0.5
    varied = cluster_bootstrap(
        [(0, 2), (2, 2), (1, 2), (2, 2), (0, 2)],
        lambda cs: sum(a for a, _ in cs) / sum(b for _, b in cs),
    )
    assert varied.low < varied.estimate < varied.high
