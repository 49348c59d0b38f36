from __future__ import annotations

import numpy as np
import pytest

from floorguard.errors import ConfigError
from floorguard.sim.traces import TraceData
from floorguard.sim.workloads import (
    BimodalLength,
    ByColumn,
    ByFraction,
    FixedLength,
    GammaArrivals,
    PacedArrivals,
    PoissonArrivals,
    SyntheticStream,
    TraceLength,
    TraceStream,
    build_requests,
)


def cv(times):
    gaps = np.diff(times)
    return gaps.std() / gaps.mean()


def test_poisson_rate_and_cv():
    """Poisson arrivals: the mean rate and an interarrival CV of about 1."""
    times = PoissonArrivals(50.0).times(np.random.default_rng(0), 400.0)
    assert len(times) / 400.0 == pytest.approx(50.0, rel=0.03)
    assert cv(times) == pytest.approx(1.0, abs=0.05)
    assert times.min() >= 0 and times.max() < 400.0


@pytest.mark.parametrize("target", [0.5, 2.9])
def test_gamma_hits_the_target_interarrival_cv(target):
    """Gamma interarrivals with shape 1/CV² realize the requested CV and rate."""
    times = GammaArrivals(20.0, target).times(np.random.default_rng(1), 2000.0)
    assert cv(times) == pytest.approx(target, rel=0.1)
    assert len(times) / 2000.0 == pytest.approx(20.0, rel=0.1)


def test_paced_is_exactly_periodic():
    """Paced arrivals are evenly spaced."""
    assert PacedArrivals(4.0).times(np.random.default_rng(0), 1.0).tolist() == [0, 0.25, 0.5, 0.75]


def test_bimodal_lengths_follow_the_fraction():
    """Two lengths only, the long one at the requested fraction."""
    out = BimodalLength(16, 512, 0.3).sample(np.random.default_rng(0), 20000)
    assert set(out.tolist()) == {16, 512}
    assert (out == 512).mean() == pytest.approx(0.3, abs=0.02)


def test_trace_lengths_are_capped_and_at_least_one():
    """Trace lengths pass through, capped by max_tokens; 0 becomes 1."""
    out = TraceLength(cap=48).sample(np.random.default_rng(0), 3, np.array([0, 30, 400]))
    assert out.tolist() == [1, 30, 48]


def test_build_requests_merges_streams_in_time_order_with_sequential_ids():
    """Requests from all streams are sorted by time and numbered 0..n−1."""
    streams = [
        SyntheticStream("a95", PacedArrivals(2.0), FixedLength(16), 2.0),
        SyntheticStream("a10", PacedArrivals(2.0), FixedLength(8), 2.0, start_s=0.1),
    ]
    requests = build_requests(streams, np.random.default_rng(0))
    assert [r.request_id for r in requests] == list(range(8))
    assert [r.arrival_at for r in requests] == sorted(r.arrival_at for r in requests)
    assert [r.tenant for r in requests[:2]] == ["a95", "a10"]


def test_adding_a_stream_does_not_change_another_streams_draws():
    """Each stream draws from its own spawned generator."""
    a = SyntheticStream("a95", PoissonArrivals(5.0), FixedLength(16), 10.0)
    b = SyntheticStream("a10", PoissonArrivals(5.0), FixedLength(16), 10.0)
    alone = [r.arrival_at for r in build_requests([a], np.random.default_rng(3))]
    both = [
        r.arrival_at for r in build_requests([a, b], np.random.default_rng(3)) if r.tenant == "a95"
    ]
    assert alone == both


def make_trace():
    return TraceData(
        "inline",
        np.array([0.0, 1.0, 2.0, 3.0, 4.0]),
        np.array([10, 20, 30, 40, 50]),
        np.array([5, 6, 7, 8, 9]),
        {"Model": np.array(["GPT-4", "ChatGPT", "GPT-4", "ChatGPT", "other"])},
    )


def test_trace_stream_slices_compresses_and_assigns_by_column():
    """Rows in [offset, offset+duration) replayed at `speedup`, tenant from a column."""
    stream = TraceStream(
        make_trace(),
        ByColumn("Model", {"GPT-4": "a95"}, "a10"),
        offset_s=1.0,
        duration_s=3.0,
        speedup=2.0,
        start_s=5.0,
    )
    batch = stream.generate(np.random.default_rng(0))
    assert batch.at.tolist() == [5.0, 5.5, 6.0]
    assert batch.tenants.tolist() == ["a10", "a95", "a10"]
    assert batch.output_tokens.tolist() == [6, 7, 8]
    assert batch.prompt_tokens.tolist() == [20, 30, 40]


def test_assignment_by_fraction_and_bad_column():
    """By fraction draws tenants at the rate asked; an unknown column is a clear error."""
    trace = TraceData("t", np.arange(10000.0), np.zeros(10000, int), np.ones(10000, int))
    tenants = (
        TraceStream(trace, ByFraction("a95", "a10", 0.25))
        .generate(np.random.default_rng(0))
        .tenants
    )
    assert (tenants == "a95").mean() == pytest.approx(0.25, abs=0.02)
    with pytest.raises(ConfigError, match="column"):
        TraceStream(trace, ByColumn("Model", {}, "a10")).generate(np.random.default_rng(0))


def test_bad_parameters_are_refused():
    """Rates, CVs and fractions are validated on construction."""
    for build in (
        lambda: PoissonArrivals(0),
        lambda: GammaArrivals(1, 0),
        lambda: BimodalLength(10, 5, 0.5),
        lambda: ByFraction("a", "b", 1.5),
    ):
        with pytest.raises(ConfigError):
            build()
