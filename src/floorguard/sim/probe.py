"""Probe a simulated backend and fit the latency predictor's model on what it saw.

A recording learner admits everything and keeps the `LoadSnapshot` each request arrived to —
exactly the features a learner sees in production — and the trace supplies the measured
latency (arrival → completion). `latency_model_for` is the one builder every driver uses
(`simulate`, `experiment`, `serve`, the real-backend runs, `calibrate`), with one of two
fits (docs/design.md §11, E1/E2):

* `published` — the published predictor: 132 samples from open-loop Poisson probes that
  span idle to saturated (2 to 14 requests/s against a capacity near 9.6/s), taken evenly
  over each probe's run, so the in-flight and queued features take the values a flood gives
  them. It sees load and sheds. The probes are *the workload it then serves*: their output
  lengths are the served ones (`lengths`: ℓ = 16 for the marquee, each experiment's own mix
  elsewhere). A fit with longer probes mixed in charges each queued short request for the
  long ones' service and sheds more than the published one did (docs/design.md §11, E1).
* `light-only` — 132 samples at light load alone (Poisson 2/s): its queue feature never
  varies, so it predicts light-load latency under any queue and never sheds a flood. Kept,
  under a name that says so, to show what a learner that never sheds does to a stack.
"""

from __future__ import annotations

import functools
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
    "MARQUEE_LENGTHS",
    "PREDICTOR_FITS",
    "PROBE_RATES_PER_S",
    "PUBLISHED_SAMPLES",
    "collect_probe_samples",
    "fit_probe_model",
    "latency_model_for",
    "prediction_error",
    "probe_lengths",
]

PROBE_RATES_PER_S = (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0)
"""The published fit's probe rates: idle to past saturation."""
PUBLISHED_SAMPLES = 132
"""The published predictor's sample count (docs/design.md §11)."""
PREDICTOR_FITS = ("published", "light-only")

Sample = tuple[LoadSnapshot, int, float]


class _Recorder:
    name = "probe-recorder"

    def __init__(self) -> None:
        self.loads: dict[RequestId, tuple[LoadSnapshot, int]] = {}

    def propose(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> Proposal:
        self.loads[request.request_id] = (load, request.num_output_tokens)
        return Proposal(admit=True)


MARQUEE_LENGTHS = BimodalLength(16, 16, 0.0)
"""The marquee's output lengths (all ℓ = 16): what a probe serves unless told otherwise."""


def probe_lengths(tokens: int, long_tokens: int = 0, long_fraction: float = 0.0) -> BimodalLength:
    """A served workload's output lengths as the probes draw them: `tokens`, and a share
    `long_fraction` of `long_tokens` where there is one."""
    if long_fraction <= 0:
        return BimodalLength(tokens, tokens, 0.0)
    return BimodalLength(tokens, max(tokens, long_tokens), long_fraction)


def _probe(
    profile: ServiceProfile,
    slots: int,
    rate_per_s: float,
    duration_s: float,
    *,
    seed: int,
    lengths: BimodalLength,
) -> list[Sample]:
    """The completed requests of one open-loop Poisson probe at `rate_per_s`, in arrival
    order: (the load each arrived to, ℓ, its latency)."""
    scenario = Scenario(
        name="probe",
        contracts=(Contract("probe", ContractClass.OPPORTUNISTIC, 1e6),),
        streams=(SyntheticStream("probe", PoissonArrivals(rate_per_s), lengths, duration_s),),
        profile=profile,
        slots=(slots,),
        doom_gate=False,
    )
    recorder = _Recorder()
    run = simulate_once(scenario, seed=seed, learner=lambda rng: recorder)
    assert run.events is not None
    samples = []
    for record in sorted(fold_trace(run.events).records, key=lambda r: r.arrival_at):
        if record.outcome == "completed":
            load, tokens = recorder.loads[record.request_id]
            samples.append((load, tokens, record.sojourn_s))
    return samples


def collect_probe_samples(
    profile: ServiceProfile,
    slots: int,
    *,
    seed: int = 0,
    duration_s: float = 20.0,
    rates_per_s: tuple[float, ...] = PROBE_RATES_PER_S,
    num_samples: int | None = None,
    lengths: BimodalLength = MARQUEE_LENGTHS,
) -> list[Sample]:
    """Probe samples at each rate in turn. With `num_samples`, that many in all, shared
    evenly between the rates and spread evenly over each probe's run (its start, where a
    queue is short, and its end, where an overloaded probe's queue is long)."""
    per_rate = [
        _probe(profile, slots, rate, duration_s, seed=seed * 1000 + i, lengths=lengths)
        for i, rate in enumerate(rates_per_s)
    ]
    if num_samples is None:
        return [s for samples in per_rate for s in samples]
    shares = np.diff(np.linspace(0, num_samples, len(rates_per_s) + 1).round().astype(int))
    picked: list[Sample] = []
    for samples, share in zip(per_rate, shares, strict=True):
        require(
            len(samples) >= share,
            "probe",
            len(samples),
            f"needs {share} completed samples at each rate ({duration_s} s is too short)",
        )
        picked += [samples[int(i)] for i in np.linspace(0, len(samples) - 1, share).round()]
    return picked


def fit_probe_model(
    profile: ServiceProfile,
    slots: int,
    *,
    seed: int = 0,
    fit: str = "published",
    lengths: BimodalLength = MARQUEE_LENGTHS,
) -> LatencyModel:
    """The latency predictor for `profile` with `slots` slots, fitted on fresh probes of
    the served `lengths` (`fit`: `published` or `light-only`, module docstring)."""
    require(fit in PREDICTOR_FITS, "predictor fit", fit, f"must be one of {PREDICTOR_FITS}")
    rates = PROBE_RATES_PER_S if fit == "published" else (2.0,)
    duration_s = 20.0 if fit == "published" else 90.0
    return fit_latency_model(
        collect_probe_samples(
            profile,
            slots,
            seed=seed,
            duration_s=duration_s,
            rates_per_s=rates,
            num_samples=PUBLISHED_SAMPLES,
            lengths=lengths,
        )
    )


@functools.cache
def latency_model_for(
    profile: str | ServiceProfile,
    slots: int,
    fit: str = "published",
    lengths: BimodalLength = MARQUEE_LENGTHS,
) -> LatencyModel:
    """The one builder of the latency predictor: for a profile (a shipped name, a profile
    file, or a `ServiceProfile`) with `slots` slots, serving `lengths`. For the `published`
    fit and a profile file that `floorguard calibrate` saved one with for those slots, that
    one; else fitted once per process on simulated probes (seed 0), so every driver that
    names the same profile, slots, fit and lengths runs the same learner."""
    if isinstance(profile, str):
        if fit == "published" and profile.endswith((".yaml", ".yml")):
            saved = load_latency_model(Path(profile))
            if saved is not None and saved.get("slots") == slots:
                return LatencyModel.from_dict(saved)
        profile = get_profile(profile)
    return fit_probe_model(profile, slots, fit=fit, lengths=lengths)


def prediction_error(model: LatencyModel, samples: list[Sample]) -> float:
    """Root-mean-square error of the model on samples (seconds)."""
    errors = [model.predict_s(load, tokens) - latency for load, tokens, latency in samples]
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else 0.0
