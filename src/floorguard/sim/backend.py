"""A continuous-batching backend model with `C` slots (docs/design.md §5).

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

import bisect
import math
from collections import Counter
from collections.abc import Mapping
from heapq import heapify, heappop, heappush
from typing import Final, Protocol

import numpy as np

from floorguard.core.request import Request, RequestId
from floorguard.profiles import ServiceProfile

__all__ = [
    "BatchingBackend",
    "FixedServiceBackend",
    "KvBatchingBackend",
    "SimBackend",
    "create_backend",
]

_EPS: Final = 1e-9


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
        # the profile's per-request figures, read once (it is fixed for the backend's life,
        # as `_step_s` above): on the hot path each would be a Python attribute lookup
        self._prefill_s = profile.prefill_s
        self._prefill_per_prompt_token_s = profile.prefill_per_prompt_token_s
        self._stall_per_decoding_s = profile.stall_per_decoding_s
        self._reference_slots = profile.reference_slots
        self._jitter_sigma = profile.jitter_sigma
        self._jitter_z = profile.jitter_z
        self._jitter_mean = profile.jitter_mean
        self._jitter_cap = profile.jitter_cap

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
        j = 1.0
        if self._jitter_sigma > 0:
            z_max = self._jitter_z
            z = min(max(self._rng.standard_normal(), -z_max), z_max)
            j = math.exp(self._jitter_sigma * z)
        if self._jitter_mean > 0:
            j *= 1.0 + min(self._rng.exponential(self._jitter_mean), self._jitter_cap)
        return j

    def _stall_for_prefill(self, prompt: int, now: float) -> None:
        """A start's prefill (of `prompt` tokens) stalls the batch, longer the more requests
        are decoding; it also numbers the start (`_seq`)."""
        prefill_s = self._prefill_s + self._prefill_per_prompt_token_s * prompt
        if self._stall_per_decoding_s > 0:
            decoding = sum(1 for span in self._spans.values() if span[3] <= now)
            prefill_s += self._stall_per_decoding_s * min(decoding, self._reference_slots - 1)
        self._stalled_until = max(self._stalled_until, now) + prefill_s
        self._seq += 1

    def join(self, request: Request, now: float) -> float:
        if len(self._finish) >= self.num_slots:
            raise RuntimeError(f"backend full ({self.num_slots} slots): the guard over-dispatched")
        self._advance(now)
        self._stall_for_prefill(request.num_prompt_tokens, now)
        per_token = self._jitter()
        finish_v = self._v + request.num_output_tokens * per_token
        heappush(self._finish, (finish_v, self._seq, request.request_id))
        self._spans[request.request_id] = (
            self._v,
            finish_v,
            request.num_output_tokens,
            self._stalled_until,
        )
        return self._stalled_until + per_token * self._step_s[len(self._finish)]

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
            done.append(heappop(self._finish)[2])
            del self._spans[done[-1]]
        return done


class KvBatchingBackend(BatchingBackend):
    """`BatchingBackend` with a KV cache of `kv_blocks` blocks of `block_tokens` tokens, and
    what vLLM's scheduler does with it (docs/design.md §16). A running sequence holds
    `⌈(prompt + tokens out + 1) / block⌉` blocks, growing as it decodes. A request is
    admitted (from the guard, or again after a preemption) only when its prompt's blocks
    are free, in arrival order behind any that wait; else it waits inside the backend. When
    the next block cannot be allocated, the most recently admitted running sequence is
    preempted (vLLM's recompute): its blocks are freed, the tokens it streamed are kept, and
    it waits at the front to run again with prompt + those tokens to prefill once more.
    `preemptions` counts them (vLLM's `vllm:num_preemptions_total`). `join` returns inf for
    a request that has to wait: its first token's instant is put in `first_tokens` when it
    is admitted, for the driver to take.

    With `priorities` (tenant → the priority its requests carry, lower first), it is vLLM's
    `--scheduling-policy priority` instead: the victim is the running sequence of the
    largest (priority, arrival here), and the waiting run in (priority, arrival) order, a
    preempted one by its first arrival (vLLM v1's scheduler: `max(self.running, key=lambda
    r: (r.priority, r.arrival_time))`). A tenant it does not name carries 0, vLLM's
    default."""

    def __init__(
        self,
        profile: ServiceProfile,
        num_slots: int,
        rng: np.random.Generator,
        kv_blocks: int,
        *,
        block_tokens: int = 16,
        priorities: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(profile, num_slots, rng)
        self.kv_blocks, self.block_tokens = kv_blocks, block_tokens
        self.priorities = priorities
        self._order: dict[RequestId, tuple[int, float]] = {}
        """Under `priorities`: each request's (priority, first arrival here)."""
        self.preemptions = 0
        self.preempted: Counter[str] = Counter()
        """Preemptions by the tenant of the sequence preempted."""
        self.first_tokens: list[tuple[RequestId, float]] = []
        self._first_at: dict[RequestId, float] = {}
        """Each started request's first token: its prefill's end, then one of its steps."""
        self._requests: dict[RequestId, Request] = {}
        """Every request held here, running or waiting."""
        self._waiting: list[RequestId] = []
        """Waiting inside the backend, the first to run first."""
        self._streamed: dict[RequestId, int] = {}
        """Tokens out before the current run (kept across preemptions)."""
        self._prompt: dict[RequestId, int] = {}
        """The current run's prompt: the request's, + what it streamed before."""
        self._per_token: dict[RequestId, float] = {}
        """Decode steps per output token: its dispersion draw, kept across preemptions."""
        self._admitted: list[RequestId] = []
        """Running, in the order admitted: the last is preempted first."""
        self._announced: set[RequestId] = set()
        """Requests whose first token's instant the driver was given."""

    def _blocks(self, tokens: float) -> int:
        return math.ceil((tokens + 1) / self.block_tokens - _EPS)

    def _progress(self, request_id: RequestId, v: float) -> float:
        """Tokens out in the current run at virtual time `v`."""
        start_v, _, tokens, _ = self._spans[request_id]
        return min(float(tokens), max(0.0, v - start_v) / self._per_token[request_id])

    def _used(self, v: float) -> int:
        return sum(
            self._blocks(self._prompt[rid] + self._progress(rid, v)) for rid in self._admitted
        )

    def join(self, request: Request, now: float) -> float:
        rid = request.request_id
        if len(self._requests) >= self.num_slots:
            raise RuntimeError(f"backend full ({self.num_slots} slots): the guard over-dispatched")
        self._advance(now)
        self._requests[rid], self._streamed[rid] = request, 0
        self._per_token[rid] = self._jitter()
        if self.priorities is None:
            self._waiting.append(rid)
        else:
            self._order[rid] = (self.priorities.get(request.tenant, 0), now)
            bisect.insort(self._waiting, rid, key=self._order.__getitem__)
        self._admit_waiting(now)
        if rid not in self._spans:
            return math.inf
        self._announced.add(rid)
        self._announce()
        return self._first_at[rid]

    def _announce(self) -> None:
        """Give the driver the first token of each request admitted after it waited."""
        for rid in self._admitted:
            if rid not in self._announced:
                self._announced.add(rid)
                self.first_tokens.append((rid, self._first_at[rid]))

    def _admit_waiting(self, now: float) -> None:
        """Admit from the front while its prompt's blocks are free (vLLM's FCFS)."""
        while self._waiting and len(self._finish) < self.num_slots:
            rid = self._waiting[0]
            request, streamed = self._requests[rid], self._streamed[rid]
            prompt = request.num_prompt_tokens + streamed
            if self._used(self._v) + self._blocks(prompt) > self.kv_blocks:
                return
            self._waiting.pop(0)
            self._start(rid, prompt, request.num_output_tokens - streamed, now)

    def _start(self, rid: RequestId, prompt: int, tokens: int, now: float) -> None:
        self._stall_for_prefill(prompt, now)
        finish_v = self._v + tokens * self._per_token[rid]
        heappush(self._finish, (finish_v, self._seq, rid))
        self._spans[rid] = (self._v, finish_v, tokens, self._stalled_until)
        step = self._per_token[rid] * self._step_s[len(self._finish)]
        self._first_at[rid] = self._stalled_until + step  # its first token: one of its steps
        self._prompt[rid] = prompt
        self._admitted.append(rid)

    def tokens_out(self, request_id: RequestId, now: float) -> int:
        before = self._streamed[request_id]
        if request_id not in self._spans:  # waiting inside
            return before
        return before + super().tokens_out(request_id, now)

    def _next_preemption_v(self) -> float | None:
        """The virtual time at which the running sequences first need more blocks than the
        cache has (None: not before they finish)."""
        need = sum(self._blocks(self._prompt[r] + self._spans[r][2]) for r in self._admitted)
        if need <= self.kv_blocks:
            return None
        v, block = self._v, self.block_tokens
        used = self._used(v)
        if used > self.kv_blocks:
            return v
        crossings: list[tuple[float, int, RequestId]] = []
        for n, rid in enumerate(self._admitted):
            start_v, _, tokens, _ = self._spans[rid]
            prompt = self._prompt[rid]
            out = self._blocks(prompt + self._progress(rid, v)) * block - prompt
            if out < tokens:  # out tokens need one block more (blocks hold prompt + out + 1)
                crossings.append((start_v + out * self._per_token[rid], n, rid))
        heapify(crossings)
        while crossings:
            at, n, rid = heappop(crossings)
            used += 1
            if used > self.kv_blocks:
                return max(at, v)
            start_v, _, tokens, _ = self._spans[rid]
            out = round((at - start_v) / self._per_token[rid]) + block
            if out < tokens:
                heappush(crossings, (start_v + out * self._per_token[rid], n, rid))
        return None

    def next_completion_at(self) -> float | None:
        finish = super().next_completion_at()
        preempt_v = self._next_preemption_v() if self._finish else None
        if preempt_v is None:
            return finish
        start = max(self._last_at, self._stalled_until)
        preempt_at = start + max(preempt_v - self._v, 0.0) * self._step_s[len(self._finish)]
        return preempt_at if finish is None else min(finish, preempt_at)

    def complete_due(self, now: float) -> list[RequestId]:
        done = super().complete_due(now)
        for rid in done:
            self._admitted.remove(rid)
            for held in (self._prompt, self._streamed, self._per_token, self._requests):
                del held[rid]
            self._first_at.pop(rid, None)
            self._order.pop(rid, None)
            self._announced.discard(rid)
        while self._admitted:  # by the scheduler's own reckoning, so the two agree
            due = self._next_preemption_v()
            if due is None or due > self._v + 1e-6 * max(1.0, self._v):
                break
            self._preempt(self._victim())
        self._admit_waiting(now)
        self._announce()
        return done

    def _victim(self) -> RequestId:
        """The running sequence vLLM preempts: the last admitted (FCFS), or under
        `priorities` the one of the largest (priority, arrival)."""
        if self.priorities is None:
            return self._admitted[-1]
        return max(self._admitted, key=self._order.__getitem__)

    def _preempt(self, request_id: RequestId) -> None:
        self._streamed[request_id] += int(self._progress(request_id, self._v) + _EPS)
        self._finish = [e for e in self._finish if e[2] != request_id]
        heapify(self._finish)
        del self._spans[request_id], self._prompt[request_id]
        self._admitted.remove(request_id)
        if self.priorities is None:
            self._waiting.insert(0, request_id)
        else:
            bisect.insort(self._waiting, request_id, key=self._order.__getitem__)
        self.preemptions += 1
        self.preempted[self._requests[request_id].tenant] += 1


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
        heappush(self._done, (finish_at, self._seq, request.request_id))
        self._spans[request.request_id] = (now + prefill_s, finish_at, request.num_output_tokens)
        return now + prefill_s + p.step_s(1)  # its first token: after its prefill, one step

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
            done.append(heappop(self._done)[2])
            del self._spans[done[-1]]
        return done


def create_backend(
    profile: ServiceProfile,
    num_slots: int,
    rng: np.random.Generator,
    kv_blocks: int | None = None,
    *,
    block_tokens: int = 16,
    priorities: Mapping[str, int] | None = None,
) -> SimBackend:
    """The profile's backend; with `kv_blocks`, one whose KV cache preempts as vLLM's does
    (a coupled profile only), by priority where `priorities` are given."""
    if kv_blocks is not None:
        if not profile.coupled:
            raise ValueError("a KV cache is modelled on a coupled (batching) profile only")
        return KvBatchingBackend(
            profile, num_slots, rng, kv_blocks, block_tokens=block_tokens, priorities=priorities
        )
    if profile.coupled:
        return BatchingBackend(profile, num_slots, rng)
    return FixedServiceBackend(profile, num_slots)
