"""`floorguard calibrate`: measure an OpenAI-compatible backend (vLLM, or the emulator) and
fit the simulator's service model to it, so the simulator, the screen and the guard's doom
gate use what this backend really does.

Every probe pins the output length (`max_tokens` = `min_tokens` = ℓ, `ignore_eos`), so a
service time is a function of ℓ and of what else runs. Probes, in order:

1. **alone**: one request at a time, ℓ ∈ {1, 16, 32, 64}, `reps` each. A line through the
   per-ℓ minima gives `prefill_s` (intercept) and `step_1_s` (slope); the intercept is then
   lowered until no sample falls below the line, so `L(ℓ)` is a sound lower envelope for
   every service seen. The samples' excess over `L` gives the jitter (mean and cap).
2. **together**: `n` requests of ℓ = 32 started at once, n = 2…C. The last one completes after
   n prefills and 32 steps of n: `step(n) = (t_n − n·prefill_s) / 32`. `step_full_s` is
   `step(C)`; the coupling shape `r` is the grid value that fits step(2…C−1) best.
3. **prompt**: one request at a time, ℓ = 1, with prompts of about 64, 256 and 1024 tokens
   (`reps` each; the backend's own `usage.prompt_tokens` says how many), each with a prefix
   of its own and then once more unchanged (vLLM's prefix cache may then skip its prefill).
   The first sends give the prefill cost per prompt token (least squares over `L(1)`:
   `prefill_per_prompt_token_s`, which the simulator's prefill and `s_max` count); the
   smallest slope any send shows, repeats included, is what `L(ℓ, p)` may count
   (`lower_per_prompt_token_s`), so a cache hit never beats the lower envelope. A backend
   that reports no prompt tokens (the emulator models none) gets 0 for both.
4. **saturated**: C workers each send 8 requests of ℓ = 16 back to back, so the backend
   always runs C and nothing waits in its queue. μ_sat is the completion rate over the
   middle 80 % of completions; the largest service seen sets the ceiling `s_max(ℓ)`: the
   full-batch line `C·prefill_s + ℓ·step_full_s`, scaled through that maximum (never below
   the line itself).

Residuals (model against measurement, per probe) are reported and written with the profile.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from floorguard.core.contract import AffineEnvelope
from floorguard.errors import FloorguardError
from floorguard.profiles import ServiceProfile, save_profile
from floorguard.sim.probe import latency_model_for

__all__ = ["CalibrationError", "CalibrationResult", "calibrate"]

ALONE_TOKENS = (1, 16, 32, 64)
PROMPT_WORDS = (64, 256, 1024)
TOGETHER_TOKENS = 32
FLOOD_TOKENS = 16
FLOOD_PER_SLOT = 8
STREAM_TOKENS = 32
"""The first-token probe's streamed requests: long enough for a steady per-token time."""


class CalibrationError(FloorguardError):
    """The backend could not be probed (unreachable, refusing, or answering nonsense)."""


