"""Open-loop workloads: each request fires at its timestamp whatever the backend does.

A workload is a tuple of streams; each stream yields (time, tenant, ℓ, prompt tokens) from
its own child generator (`Generator.spawn`), so adding a stream never changes another's
draws. Arrival processes: Poisson, paced, gamma with a target interarrival CV, and trace
replay (Azure or BurstGPT). Output lengths: fixed, bimodal, or from the trace (optionally
capped). Tenants: one per stream, or assigned by fraction or by a trace column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from floorguard.core.request import Request
from floorguard.errors import require
from floorguard.sim.traces import TraceData

__all__ = [
    "BimodalLength",
    "ByColumn",
    "ByFraction",
    "FixedLength",
    "GammaArrivals",
    "PacedArrivals",
    "PoissonArrivals",
    "StreamBatch",
    "SyntheticStream",
    "TraceLength",
    "TraceStream",
    "build_requests",
]


class StreamBatch(NamedTuple):
    at: np.ndarray
    tenants: np.ndarray
    output_tokens: np.ndarray
    prompt_tokens: np.ndarray


class Stream(Protocol):
    def generate(self, rng: np.random.Generator) -> StreamBatch: ...


# -- arrival processes --------------------------------------------------------------------


def _renewal(
    rng: np.random.Generator, draw: object, mean_gap_s: float, duration_s: float
) -> np.ndarray:
    """Cumulative gaps from `draw(rng, n)` until past `duration_s`."""
    chunks: list[np.ndarray] = []
    t = 0.0
    n = max(16, int(duration_s / mean_gap_s * 1.2) + 16)
    while t < duration_s:
        gaps = draw(rng, n)  # type: ignore[operator]
        times = t + np.cumsum(gaps)
        chunks.append(times)
        t = float(times[-1])
    times = np.concatenate(chunks) if chunks else np.empty(0)
    return times[times < duration_s]


@dataclass(frozen=True, slots=True)
class PoissonArrivals:
    rate_per_s: float

    def __post_init__(self) -> None:
        require(self.rate_per_s > 0, "rate_per_s", self.rate_per_s, "must be > 0")

    def times(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        mean = 1.0 / self.rate_per_s
        return _renewal(rng, lambda g, n: g.exponential(mean, n), mean, duration_s)


@dataclass(frozen=True, slots=True)
class PacedArrivals:
    """One arrival every `1/rate` s, each late by a uniform draw in `[0, jitter_s)`: with a
    jitter under the gap, every window of `k/rate` s offers exactly `k` arrivals."""

    rate_per_s: float
    jitter_s: float = 0.0

    def __post_init__(self) -> None:
        require(self.rate_per_s > 0, "rate_per_s", self.rate_per_s, "must be > 0")
        require(
            0 <= self.jitter_s < 1.0 / self.rate_per_s,
            "jitter_s",
            self.jitter_s,
            "must be ≥ 0 and under the gap 1/rate",
        )

    def times(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        at = np.arange(0.0, duration_s, 1.0 / self.rate_per_s)
        if self.jitter_s > 0:
            at = at + rng.uniform(0.0, self.jitter_s, len(at))
        return at


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    """Gamma interarrivals with mean `1/rate` and coefficient of variation `cv`
    (shape `1/cv²`): cv = 1 is Poisson, cv ≈ 2.9 is BurstGPT-like."""

    rate_per_s: float
    cv: float

    def __post_init__(self) -> None:
        require(self.rate_per_s > 0, "rate_per_s", self.rate_per_s, "must be > 0")
        require(self.cv > 0, "cv", self.cv, "must be > 0")

    def times(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        shape = 1.0 / self.cv**2
        mean = 1.0 / self.rate_per_s
        return _renewal(rng, lambda g, n: g.gamma(shape, mean / shape, n), mean, duration_s)


Arrivals = PoissonArrivals | PacedArrivals | GammaArrivals


# -- output lengths -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FixedLength:
    tokens: int

    def __post_init__(self) -> None:
        require(self.tokens >= 1, "tokens", self.tokens, "must be ≥ 1")

    def sample(
        self, rng: np.random.Generator, n: int, trace: np.ndarray | None = None
    ) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class BimodalLength:
    short_tokens: int
    long_tokens: int
    long_fraction: float

    def __post_init__(self) -> None:
        require(
            1 <= self.short_tokens <= self.long_tokens,
            "short_tokens",
            self.short_tokens,
            "needs 1 ≤ short_tokens ≤ long_tokens",
        )
        require(
            0 <= self.long_fraction <= 1, "long_fraction", self.long_fraction, "must be in [0, 1]"
        )

    def sample(
        self, rng: np.random.Generator, n: int, trace: np.ndarray | None = None
    ) -> np.ndarray:
        is_long = rng.random(n) < self.long_fraction
        return np.where(is_long, self.long_tokens, self.short_tokens).astype(np.int64)


@dataclass(frozen=True, slots=True)
class TraceLength:
    """The trace's own output lengths, optionally capped (`max_tokens`), at least 1."""

    cap: int | None = None

    def sample(
        self, rng: np.random.Generator, n: int, trace: np.ndarray | None = None
    ) -> np.ndarray:
        require(trace is not None, "lengths", "trace", "trace lengths need a trace stream")
        assert trace is not None
        out: np.ndarray = np.maximum(trace, 1)
        return np.minimum(out, self.cap) if self.cap is not None else out


