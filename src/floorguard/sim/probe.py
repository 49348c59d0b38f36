"""Probe a simulated backend and fit the latency predictor's model on what it saw.

A recording learner admits everything and keeps the `LoadSnapshot` each request arrived to —
exactly the features a learner sees in production — and the trace supplies the measured
latency (arrival → completion). Two probe sets (SPEC §11, E1/E2):

* `light` — the published predictor: 132 samples at light load (Poisson 2/s, mixed output
  lengths). The queue never builds, so the fit knows nothing about queueing: its features'
  range is the probes' range, and under a flood it predicts light-load latency.
* `loaded` — a queue-aware predictor: open-loop Poisson probes at several rates, below and
  above capacity, so every coefficient is identifiable. A far better learner than the
  published one, reported beside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from floorguard.analysis.records import fold_trace
from floorguard.core.contract import Contract, ContractClass
from floorguard.core.learner import LoadSnapshot, Proposal
from floorguard.core.request import Request, RequestId
from floorguard.errors import require
from floorguard.learners.latency import LatencyModel, fit_latency_model
from floorguard.profiles import ServiceProfile, get_profile, load_latency_model
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import Scenario
from floorguard.sim.workloads import BimodalLength, PoissonArrivals, SyntheticStream

__all__ = [
    "LIGHT_PROBE_SAMPLES",
    "PREDICTOR_FITS",
    "PROBE_RATES_PER_S",
    "collect_probe_samples",
    "fit_probe_model",
    "latency_model_for",
    "prediction_error",
]

PROBE_RATES_PER_S = (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0)
LIGHT_PROBE_SAMPLES = 132
"""The published predictor's sample count."""
PREDICTOR_FITS = ("light", "loaded")


class _Recorder:
    name = "probe-recorder"

    def __init__(self) -> None:
        self.loads: dict[RequestId, tuple[LoadSnapshot, int]] = {}

    def propose(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> Proposal:
        self.loads[request.request_id] = (load, request.num_output_tokens)
        return Proposal(admit=True)


def collect_probe_samples(
    profile: ServiceProfile,
    slots: int,
    *,
    seed: int = 0,
    duration_s: float = 20.0,
    rates_per_s: tuple[float, ...] = PROBE_RATES_PER_S,
) -> list[tuple[LoadSnapshot, int, float]]:
    samples: list[tuple[LoadSnapshot, int, float]] = []
    for i, rate in enumerate(rates_per_s):
        scenario = Scenario(
            name="probe",
            contracts=(Contract("probe", ContractClass.OPPORTUNISTIC, 1e6),),
            streams=(
                SyntheticStream(
                    "probe", PoissonArrivals(rate), BimodalLength(16, 64, 0.3), duration_s
                ),
            ),
            profile=profile,
            slots=(slots,),
            doom_gate=False,
        )
        recorder = _Recorder()
        run = simulate_once(scenario, seed=seed * 1000 + i, learner=lambda rng, r=recorder: r)  # type: ignore[misc]
        assert run.events is not None
        for record in fold_trace(run.events).records:
            if record.outcome == "completed":
                load, tokens = recorder.loads[record.request_id]
                samples.append((load, tokens, record.sojourn_s))
    return samples


def fit_probe_model(
    profile: ServiceProfile, slots: int, *, seed: int = 0, fit: str = "loaded"
) -> LatencyModel:
    """The latency predictor for `profile` with `slots` slots, fitted on fresh probes:
    `fit` is `loaded` (the queue-aware one) or `light` (the published one)."""
    if fit == "light":
        samples = collect_probe_samples(
            profile, slots, seed=seed, duration_s=90.0, rates_per_s=(2.0,)
        )
        require(
            len(samples) >= LIGHT_PROBE_SAMPLES,
            "light probe",
            len(samples),
            f"needs {LIGHT_PROBE_SAMPLES} samples",
        )
        return fit_latency_model(samples[:LIGHT_PROBE_SAMPLES])
    require(fit == "loaded", "predictor fit", fit, f"must be one of {PREDICTOR_FITS}")
    return fit_latency_model(collect_probe_samples(profile, slots, seed=seed))


def latency_model_for(profile: str, slots: int, fit: str = "loaded") -> LatencyModel:
    """The latency predictor for a profile (a shipped name or a profile file) with `slots`
    slots: for the `loaded` fit, the one `floorguard calibrate` saved with the file for those
    slots, else fitted now on simulated probes (a shipped profile, a file written before
    calibrate saved one, other slots, or the `light` fit)."""
    if fit == "loaded" and profile.endswith((".yaml", ".yml")):
        saved = load_latency_model(Path(profile))
        if saved is not None and saved.get("slots") == slots:
            return LatencyModel.from_dict(saved)
    return fit_probe_model(get_profile(profile), slots, fit=fit)


def prediction_error(model: LatencyModel, samples: list[tuple[LoadSnapshot, int, float]]) -> float:
    """Root-mean-square error of the model on samples (seconds)."""
    errors = [model.predict_s(load, tokens) - latency for load, tokens, latency in samples]
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else 0.0
