"""`floorguard bench tenants`: what a decision and a configuration cost as the tenants and
the backends grow, each cell beside the smallest one measured in the same run.

Per cell: the core configuration built and validated (`GuardConfig`, what `serve` and a
reload build per pool), and µs per decision — admission, dispatch and completion of each
request through the shipped `Guard` (always-admit learner, every request finishing at
once), the requests spread over every tenant. `--serve` measures `serve` itself instead:
its start and reload and its memory as the tenants grow (`bench_serve_tenants`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from floorguard._compiled import running
from floorguard.bench.sim import _best, _decision_loop
from floorguard.core.contract import Contract, ContractClass, GuardConfig
from floorguard.core.guard import Guard
from floorguard.core.request import Request
from floorguard.learners.adversaries import AlwaysAdmit
from floorguard.rig.net import free_ports, wait_listening

__all__ = ["bench_serve_tenants", "bench_tenants"]

TENANTS = (10, 1_000, 100_000)
BACKENDS = (1, 16, 256)


def _config(tenants: int, backends: int) -> GuardConfig:
    """Half the tenants assured (a floor of 2, 20 s deadline), half opportunistic; `backends`
    backends of 8 slots."""
    contracts = tuple(
        Contract(f"t{t}", ContractClass.ASSURED, 20.0, 2)
        if t % 2 == 0
        else Contract(f"t{t}", ContractClass.OPPORTUNISTIC, 20.0)
        for t in range(tenants)
    )
    return GuardConfig(contracts, slots=(8,) * backends)


def _requests(tenants: int, n: int) -> list[Request]:
    """`n` requests 1 ms apart, round-robin over the tenants (a prime stride, so assured and
    opportunistic alternate whatever the count)."""
    return [
        Request(i, f"t{(i * 7919) % tenants}", i * 1e-3, num_output_tokens=64) for i in range(n)
    ]


def bench_tenants(
    *,
    tenants: tuple[int, ...] = TENANTS,
    backends: tuple[int, ...] = BACKENDS,
    requests: int = 20_000,
    repeats: int = 3,
) -> dict[str, Any]:
    rows = []
    for t in tenants:
        reqs = _requests(t, requests)
        for b in backends:
            config = _config(t, b)

            def build(t: int = t, b: int = b) -> float:
                return _timed(lambda: _config(t, b))

            def decide(config: GuardConfig = config, reqs: list[Request] = reqs) -> float:
                return _decision_loop(lambda: Guard(config, learner=AlwaysAdmit()), reqs)

            config_s = _best(build, repeats)
            decision_s = _best(decide, repeats)
            rows.append(
                {
                    "tenants": t,
                    "backends": b,
                    "config_s": config_s,
                    "decision_us": decision_s / requests * 1e6,
                }
            )
    base = rows[0]["decision_us"]
    for row in rows:
        row["decision_over_smallest"] = row["decision_us"] / base
    return {
        "core": running(),
        "requests": requests,
        "repeats": repeats,
        "rows": rows,
    }


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


SERVE_TENANTS = (10, 1_000, 100_000)
SERVE_BACKENDS = (1, 16, 256)


def _backend_urls(port: int, backends: int) -> list[str]:
    """`backends` distinct backend URLs that all reach the one emulator on `port`: loopback
    addresses (Linux answers all of 127.0.0.0/8 on `lo`), one a backend."""
    return [f"http://127.0.{i // 250}.{i % 250 + 1}:{port}" for i in range(backends)]


def _serve_config(tenants: int, backends: list[str], log: Path) -> dict[str, Any]:
    """`serve`'s configuration with `tenants` contracts (half assured with a floor of 1,
    half opportunistic), the backends `backends`, tenants named by a trusted header."""
    contracts: list[dict[str, Any]] = [
        {"tenant": f"t{t}", "class": "assured", "floor": 1, "deadline_ms": 5000}
        if t % 2 == 0
        else {"tenant": f"t{t}", "class": "opportunistic", "deadline_ms": 5000}
        for t in range(tenants)
    ]
    return {
        "host": "127.0.0.1",
        "port": 0,
        "window_s": 10.0,
        "contracts": contracts,
        "backends": [{"url": url, "slots": 4} for url in backends],
        "identity": {"mode": "header", "header": "x-tenant",
                     "trusted_upstreams": ["127.0.0.1/32"]},
        "decision_log": str(log),
    }  # fmt: skip


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _wait_for(stream: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in stream.read_text(errors="replace"):
        if process.poll() is not None:
            said = "".join(p.read_text(errors="replace") for p in (stream, _other(stream)))
            raise RuntimeError(f"serve exited {process.returncode}: {said[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"serve did not say {text!r} within {timeout_s:.0f} s")
        time.sleep(0.02)


def _other(stream: Path) -> Path:
    """A cell's other output file (stderr for stdout, and back)."""
    return stream.with_suffix(".err" if stream.suffix == ".out" else ".out")


