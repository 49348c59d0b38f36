"""The GAIE-style latency-predictor admitter (design §7): an untrusted learner that admits iff
its miscalibrated prediction `β·pred` is within the SLO.

The model is ordinary least squares (numpy) over the load features the guard hands every
learner — in-flight count, queued count — and the request's output cap ℓ, fitted on probe
samples gathered from a backend (`floorguard.sim.probe` for the simulator). A fit reports
its sample count and R²; the admitter never sees anything but `LoadSnapshot` and the request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from floorguard.core.contract import ContractClass
from floorguard.core.learner import LoadSnapshot, Proposal
from floorguard.core.request import Request
from floorguard.errors import ConfigError, require

__all__ = [
    "FEATURES",
    "LatencyModel",
    "LatencyPredictorAdmitter",
    "ShedPolicy",
    "fit_latency_model",
    "latency_features",
]

FEATURES = ("intercept", "num_in_flight", "num_queued", "num_output_tokens")


def latency_features(load: LoadSnapshot, num_output_tokens: int) -> tuple[float, ...]:
    queued = load.num_queued_entitled + load.num_queued_surplus
    return (1.0, float(load.num_in_flight), float(queued), float(num_output_tokens))


@dataclass(frozen=True)
class LatencyModel:
    coefficients: tuple[float, ...]
    """One per name in `FEATURES`, seconds per unit."""
    num_samples: int
    r2: float

    def predict_s(self, load: LoadSnapshot, num_output_tokens: int) -> float:
        x = latency_features(load, num_output_tokens)
        return sum(c * v for c, v in zip(self.coefficients, x, strict=True))

    def as_dict(self) -> dict[str, object]:
        return {
            "num_samples": self.num_samples,
            "r2": self.r2,
            "coefficients": dict(zip(FEATURES, self.coefficients, strict=True)),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyModel:
        """The model `as_dict` wrote (a profile file's `latency_model`); ConfigError when
        a coefficient is missing or not a number."""
        coefficients = data.get("coefficients")
        if not isinstance(coefficients, Mapping) or any(
            type(coefficients.get(name)) not in (int, float) for name in FEATURES
        ):
            raise ConfigError(
                "latency_model.coefficients", coefficients, f"needs a number for each of {FEATURES}"
            )
        return cls(
            tuple(float(coefficients[name]) for name in FEATURES),
            int(data.get("num_samples", 0)),
            float(data.get("r2", math.nan)),
        )


def fit_latency_model(
    samples: Sequence[tuple[LoadSnapshot, int, float]],
) -> LatencyModel:
    """Least squares of latency (s) on the features of `(load, ℓ, latency)` samples."""
    require(
        len(samples) >= len(FEATURES),
        "samples",
        len(samples),
        f"need at least {len(FEATURES)} probe samples to fit {len(FEATURES)} coefficients",
    )
    x = np.asarray([latency_features(load, tokens) for load, tokens, _ in samples])
    y = np.asarray([latency for _, _, latency in samples])
    coefficients, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ coefficients
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    return LatencyModel(tuple(float(c) for c in coefficients), len(samples), r2)


class ShedPolicy(StrEnum):
    SHEDDABLE_ONLY = "sheddable-only"
    """May reject only the opportunistic (sheddable) class: never sheds assured."""
    CLASS_AGNOSTIC = "class-agnostic"
    """May reject any class."""


class LatencyPredictorAdmitter:
    """Admits iff `β · predicted latency ≤ slo_s` (β = 1 is well calibrated; β < 1 is
    optimistic and over-admits; β > 1 is pessimistic and over-sheds)."""

    def __init__(
        self, model: LatencyModel, *, beta: float, slo_s: float, policy: ShedPolicy
    ) -> None:
        require(beta >= 0, "beta", beta, "must be ≥ 0")
        require(slo_s > 0, "slo_s", slo_s, "must be > 0")
        self.model = model
        self.beta = beta
        self.slo_s = slo_s
        self.policy = policy
        self.name = f"predictor-{policy.value}"

    def propose(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> Proposal:
        if self.policy is ShedPolicy.SHEDDABLE_ONLY and cls is ContractClass.ASSURED:
            return Proposal(admit=True)
        predicted = self.model.predict_s(load, request.num_output_tokens)
        return Proposal(admit=self.beta * predicted <= self.slo_s)
