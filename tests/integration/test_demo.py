"""`floorguard demo` and `floorguard load` over real loopback HTTP."""

from __future__ import annotations

import json
import sys

import pytest

from floorguard.bench.proxy import bench_proxy, nginx_binary
from floorguard.cli import main
from floorguard.rig.demo import run_demo
from tests.helpers import write_burstgpt
from tests.integration.live import Live, guard_config, token

CONTRACT = {"offered", "admitted", "rejected", "dropped", "late", "miss", "unmet"}


def test_demo_prints_both_sides_in_the_simulate_contract(tmp_path):
    """A short demo: both sides measured, the PNG written, and the guarded side's assured miss
    no worse than the unguarded side's on the same workload."""
    png = tmp_path / "demo.png"
    result = run_demo(duration_s=4.0, seed=1, png=png)
    for side in ("guard", "unguarded"):
        for cls in ("assured", "opportunistic"):
            assert result[side][cls].keys() >= CONTRACT
        assert result[side]["assured"]["offered"] == result["guard"]["assured"]["offered"] > 0
    assert result["guard"]["assured"]["miss"] <= result["unguarded"]["assured"]["miss"]
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.fixture
def backend():
    live = Live()
    yield live.emulator()
    live.close()


def test_load_fires_a_trace_open_loop(tmp_path, backend, capsys):
    """`load --trace` replays a BurstGPT file against a URL, on time, measured client-side."""
    trace = write_burstgpt(tmp_path / "burst.csv", 20, gap_s=0.05)
    assert main(["load", "--target", backend, "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_requests"] == 20
    assert out["assured"]["offered"] + out["opportunistic"]["offered"] == 20
    assert out["assured"]["admitted"] + out["opportunistic"]["admitted"] == 20
    assert out["max_fire_lag_s"] < 0.5


def test_bench_proxy_reports_the_three_paths_and_nginx_where_installed():
    """`bench proxy` measures direct, pass-through and floorguard in one run (and nginx,
    where it is installed) and prints the documented fields (values are benchmarks, not
    asserted)."""
    result = bench_proxy(requests=20, repeats=1)
    keys = ["added_p50_ms_c1", "added_p99_ms_c1", "rps_floorguard", "rps_passthrough", "rps_direct"]
    nginx = nginx_binary() is not None
    if nginx:
        keys += ["rps_nginx", "nginx_added_p50_ms_c1", "floorguard_over_nginx_rps"]
    else:
        assert "not installed" in result["nginx"]
    for key in keys:
        assert isinstance(result[key], float), key
    assert result["rps_floorguard"] > 0
    assert set(result["p50_ms_c1"]) == {"direct", "passthrough", "floorguard"} | (
        {"nginx"} if nginx else set()
    )
    if sys.platform == "linux":  # each process's CPU per request, read from /proc
        upstream, own = result["upstream_cpu_us_per_request"], result["own_cpu_us_per_request"]
        assert set(upstream) == set(result["p50_ms_c1"])  # the upstream serves every path
        assert set(own) == {"passthrough", "floorguard"}  # the proxies' process, apart
        # in clock ticks (10 ms) over 64 requests here: a path may read 0, never below
        assert all(0 <= us < 1e6 for us in (*upstream.values(), *own.values())), result
    assert result["event_loop"] in ("uvloop", "asyncio")  # the one `serve` runs on


def test_load_names_its_tenants_and_counts_refusals_by_status_and_reason(tmp_path, capsys):
    """`load` said 72 × 401 were 'failed'. Against a guard, a tenant sent
    without a token is refused 401 `missing_identity`, and the summary says so by status
    and reason; one with a token is served; a token for a tenant the workload does not
    send is a usage error."""
    live = Live()
    try:
        contracts = [
            {"tenant": "a95", "class": "assured", "floor": 50, "deadline_ms": 1820},
            {"tenant": "a10", "class": "opportunistic", "deadline_ms": 1820},
        ]
        url, _ = live.guard(guard_config(live.emulator(), contracts=contracts))
        trace = write_burstgpt(tmp_path / "burst.csv", 20, gap_s=0.05)
        args = ["load", "--target", url, "--trace", str(trace), "--json"]
        tenants = _tenants_of(args, capsys)
        assured = next(t for t, cls in tenants if cls == "assured")
        assert main([*args, "--token", f"{assured}={token(assured)}"]) == 0
        out = json.loads(capsys.readouterr().out)
        unserved = out["opportunistic"]["offered"]
        assert out["refusals"] == {"401 missing_identity": unserved}
        assert out["assured"]["admitted"] == out["assured"]["offered"] > 0
        assert main([*args, "--token", f"nobody={token('nobody')}"]) == 2
        assert "this workload sends only" in capsys.readouterr().err
    finally:
        live.close()


def _tenants_of(args, capsys):
    assert main([*args, "--list-tenants"]) == 0
    return [tuple(line.split("\t")) for line in capsys.readouterr().out.splitlines()]
