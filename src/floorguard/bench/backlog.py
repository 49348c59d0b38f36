"""`floorguard bench backlog`: what a backlog held *inside* a vLLM server costs the requests
it is running (docs/design.md §11 "Physics").

Server priority (admit-all into vLLM with `--scheduling-policy priority`) leaves every
request the guard would have shed waiting in vLLM's own queue: the API server has parsed and
tokenized it, the engine holds it in its waiting queue and looks at it every step. This
measures, on a real server, whether that costs the running requests anything, side by side
in one run, each backlog size beside the empty-queue reference:

1. `C` *blockers* (ℓ = `blocker_tokens`, priority 0) fill the slots;
2. `N` *fillers* (ℓ = 16, priority 10) arrive and wait in vLLM's queue. The blockers'
   inter-token time while they arrive is the *arrival* cost (the API server parsing and
   tokenizing them beside the engine);
3. once vLLM reports `N` waiting, `C` *probes* (ℓ = `probe_tokens`, priority 0) are sent;
   vLLM's priority puts them ahead of the fillers, so they run as soon as the blockers are
   done, with `N` still waiting behind them. Their inter-token time and service (first token
   to last) are the *held* cost;
4. the fillers are cancelled (vLLM aborts a request whose client has gone) and the server
   is let drain before the next rep.

`N = 0` runs the same steps with no fillers. The reps of each size alternate with the
reference's, so drift in the machine's speed shows in both.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from floorguard.errors import FloorguardError

__all__ = ["Stream", "bench_backlog", "gauges", "render_backlog", "stream_completion"]

_FILLER_TOKENS = 16
_FILLER_PRIORITY = 10


@dataclass
class Stream:
    sent_at: float
    token_at: list[float] = field(default_factory=list)

    @property
    def gaps_s(self) -> list[float]:
        return list(np.diff(self.token_at)) if len(self.token_at) > 1 else []

    def gaps_between(self, start: float, end: float) -> list[float]:
        """Inter-token gaps whose later token came in [start, end)."""
        return [
            b - a
            for a, b in zip(self.token_at, self.token_at[1:], strict=False)
            if start <= b < end
        ]


async def stream_completion(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    *,
    tokens: int,
    priority: int | None = None,
    first: asyncio.Event | None = None,
    headers: dict[str, str] | None = None,
) -> Stream:
    """One streamed completion of exactly `tokens` tokens, each chunk's arrival noted;
    `priority` is vLLM's field (None: not sent, as through the guard, which owns it)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": "the guard holds the floor",
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    if priority is not None:
        body["priority"] = priority
    stream = Stream(time.perf_counter())
    async with session.post(url + "/v1/completions", json=body, headers=headers) as response:
        if response.status != 200:
            raise FloorguardError(
                f"{url} answered {response.status}: {(await response.text())[:300]} "
                "(is it vLLM with --scheduling-policy priority?)"
            )
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                stream.token_at.append(time.perf_counter())
                if first is not None and len(stream.token_at) == 1:
                    first.set()
    return stream