@dataclass(frozen=True)
class CalibrationResult:
    profile: ServiceProfile
    mu_sat_per_s: float
    """Measured saturated completion rate at ℓ = 16."""
    alone_s: dict[int, list[float]]
    together_s: dict[int, float]
    """n → when the last of n simultaneous ℓ = 32 requests completed."""
    flood_max_s: float
    residuals: dict[str, Any]
    prompt_s: list[tuple[int, float]] = field(default_factory=list)
    """(prompt tokens as the backend counted them, service) of the prompt probe at ℓ = 1."""
    prompt_repeat_s: list[tuple[int, float]] = field(default_factory=list)
    """The same prompts sent again at once (a prefix cache may serve them)."""
    streamed: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    """n → (time to the first token, mean time per token after it) of each of n streamed
    requests started together (docs/design.md §19's first-token physics)."""

    def first_tokens(self) -> dict[str, Any]:
        """The first-token probe beside the fitted model: per width n, the median measured
        time to a first token and per output token, and what the profile predicts — the
        mean of n joiners' first tokens, each after the prefills before it and its own (the
        simulator's: each joiner's prefill stalls the batch) and then one step; a token every
        `step(n)` at the mean dispersion."""
        p = self.profile
        out: dict[str, Any] = {}
        for n, samples in sorted(self.streamed.items()):
            ttft = [first for first, _ in samples]
            tpot = [per for _, per in samples if per > 0]
            out[str(n)] = {
                "ttft_ms": float(np.median(ttft)) * 1e3,
                "ttft_model_ms": (p.prefill_s * (n + 1) / 2 + p.step_s(n) * (1 + p.jitter_mean))
                * 1e3,
                "tpot_ms": float(np.median(tpot)) * 1e3 if tpot else None,
                "tpot_model_ms": p.step_s(n) * (1 + p.jitter_mean) * 1e3,
            }
        return out

    def measured(self, backend: str, model: str) -> dict[str, Any]:
        """What to keep beside the profile in its file."""
        return {
            "backend": backend,
            "model": model,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "mu_sat_per_s": self.mu_sat_per_s,
            "alone_s": {k: [round(x, 6) for x in v] for k, v in self.alone_s.items()},
            "together_s": {k: round(v, 6) for k, v in self.together_s.items()},
            "flood_max_s": self.flood_max_s,
            "prompt_s": [[p, round(x, 6)] for p, x in self.prompt_s],
            "prompt_repeat_s": [[p, round(x, 6)] for p, x in self.prompt_repeat_s],
            "streamed": {
                n: [[round(a, 6), round(b, 6)] for a, b in v] for n, v in self.streamed.items()
            },
            "first_tokens": self.first_tokens(),
            "residuals": self.residuals,
        }

    def save(self, path: Path, *, backend: str, model: str, slots: int) -> None:
        """The profile file: the fitted profile, what was measured, and the latency
        predictor fitted for it at `slots` slots (the predictor learners load it instead of
        fitting at server start)."""
        latency = latency_model_for(self.profile, slots)
        save_profile(
            self.profile,
            path,
            measured=self.measured(backend, model),
            latency_model={"slots": slots, **latency.as_dict()},
        )


async def _service(session: aiohttp.ClientSession, url: str, model: str, tokens: int) -> float:
    return (await _timed(session, url, model, tokens))[0]