def _serve_cell(tenants: int, backends: list[str], folder: Path, form: str) -> dict[str, Any]:
    """One `serve` with `tenants` contracts and `backends`, its file written as YAML or as
    JSON (YAML's subset, read without YAML's node graph): seconds from exec to listening,
    resident memory then, seconds for a SIGHUP reload of the same file to be applied."""
    name = f"{tenants}-{len(backends)}-{form}"
    config = folder / f"guard-{name}.yaml"
    data = _serve_config(tenants, backends, folder / f"d{name}.jsonl")
    dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    config.write_text(json.dumps(data) if form == "json" else yaml.dump(data, Dumper=dumper))
    out, err = folder / f"serve-{name}.out", folder / f"serve-{name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "floorguard", "serve", "--config", str(config)],
            stdout=stdout, stderr=stderr,
        )  # fmt: skip
    try:
        _wait_for(out, "guarding", process, 600)
        start_s = time.monotonic() - started
        rss = _rss_mib(process.pid)
        reloaded = time.monotonic()
        process.send_signal(signal.SIGHUP)
        _wait_for(err, "reloaded", process, 600)
        reload_s = time.monotonic() - reloaded
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
    return {
        "tenants": tenants,
        "backends": len(backends),
        "format": form,
        "start_s": start_s,
        "reload_s": reload_s,
        "rss_mib": rss,
    }


def bench_serve_tenants(
    *,
    tenants: tuple[int, ...] = SERVE_TENANTS,
    backends: tuple[int, ...] = SERVE_BACKENDS,
    forms: tuple[str, ...] = ("yaml", "json"),
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """`serve` itself as the tenants and backends grow, its configuration written as YAML
    and as JSON: its start (exec to listening), a SIGHUP reload of the same file, and its
    resident memory, each beside the smallest cell of its format (its fewest tenants and
    backends), with the memory per tenant over the cell of its format and backends with
    the fewest tenants; every backend the one emulator, at its own loopback address."""
    port = free_ports()[0]
    # on every address, so that each backend has its own (127.0.x.y); a benchmark's
    # emulator, for as long as the bench runs
    emulator = subprocess.Popen(
        [sys.executable, "-m", "floorguard", "emulate", "--slots", "4", "--port", str(port),
         "--host", "0.0.0.0" if max(backends) > 1 else "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    rows = []
    try:
        wait_listening(port, emulator)
        with tempfile.TemporaryDirectory(prefix="floorguard-tenants-") as folder:
            for form in forms:
                for b in backends:
                    for t in tenants:
                        row = _serve_cell(t, _backend_urls(port, b), Path(folder), form)
                        rows.append(row)
                        if progress is not None:
                            progress(
                                f"{t:,} tenants, {b} backends ({form}): listening after "
                                f"{row['start_s']:.1f} s, reloaded in {row['reload_s']:.1f} s, "
                                f"{row['rss_mib']:.0f} MiB"
                            )
    finally:
        emulator.terminate()
        emulator.wait(30)
    for row in rows:
        base = next(r for r in rows if r["format"] == row["format"])
        row["start_over_smallest"] = row["start_s"] / base["start_s"]
        fewest = next(
            r for r in rows if r["format"] == row["format"] and r["backends"] == row["backends"]
        )
        extra = row["tenants"] - fewest["tenants"]
        row["kib_per_tenant"] = (
            (row["rss_mib"] - fewest["rss_mib"]) * 1024 / extra if extra > 0 else None
        )
    return {"core": running(), "rows": rows}