async def gauges(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
            out[family.name.split(":")[1]] = sum(s.value for s in family.samples)
    return out


async def _until(
    session: aiohttp.ClientSession, url: str, check: Any, timeout_s: float, what: str
) -> None:
    deadline = time.perf_counter() + timeout_s
    while True:
        seen = await gauges(session, url)
        if check(seen):
            return
        if time.perf_counter() > deadline:
            raise FloorguardError(f"{url}: {what} not reached within {timeout_s:.0f} s ({seen})")
        await asyncio.sleep(0.05)


async def _rep(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    *,
    slots: int,
    waiting: int,
    blocker_tokens: int,
    probe_tokens: int,
) -> dict[str, float]:
    started = [asyncio.Event() for _ in range(slots)]
    blockers = [
        asyncio.create_task(
            stream_completion(
                session, url, model, tokens=blocker_tokens, priority=0, first=started[i]
            )
        )
        for i in range(slots)
    ]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
    arrival_from = time.perf_counter()
    fillers = [
        asyncio.create_task(
            stream_completion(session, url, model, tokens=_FILLER_TOKENS, priority=_FILLER_PRIORITY)
        )
        for _ in range(waiting)
    ]
    try:
        if waiting:
            await _until(
                session, url, lambda g: g.get("num_requests_waiting", 0) >= waiting, 120,
                f"{waiting} waiting",
            )  # fmt: skip
        arrival_to = time.perf_counter()
        probes = [
            asyncio.create_task(
                stream_completion(session, url, model, tokens=probe_tokens, priority=0)
            )
            for _ in range(slots)
        ]
        done_blockers = await asyncio.wait_for(asyncio.gather(*blockers), 120)
        done_probes = await asyncio.wait_for(asyncio.gather(*probes), 120)
        held = await gauges(session, url)
    finally:
        for task in fillers:
            task.cancel()
        await asyncio.gather(*fillers, return_exceptions=True)
    await _until(
        session, url,
        lambda g: g.get("num_requests_waiting", 0) == 0 and g.get("num_requests_running", 0) == 0,
        120, "an idle server",
    )  # fmt: skip
    arrival_gaps = (
        [g for s in done_blockers for g in s.gaps_between(arrival_from, arrival_to)]
        if waiting
        else [g for s in done_blockers for g in s.gaps_s]
    )
    probe_gaps = [g for s in done_probes for g in s.gaps_s]
    return {
        "arrival_s": arrival_to - arrival_from,
        "arrival_step_ms": float(np.median(arrival_gaps)) * 1e3 if arrival_gaps else float("nan"),
        "held_step_ms": float(np.median(probe_gaps)) * 1e3,
        "held_service_ms": float(np.mean([s.token_at[-1] - s.token_at[0] for s in done_probes]))
        * 1e3,
        "waiting_seen": held.get("num_requests_waiting", 0.0),
    }


async def _bench(
    url: str,
    model: str,
    *,
    slots: int,
    sizes: Sequence[int],
    repeats: int,
    blocker_tokens: int,
    probe_tokens: int,
    progress: Any,
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=max(sizes) + 4 * slots + 8)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    rows: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await _until(session, url, lambda g: "num_requests_waiting" in g, 30, "vLLM's /metrics")
        for rep in range(repeats):
            order = list(sizes) if rep % 2 == 0 else list(reversed(sizes))
            for n in order:
                row = await _rep(
                    session, url, model, slots=slots, waiting=n,
                    blocker_tokens=blocker_tokens, probe_tokens=probe_tokens,
                )  # fmt: skip
                rows[n].append(row)
                if progress is not None:
                    progress(rep, n, row)
    base = rows[min(sizes)]
    out = []
    for n in sizes:
        mine = rows[n]

        def mean(key: str, of: list[dict[str, float]]) -> float:
            return float(np.nanmean([r[key] for r in of]))

        out.append(
            {
                "waiting": n,
                "reps": len(mine),
                "waiting_seen": mean("waiting_seen", mine),
                "arrival_s": mean("arrival_s", mine),
                "arrival_step_ms": mean("arrival_step_ms", mine),
                "held_step_ms": mean("held_step_ms", mine),
                "held_service_ms": mean("held_service_ms", mine),
                "arrival_step_ratio": mean("arrival_step_ms", mine) / mean("arrival_step_ms", base),
                "held_step_ratio": mean("held_step_ms", mine) / mean("held_step_ms", base),
                "held_service_ratio": mean("held_service_ms", mine) / mean("held_service_ms", base),
            }
        )
    return {
        "backend": url,
        "model": model,
        "slots": slots,
        "blocker_tokens": blocker_tokens,
        "probe_tokens": probe_tokens,
        "rows": out,
    }


def bench_backlog(
    url: str,
    model: str,
    *,
    slots: int = 4,
    sizes: Sequence[int] = (0, 100, 300),
    repeats: int = 3,
    blocker_tokens: int = 48,
    probe_tokens: int = 32,
    progress: Any = None,
) -> dict[str, Any]:
    """Each backlog size in `sizes` (0 is the reference, and is added if missing) beside
    the empty queue, `repeats` reps each, alternating order (module docstring)."""
    if slots < 1 or repeats < 1 or any(n < 0 for n in sizes):
        raise FloorguardError("--slots and --repeats must be ≥ 1, --waiting sizes ≥ 0")
    sizes = sorted({0, *sizes})
    return asyncio.run(
        _bench(
            url.rstrip("/"), model, slots=slots, sizes=sizes, repeats=repeats,
            blocker_tokens=blocker_tokens, probe_tokens=probe_tokens, progress=progress,
        )
    )  # fmt: skip


def render_backlog(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"a backlog held inside {result['backend']} ({result['model']}, "
        f"{result['slots']} slots): running requests beside an empty queue"
    )
    heads = (
        ("waiting", "waiting"),
        ("waiting_seen", "vLLM saw"),
        ("arrival_s", "arrival s"),
        ("arrival_step_ms", "step while arriving ms"),
        ("arrival_step_ratio", "×"),
        ("held_step_ms", "step while held ms"),
        ("held_step_ratio", "×"),
        ("held_service_ms", f"service ℓ={result['probe_tokens']} ms"),
        ("held_service_ratio", "×"),
    )
    for _, head in heads:
        table.add_column(head, justify="right")
    for row in result["rows"]:
        table.add_row(
            *(
                f"{row[key]:.0f}" if key in ("waiting", "waiting_seen") else f"{row[key]:.3g}"
                for key, _ in heads
            )
        )
    console.print(table)