async def _timed(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    tokens: int,
    prompt: str = "floorguard calibration",
) -> tuple[float, int]:
    """(service, prompt tokens as the backend reports them; 0 if it does not)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
    }
    started = time.perf_counter()
    try:
        async with session.post(url, json=body) as response:
            payload = await response.read()
            if response.status != 200:
                raise CalibrationError(
                    f"{url} answered {response.status}: {payload[:200].decode(errors='replace')}"
                )
    except aiohttp.ClientError as exc:
        raise CalibrationError(f"{url} cannot be reached: {exc}") from exc
    service = time.perf_counter() - started
    try:
        usage = json.loads(payload).get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
    except (ValueError, TypeError, AttributeError):
        prompt_tokens = 0
    return service, prompt_tokens


def _fit_prompt(
    first: list[tuple[int, float]],
    repeats: list[tuple[int, float]],
    prefill_s: float,
    step_1_s: float,
    base_tokens: int,
) -> tuple[float, float, float]:
    """(prefill_s, prefill_per_prompt_token_s, lower_per_prompt_token_s). The model's slope:
    least squares through `L(1)` over the first sends; the lower envelope's: the smallest
    slope of any send (0 without samples), with the intercept lowered by what the short
    probe prompt of the other probes already paid at that slope, and further until no send
    (a prefix-cache hit can be faster than the alone probe's fastest) falls below `L`."""
    points = [(p, s - prefill_s - step_1_s) for p, s in first if p > 0]
    model = sum(p * y for p, y in points) / sum(p * p for p, _ in points) if points else 0.0
    slopes = [(s - prefill_s - step_1_s) / p for p, s in [*first, *repeats] if p > 0]
    lower = max(0.0, min(slopes)) if slopes else 0.0
    # every send, cache hits included, stays at or above L(1, p): lower the intercept to it
    floor_s = min([s - step_1_s - lower * p for p, s in [*first, *repeats]], default=math.inf)
    return max(0.0, min(prefill_s - lower * base_tokens, floor_s)), max(0.0, model), lower


async def _streamed(
    session: aiohttp.ClientSession, url: str, model: str, tokens: int
) -> tuple[float, float]:
    """(time to the first token, mean time per token after it) of one streamed request:
    one server-sent chunk per token, as vLLM streams."""
    body = {
        "model": model,
        "prompt": "floorguard calibration",
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    chunks: list[float] = []
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                payload = await response.read()
                raise CalibrationError(
                    f"{url} answered {response.status} to a stream: "
                    f"{payload[:200].decode(errors='replace')}"
                )
            async for line in response.content:
                if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                    chunks.append(time.perf_counter())
    except aiohttp.ClientError as exc:
        raise CalibrationError(f"{url} cannot be reached: {exc}") from exc
    if not chunks:
        raise CalibrationError(f"{url} streamed no chunk")
    per_token = (chunks[-1] - chunks[0]) / (len(chunks) - 1) if len(chunks) > 1 else 0.0
    return chunks[0] - started, per_token


async def _together(
    session: aiohttp.ClientSession, url: str, model: str, n: int, tokens: int
) -> list[float]:
    return list(await asyncio.gather(*(_service(session, url, model, tokens) for _ in range(n))))


def _fit_alone(alone: dict[int, list[float]]) -> tuple[float, float, float, float]:
    """(prefill_s, step_1_s, jitter_mean, jitter_cap) from the alone probe."""
    ells = np.array(sorted(alone), dtype=float)
    minima = np.array([min(alone[int(ell)]) for ell in ells])
    fitted_slope, fitted_intercept = np.polyfit(ells, minima, 1)
    slope, intercept = max(float(fitted_slope), 1e-6), float(fitted_intercept)
    # lower the intercept until every sample is at or above the line (a sound L)
    worst = max(
        slope * ell + intercept - sample for ell, samples in alone.items() for sample in samples
    )
    intercept -= max(0.0, worst)
    if intercept < 0:  # a line through the origin instead, no steeper than any sample
        intercept = 0.0
        slope = min(slope, *(sample / ell for ell, samples in alone.items() for sample in samples))
    excess = [
        (sample - intercept) / (slope * ell) - 1
        for ell, samples in alone.items()
        if ell >= 16
        for sample in samples
    ]
    excess = [max(0.0, e) for e in excess]
    return intercept, slope, float(np.mean(excess)), float(max(excess))


def _fit_together(
    together: dict[int, float], prefill_s: float, step_1_s: float, slots: int
) -> tuple[float, float, dict[int, float]]:
    """(step_full_s, coupling_shape, step(n) measured)."""
    steps = {n: max(step_1_s, (t - n * prefill_s) / TOGETHER_TOKENS) for n, t in together.items()}
    step_full = steps[slots]
    best_r, best_err = 1.0, math.inf
    for r in np.linspace(0.0, 1.0, 101):
        probe = ServiceProfile(
            "fit",
            prefill_s,
            step_1_s,
            step_full,
            AffineEnvelope(0.0, 0.0),
            coupling_shape=float(r),
            reference_slots=slots,
        )
        err = sum((probe.step_s(n) - s) ** 2 for n, s in steps.items())
        if err < best_err:
            best_r, best_err = float(r), err
    return step_full, best_r, steps


async def _probe(
    url: str, model: str, slots: int, reps: int, timeout_s: float
) -> tuple[
    dict[int, list[float]],
    dict[int, float],
    list[float],
    float,
    list[tuple[int, float]],
    dict[int, list[tuple[float, float]]],
]:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        # warm up (and fail fast if unreachable); the short probe prompt's token count
        _, base_tokens = await _timed(session, url, model, 1)
        alone: dict[int, list[float]] = {ell: [] for ell in ALONE_TOKENS}
        for _ in range(reps):
            for ell in ALONE_TOKENS:
                alone[ell].append(await _service(session, url, model, ell))
        prompt_s: list[tuple[int, float]] = []
        nonce = time.time_ns()  # not in any prefix cache, not even from an earlier run
        for rep in range(reps):
            for words in PROMPT_WORDS:
                prompt = f"probe {nonce} {rep} {words}" + " a" * words  # a prefix of its own
                for _ in range(2):  # first send, then at once the same again
                    service, counted = await _timed(session, url, model, 1, prompt)
                    prompt_s.append((counted, service))
        together: dict[int, float] = {}
        for n in range(2, slots + 1):
            lasts = [await _together(session, url, model, n, TOGETHER_TOKENS) for _ in range(2)]
            together[n] = min(max(last) for last in lasts)
        streamed: dict[int, list[tuple[float, float]]] = {}
        for n in range(1, slots + 1):
            for _ in range(reps):
                runs = (_streamed(session, url, model, STREAM_TOKENS) for _ in range(n))
                streamed.setdefault(n, []).extend(await asyncio.gather(*runs))
        started = time.perf_counter()
        workers = await asyncio.gather(
            *(_keep_busy(session, url, model, started, FLOOD_PER_SLOT) for _ in range(slots))
        )
        flood = [run for worker in workers for run in worker]
        ends = sorted(end for end, _ in flood)
        lo, hi = len(ends) // 10, len(ends) * 9 // 10
        mu_sat = (hi - 1 - lo) / (ends[hi - 1] - ends[lo]) if ends[hi - 1] > ends[lo] else math.nan
        return (
            alone,
            together,
            [service for _, service in flood],
            mu_sat,
            [
                (base_tokens, -1.0),
                *prompt_s,
            ],
            streamed,
        )


async def _keep_busy(
    session: aiohttp.ClientSession, url: str, model: str, started: float, count: int
) -> list[tuple[float, float]]:
    """One of C workers keeping the backend full: (completed at, service) per request."""
    runs = []
    for _ in range(count):
        service = await _service(session, url, model, FLOOD_TOKENS)
        runs.append((time.perf_counter() - started, service))
    return runs


def calibrate(
    backend: str,
    model: str,
    *,
    slots: int = 4,
    reps: int = 3,
    name: str = "calibrated",
    timeout_s: float = 120.0,
) -> CalibrationResult:
    """Probe `backend` (its `/v1/completions`) serving `model` with `slots` sequences at
    most (vLLM's `--max-num-seqs`) and fit a profile named `name`."""
    if slots < 2:
        raise CalibrationError(f"slots = {slots}: the coupling fit needs at least 2")
    url = backend.rstrip("/") + "/v1/completions"
    alone, together, flood, mu_sat, probed, streamed = asyncio.run(
        _probe(url, model, slots, reps, timeout_s)
    )
    (base_tokens, _), prompt_s, repeat_s = probed[0], probed[1::2], probed[2::2]
    prefill_s, step_1_s, jitter_mean, jitter_cap = _fit_alone(alone)
    prefill_s, per_prompt_token_s, lower_per_prompt_s = _fit_prompt(
        prompt_s, repeat_s, prefill_s, step_1_s, base_tokens
    )
    step_full_s, shape, steps = _fit_together(together, prefill_s, step_1_s, slots)
    full_line = AffineEnvelope(slots * prefill_s, step_full_s)
    scale = max(1.0, max(flood) / full_line.at(FLOOD_TOKENS))
    profile = ServiceProfile(
        name=name,
        prefill_s=prefill_s,
        step_1_s=step_1_s,
        step_full_s=step_full_s,
        ceiling=AffineEnvelope(
            full_line.base_s * scale, full_line.per_token_s * scale, per_prompt_token_s * scale
        ),
        coupling_shape=shape,
        reference_slots=slots,
        jitter_mean=jitter_mean,
        jitter_cap=jitter_cap,
        prefill_per_prompt_token_s=per_prompt_token_s,
        lower_per_prompt_token_s=lower_per_prompt_s,
    )
    residuals = {
        "alone_median_rel": {
            ell: float(np.median(v)) / profile.lower.at(ell) - 1 for ell, v in alone.items()
        },
        "step_rel": {n: profile.step_s(n) / s - 1 for n, s in steps.items()},
        "samples_below_L": sum(
            s < profile.lower.at(ell) - 1e-9 for ell, v in alone.items() for s in v
        )
        + sum(s < profile.lower.at(1, p) - 1e-9 for p, s in [*prompt_s, *repeat_s]),
    }
    return CalibrationResult(
        profile,
        mu_sat,
        alone,
        together,
        max(flood),
        residuals,
        prompt_s=prompt_s,
        prompt_repeat_s=repeat_s,
        streamed=streamed,
    )