Lengths = FixedLength | BimodalLength | TraceLength


# -- streams ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyntheticStream:
    tenant: str
    arrivals: Arrivals
    lengths: Lengths
    duration_s: float
    start_s: float = 0.0
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        require(self.duration_s > 0, "duration_s", self.duration_s, "must be > 0")

    def generate(self, rng: np.random.Generator) -> StreamBatch:
        at = self.start_s + self.arrivals.times(rng, self.duration_s)
        n = len(at)
        return StreamBatch(
            at,
            np.full(n, self.tenant, dtype=object),
            self.lengths.sample(rng, n),
            np.full(n, self.prompt_tokens, dtype=np.int64),
        )


@dataclass(frozen=True, slots=True)
class ByFraction:
    """Each request is `assured_tenant` with probability `fraction`, else `other_tenant`."""

    assured_tenant: str
    other_tenant: str
    fraction: float

    def __post_init__(self) -> None:
        require(0 <= self.fraction <= 1, "fraction", self.fraction, "must be in [0, 1]")

    def assign(self, rng: np.random.Generator, trace: TraceData, rows: np.ndarray) -> np.ndarray:
        pick = rng.random(len(rows)) < self.fraction
        return np.where(pick, self.assured_tenant, self.other_tenant).astype(object)


@dataclass(frozen=True, slots=True)
class ByColumn:
    """Tenant from a trace column's value (e.g. BurstGPT `Model`), `default` otherwise."""

    column: str
    mapping: Mapping[str, str]
    default: str

    def assign(self, rng: np.random.Generator, trace: TraceData, rows: np.ndarray) -> np.ndarray:
        require(
            self.column in trace.columns,
            "column",
            self.column,
            f"must be one of the trace's columns {sorted(trace.columns)}",
        )
        values = trace.columns[self.column][rows]
        return np.asarray([self.mapping.get(str(v), self.default) for v in values], dtype=object)


@dataclass(frozen=True)
class TraceStream:
    """Replays `trace` rows with arrival offsets in `[offset_s, offset_s + duration_s)`,
    compressed by `speedup`, starting at simulated time `start_s`."""

    trace: TraceData
    tenants: ByFraction | ByColumn
    lengths: Lengths = field(default_factory=TraceLength)
    offset_s: float = 0.0
    duration_s: float | None = None
    speedup: float = 1.0
    start_s: float = 0.0

    def __post_init__(self) -> None:
        require(self.speedup > 0, "speedup", self.speedup, "must be > 0")
        require(self.offset_s >= 0, "offset_s", self.offset_s, "must be ≥ 0")

    def generate(self, rng: np.random.Generator) -> StreamBatch:
        t = self.trace.arrival_s
        end = math.inf if self.duration_s is None else self.offset_s + self.duration_s
        rows = np.flatnonzero((t >= self.offset_s) & (t < end))
        at = self.start_s + (t[rows] - self.offset_s) / self.speedup
        return StreamBatch(
            at,
            self.tenants.assign(rng, self.trace, rows),
            self.lengths.sample(rng, len(rows), self.trace.output_tokens[rows]),
            self.trace.prompt_tokens[rows],
        )


def build_requests(streams: Sequence[Stream], rng: np.random.Generator) -> list[Request]:
    """All streams' requests in arrival order (ties by stream order), ids 0, 1, 2, …"""
    batches = [s.generate(child) for s, child in zip(streams, rng.spawn(len(streams)), strict=True)]
    if not batches:
        return []
    at = np.concatenate([b.at for b in batches])
    order = np.argsort(at, kind="stable")
    tenants = np.concatenate([b.tenants for b in batches])[order]
    out = np.concatenate([b.output_tokens for b in batches])[order]
    prompt = np.concatenate([b.prompt_tokens for b in batches])[order]
    return [
        Request(i, str(tenant), float(t), int(o), int(p))
        for i, (t, tenant, o, p) in enumerate(
            zip(at[order].tolist(), tenants.tolist(), out.tolist(), prompt.tolist(), strict=True)
        )
    ]
