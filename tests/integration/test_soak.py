"""A short soak (CI's version of `floorguard bench soak`): ten times the backend's capacity
of opportunistic traffic for 15 s. The floor holds in every window of the guard's clock (its
decision log, which passes the checker), every request gets an answer, and the guard's
memory and descriptors stay bounded."""

from __future__ import annotations

from floorguard.bench.soak import bench_soak


def test_a_short_soak_holds_the_floor_and_stays_bounded():
    report = bench_soak(minutes=0.25, overload=10.0)
    assert report["verify_ok"], report["verify_violations"]
    assert report["windows"] >= 15
    assert report["windows_floor_held"] == report["windows"], report["per_window"]
    assert report["assured_entitled"] >= 3 * 14  # the floor was used, not trivially held
    assert "0" not in report["statuses"]  # no connection errors: every request answered
    assert report["latency"]["opportunistic"]["offered"] > 10 * 9 * 15 * 0.9
    assert report["rss_growth_mib_after_warmup"] < 20
    assert report["fd_growth_after_warmup"] < 40
