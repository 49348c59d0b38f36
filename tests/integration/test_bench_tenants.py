"""`floorguard bench tenants --serve` runs `serve` itself as the tenants grow: each cell is a
real `serve` process that starts listening, applies a SIGHUP reload of its file and stops,
against an emulated backend; the figures are its own (the benchmark's ratios are recorded
in docs/benchmarks.md, not asserted here)."""

from __future__ import annotations

from pathlib import Path

from floorguard.bench.tenants import bench_serve_tenants


def test_bench_serve_tenants_starts_reloads_and_measures_each_cell():
    lines: list[str] = []
    result = bench_serve_tenants(tenants=(2, 200), backends=(1, 3), progress=lines.append)
    rows = result["rows"]
    assert [(row["tenants"], row["backends"], row["format"]) for row in rows] == [
        (2, 1, "yaml"), (200, 1, "yaml"), (2, 3, "yaml"), (200, 3, "yaml"),
        (2, 1, "json"), (200, 1, "json"), (2, 3, "json"), (200, 3, "json"),
    ]  # fmt: skip
    for row in rows:
        assert row["start_s"] > 0 and row["reload_s"] > 0 and row["rss_mib"] > 10
    for smallest, larger in (rows[0:2], rows[2:4], rows[4:6], rows[6:8]):
        assert smallest["kib_per_tenant"] is None and larger["kib_per_tenant"] is not None
    assert rows[0]["start_over_smallest"] == rows[4]["start_over_smallest"] == 1.0
    assert len(lines) == 8 and "200 tenants, 3 backends (json): listening after" in lines[7]
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline")
                if b"guard-200-" in _read(p)]  # fmt: skip  # every serve stopped


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a process that ended meanwhile
        return b""
