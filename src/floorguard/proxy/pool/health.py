"""Backend health for the HTTP guard: which backends may get new requests.

A backend is up once it answers its health probe, and goes down after `failures_to_down`
failed probes in a row (not one slow answer under load), or at once when a request could
not reach it (then it stays down until a probe answers again). A down backend's slots are
not offered by the stack (`set_backend_available`); what runs there ends normally.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from floorguard.clock import Clock
from floorguard.core.surface import Stack
from floorguard.proxy.config.guard import BackendSpec
from floorguard.proxy.pool.upstream import UnreachableError, Upstream, UpstreamBroke

__all__ = ["BackendHealth", "BackendReport", "backend_report", "parse_backend_report"]

SLOTS_GAUGE = "floorguard_backend_slots"
CACHE_INFO = "vllm:cache_config_info"
"""vLLM's info gauge of its CacheConfig: labels `num_gpu_blocks` and `block_size` (the CPU
backend reports its KV cache under the same names)."""


@dataclass(frozen=True, slots=True)
class BackendReport:
    """What a backend reports of itself on its /metrics (None: not reported)."""

    slots: int | None = None
    """`floorguard_backend_slots` (the emulator; vLLM does not report `--max-num-seqs`)."""
    kv_blocks: int | None = None
    block_tokens: int | None = None

    @property
    def kv_tokens(self) -> int | None:
        """What its cache can hold: vLLM (V1) keeps one of `num_gpu_blocks` as its null
        block, so `(blocks − 1) × block_size`."""
        if self.kv_blocks is None or self.block_tokens is None:
            return None
        return (self.kv_blocks - 1) * self.block_tokens


def parse_backend_report(text: str) -> BackendReport:
    """The figures in a /metrics page (a malformed page reports nothing)."""
    slots = blocks = block = None
    try:
        for family in text_string_to_metric_families(text):
            if family.name == SLOTS_GAUGE and family.samples:
                slots = int(family.samples[0].value)
            if family.name in (CACHE_INFO, CACHE_INFO.removesuffix("_info")):
                for sample in family.samples:
                    labels = sample.labels
                    if (
                        labels.get("num_gpu_blocks", "").isdigit()
                        and labels.get("block_size", "").isdigit()
                    ):
                        blocks, block = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except ValueError:
        return BackendReport()
    return BackendReport(slots, blocks, block)


async def backend_report(upstream: Upstream, url: str, timeout_s: float = 2.0) -> BackendReport:
    """What the backend at `url` reports of itself; nothing where /metrics cannot be read."""
    try:
        status, body = await upstream.get(url.rstrip("/") + "/metrics", timeout_s)
        if status != 200:
            return BackendReport()
        text = body.decode()
    except (UnreachableError, UpstreamBroke, TimeoutError, UnicodeDecodeError):
        return BackendReport()
    return parse_backend_report(text)


log = logging.getLogger("floorguard.proxy")


class BackendHealth:
    def __init__(
        self,
        backends: Sequence[BackendSpec],
        stack: Stack,
        *,
        timeout_s: float,
        failures_to_down: int,
        on_change: Callable[[], None],
    ) -> None:
        self._urls: list[str] = []
        self._stack = stack
        self._timeout_s = timeout_s
        self._failures_to_down = failures_to_down
        self._on_change = on_change
        self.healthy: list[bool] = []
        """Whether each backend may get requests (for `/readyz` and dispatch)."""
        self._failures: list[int] = []
        self._removed: frozenset[int] = frozenset()
        self.reconfigure(backends, frozenset())

    def reconfigure(self, backends: Sequence[BackendSpec], removed: frozenset[int]) -> None:
        """The backends by position (a reload appends; `removed` ones are not probed and get
        no request again): a new one is down until its first probe answers."""
        known = len(self.healthy)
        self._urls = [b.url.rstrip("/") + b.health_path for b in backends]
        self.healthy += [False] * (len(backends) - known)
        self._failures += [0] * (len(backends) - known)
        for backend in range(known, len(backends)):
            self._stack.set_backend_available(backend, False)  # until its first probe answers
        for backend in removed - self._removed:
            if self.healthy[backend]:
                log.info("backend %d (%s) is removed: it drains", backend, self._urls[backend])
            self.healthy[backend] = False
            self._stack.set_backend_available(backend, False)
        self._removed = removed

    def any_up(self) -> bool:
        return any(self.healthy)

    def states(self) -> list[bool]:
        """Each backend's health now (the `floorguard_backend_up` gauge)."""
        return list(self.healthy)

    async def probe_all(self, upstream: Upstream) -> None:
        """One probe of every backend, then hand any slot that came up to the queue."""
        probed = [b for b in range(len(self._urls)) if b not in self._removed]
        answers = await asyncio.gather(*(self._probe(upstream, self._urls[b]) for b in probed))
        for backend, up in zip(probed, answers, strict=True):
            if backend in self._removed:  # a reload removed it while it was probed
                continue
            self._failures[backend] = 0 if up else self._failures[backend] + 1
            if up or self._failures[backend] >= self._failures_to_down:
                self._set(backend, up)
        self._on_change()

    async def probe_every(self, upstream: Upstream, interval_s: float, clock: Clock) -> None:
        while True:
            await clock.sleep(interval_s)
            await self.probe_all(upstream)

    def unreachable(self, backend: int) -> None:
        """A request could not reach it: down until a probe answers again."""
        self._set(backend, False)
        self._failures[backend] = self._failures_to_down

    async def _probe(self, upstream: Upstream, url: str) -> bool:
        try:
            status, _ = await upstream.get(url, self._timeout_s)
        except (UnreachableError, UpstreamBroke, TimeoutError):
            return False
        return status < 300

    def _set(self, backend: int, up: bool) -> None:
        if self.healthy[backend] != up:
            log.info(
                "backend %d (%s) is %s",
                backend,
                self._urls[backend],
                "up: it answers its health probe" if up else "down: it gets no requests",
            )
        self.healthy[backend] = up
        self._stack.set_backend_available(backend, up)
