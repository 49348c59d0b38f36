"""`floorguard bench handoff`: what the guard adds to a request's way into a freed slot on a
real backend (the dispatch gap), beside the same hand-off inside the
backend's own queue, measured side by side in one run.

A closed loop of `C + 1` clients on a backend of `C` slots keeps exactly one request
waiting: each client sends its next request the moment its last one ends, when the other
`C` are running. A waiting request's *hand-off* is from the first completion after it was
sent (the slot it takes frees) to its own first token:

* **through the guard** (a `floorguard serve` in front, the queue the guard's): the
  completion reaches the guard, the guard dispatches the next request, vLLM parses and
  schedules it and runs its prefill;
* **direct** (the queue vLLM's own): vLLM schedules a request it already holds and runs its
  prefill.

Both include the prefill and a first decode step, so their difference is what the guard's
hop costs; vLLM's own `request_queue_time` over each path is beside it. Each rep runs both
paths back to back, the order alternating.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from floorguard.bench.backlog import Stream, stream_completion
from floorguard.errors import FloorguardError
from floorguard.experiments.real import backend_counters, backend_times, wait_ready
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.rig.net import free_ports

__all__ = ["bench_handoff", "handoffs_s", "render_handoff"]

_TENANT = "bench"
_TENANT_HEADER = "X-Floorguard-Tenant"


def handoffs_s(streams: list[Stream], slots: int) -> list[float]:
    """Each request's hand-off: from the first other request's last token at or after it
    was sent to its own first token. Requests sent while a slot was free (the loop's first
    `slots`, which start at once) have none."""
    done = sorted(s.token_at[-1] for s in streams if s.token_at)
    out = []
    for s in sorted(streams, key=lambda s: s.sent_at)[slots:]:
        if not s.token_at:
            continue
        freed = next((t for t in done if t >= s.sent_at), None)
        if freed is not None and freed <= s.token_at[0]:
            out.append(s.token_at[0] - freed)
    return out


async def _closed_loop(
    url: str, model: str, *, slots: int, requests: int, tokens: int, headers: dict[str, str]
) -> list[Stream]:
    connector = aiohttp.TCPConnector(limit=slots + 4)
    timeout = aiohttp.ClientTimeout(total=300)
    left = requests
    streams: list[Stream] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                streams.append(
                    await stream_completion(session, url, model, tokens=tokens, headers=headers)
                )

        await asyncio.gather(*(client() for _ in range(slots + 1)))
    return streams


def _guard(backend: str, slots: int, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A `floorguard serve` in front of `backend`: one opportunistic tenant named by a
    trusted header, always-admit, no doom gate, `slots` slots."""
    port = free_ports()[0]
    config = GuardServerConfig.model_validate(
        {
            "port": port,
            "contracts": [{"tenant": _TENANT, "class": "opportunistic", "deadline_ms": 600_000}],
            "backends": [{"url": backend, "slots": slots}],
            "identity": {
                "mode": "header",
                "header": _TENANT_HEADER,
                "trusted_upstreams": ["127.0.0.0/8"],
            },
            "learner": "always-admit",
            "doom_gate": False,
            "upstream": {"first_byte_timeout_s": 300, "idle_timeout_s": 300},
        }
    )
    path = folder / "guard.yaml"
    path.write_text(
        yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_unset=True))
    )
    log = (folder / "guard.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, "-m", "floorguard", "serve", "--config", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, child)
    except FloorguardError:
        child.terminate()
        child.wait(30)
        raise FloorguardError(
            f"floorguard serve in front of {backend} did not start (its log: {folder}/guard.log)"
        ) from None
    return child, url


def _path(
    name: str, url: str, backend: str, model: str, *, slots: int, requests: int, tokens: int
) -> dict[str, float]:
    headers = {_TENANT_HEADER: _TENANT} if name == "guard" else {}
    before = backend_counters(backend)
    streams = asyncio.run(
        _closed_loop(url, model, slots=slots, requests=requests, tokens=tokens, headers=headers)
    )
    vllm = backend_times(before, backend_counters(backend))
    gaps = np.asarray(handoffs_s(streams, slots)) * 1e3
    if len(gaps) == 0:
        raise FloorguardError(f"{name}: no request waited for a slot (is {backend} {slots} wide?)")
    queue = vllm["backend_queue_mean_s"]
    return {
        "handoffs": float(len(gaps)),
        "median_ms": float(np.median(gaps)),
        "p90_ms": float(np.quantile(gaps, 0.9)),
        "vllm_queue_ms": float(queue) * 1e3 if queue is not None else float("nan"),
    }


def bench_handoff(
    backend: str,
    model: str,
    *,
    slots: int = 4,
    requests: int = 60,
    tokens: int = 16,
    repeats: int = 2,
    progress: Any = None,
) -> dict[str, Any]:
    """Both paths, `repeats` reps each, back to back with the order alternating; a guard
    process is started in front of `backend` for the run and stopped after."""
    if slots < 1 or requests <= slots + 1 or repeats < 1 or tokens < 1:
        raise FloorguardError("--slots ≥ 1, --requests > slots + 1, --repeats ≥ 1, --tokens ≥ 1")
    backend = backend.rstrip("/")
    runs: dict[str, list[dict[str, float]]] = {"direct": [], "guard": []}
    with tempfile.TemporaryDirectory(prefix="floorguard-handoff-") as folder:
        child, guard_url = _guard(backend, slots, Path(folder))
        try:
            for rep in range(repeats):
                for name in ("direct", "guard") if rep % 2 == 0 else ("guard", "direct"):
                    url = guard_url if name == "guard" else backend
                    row = _path(
                        name, url, backend, model, slots=slots, requests=requests, tokens=tokens
                    )
                    runs[name].append(row)
                    if progress is not None:
                        progress(rep, name, row)
        finally:
            child.terminate()
            child.wait(30)

    def mean(name: str, key: str) -> float:
        return float(np.nanmean([r[key] for r in runs[name]]))

    paths = {name: {key: mean(name, key) for key in runs[name][0]} for name in ("direct", "guard")}
    added = [
        g["median_ms"] - d["median_ms"] for d, g in zip(runs["direct"], runs["guard"], strict=True)
    ]
    return {
        "backend": backend,
        "model": model,
        "slots": slots,
        "tokens": tokens,
        "requests": requests,
        "repeats": repeats,
        "paths": paths,
        "guard_adds_median_ms": float(np.mean(added)),
        "guard_adds_per_rep_ms": added,
    }


def render_handoff(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"the hand-off into a freed slot on {result['backend']} ({result['model']}, "
        f"{result['slots']} slots, ℓ = {result['tokens']}): through the guard vs vLLM's own queue"
    )
    for head in ("path", "hand-offs", "median ms", "p90 ms", "vLLM queue mean ms"):
        table.add_column(head, justify="right")
    for name, p in result["paths"].items():
        table.add_row(
            name,
            f"{p['handoffs']:.0f}",
            f"{p['median_ms']:.1f}",
            f"{p['p90_ms']:.1f}",
            f"{p['vllm_queue_ms']:.1f}",
        )
    console.print(table)
    reps = ", ".join(f"{x:+.1f}" for x in result["guard_adds_per_rep_ms"])
    console.print(
        f"the guard adds {result['guard_adds_median_ms']:+.1f} ms to the median hand-off "
        f"(per rep, paired: {reps})"
    )
