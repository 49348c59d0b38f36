"""A continuous-batching backend model with `C` slots (SPEC §5).

All running sequences advance together, one token per decode step; a step of `n` running
sequences takes `step_s(n)`, so service couples to load. A joining request's prefill stalls
the batch, longer the more sequences are already decoding (the sustained-load coupling), and
each request needs `ℓ·j` steps, `j` its own dispersion draw. The model advances by
batch-membership changes, not token by token: a shared
progress counter `V` (decode steps done by every running sequence) moves at `1/step_s(n)`
between changes, and a request finishes when `V` reaches its `finish_v`. Cost per request is
O(log C), whatever its length.
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

import numpy as np

from floorguard.core.request import Request, RequestId
from floorguard.profiles import ServiceProfile

__all__ = ["BatchingBackend", "FixedServiceBackend", "SimBackend", "create_backend"]

_EPS = 1e-9


class SimBackend(Protocol):
    num_slots: int

    def join(self, request: Request, now: float) -> float:
        """Start `request`; returns when its first token is out."""
        ...

    def next_completion_at(self) -> float | None: ...

    def tokens_out(self, request_id: RequestId, now: float) -> int:
        """Output tokens a running request has produced by `now` (for streaming)."""
        ...

    def complete_due(self, now: float) -> list[RequestId]:
        """Requests finished by `now` (call at `next_completion_at()`)."""
        ...


class BatchingBackend:
    def __init__(self, profile: ServiceProfile, num_slots: int, rng: np.random.Generator) -> None:
        self.profile = profile
        self.num_slots = num_slots
        self._rng = rng
        self._finish: list[tuple[float, int, RequestId]] = []  # (finish_v, seq, id)
        self._spans: dict[RequestId, tuple[float, float, int, float]] = {}
        """(start_v, finish_v, ℓ, first token at)."""
        self._seq = 0
        self._v = 0.0
        self._last_at = 0.0
        self._stalled_until = 0.0
        self._step_s = [0.0, *(profile.step_s(n) for n in range(1, num_slots + 1))]

    @property
    def num_running(self) -> int:
        return len(self._finish)

    def _v_at(self, now: float) -> float:
        """Virtual time (tokens per running request) at `now`, for the current batch."""
        busy_from = max(self._last_at, self._stalled_until)
        if self._finish and now > busy_from:
            return self._v + (now - busy_from) / self._step_s[len(self._finish)]
        return self._v

    def _advance(self, now: float) -> None:
        self._v = self._v_at(now)
        self._last_at = now

    def _jitter(self) -> float:
        """`j = g·e`: the lognormal dispersion `g` (median 1, clipped at ±`jitter_z` σ) times
        the one-sided `e = 1 + min(Exp(jitter_mean), jitter_cap)`."""
        p = self.profile
        j = 1.0
        if p.jitter_sigma > 0:
            z = min(max(self._rng.standard_normal(), -p.jitter_z), p.jitter_z)
            j = math.exp(p.jitter_sigma * z)
        if p.jitter_mean > 0:
            j *= 1.0 + min(self._rng.exponential(p.jitter_mean), p.jitter_cap)
        return j

    def join(self, request: Request, now: float) -> float:
        if len(self._finish) >= self.num_slots:
            raise RuntimeError(f"backend full ({self.num_slots} slots): the guard over-dispatched")
        self._advance(now)
        p = self.profile
        prefill_s = p.prefill_s + p.prefill_per_prompt_token_s * request.num_prompt_tokens
        if p.stall_per_decoding_s > 0:
            decoding = sum(1 for span in self._spans.values() if span[3] <= now)
            prefill_s += p.stall_per_decoding_s * min(decoding, p.reference_slots - 1)
        self._stalled_until = max(self._stalled_until, now) + prefill_s
        self._seq += 1
        finish_v = self._v + request.num_output_tokens * self._jitter()
        heapq.heappush(self._finish, (finish_v, self._seq, request.request_id))
        self._spans[request.request_id] = (
            self._v,
            finish_v,
            request.num_output_tokens,
            self._stalled_until,
        )
        return self._stalled_until

    def tokens_out(self, request_id: RequestId, now: float) -> int:
        start_v, finish_v, tokens, _ = self._spans[request_id]
        if finish_v <= start_v:
            return tokens
        done = (self._v_at(now) - start_v) / (finish_v - start_v)
        return min(tokens, int(tokens * done + _EPS))

    def next_completion_at(self) -> float | None:
        if not self._finish:
            return None
        remaining = max(self._finish[0][0] - self._v, 0.0)
        start = max(self._last_at, self._stalled_until)
        return start + remaining * self._step_s[len(self._finish)]

    def complete_due(self, now: float) -> list[RequestId]:
        self._advance(now)
        done: list[RequestId] = []
        while self._finish and self._finish[0][0] <= self._v + _EPS * max(1.0, self._v):
            done.append(heapq.heappop(self._finish)[2])
            del self._spans[done[-1]]
        return done


class FixedServiceBackend:
    """Deterministic slots: service is `L(ℓ)` exactly, independent of load."""

    def __init__(self, profile: ServiceProfile, num_slots: int) -> None:
        self.profile = profile
        self.num_slots = num_slots
        self._done: list[tuple[float, int, RequestId]] = []
        self._spans: dict[RequestId, tuple[float, float, int]] = {}  # (first, finish, ℓ)
        self._seq = 0

    @property
    def num_running(self) -> int:
        return len(self._done)

    def join(self, request: Request, now: float) -> float:
        if len(self._done) >= self.num_slots:
            raise RuntimeError(f"backend full ({self.num_slots} slots): the guard over-dispatched")
        self._seq += 1
        p = self.profile
        prefill_s = p.prefill_s + p.prefill_per_prompt_token_s * request.num_prompt_tokens
        finish_at = now + prefill_s + request.num_output_tokens * p.step_s(1)
        heapq.heappush(self._done, (finish_at, self._seq, request.request_id))
        self._spans[request.request_id] = (now + prefill_s, finish_at, request.num_output_tokens)
        return now + prefill_s

    def tokens_out(self, request_id: RequestId, now: float) -> int:
        first_at, finish_at, tokens = self._spans[request_id]
        if now >= finish_at:
            return tokens
        return max(0, int(tokens * (now - first_at) / (finish_at - first_at) + _EPS))

    def next_completion_at(self) -> float | None:
        return self._done[0][0] if self._done else None

    def complete_due(self, now: float) -> list[RequestId]:
        done: list[RequestId] = []
        while self._done and self._done[0][0] <= now + _EPS:
            done.append(heapq.heappop(self._done)[2])
            del self._spans[done[-1]]
        return done


def create_backend(profile: ServiceProfile, num_slots: int, rng: np.random.Generator) -> SimBackend:
    if profile.coupled:
        return BatchingBackend(profile, num_slots, rng)
    return FixedServiceBackend(profile, num_slots)
