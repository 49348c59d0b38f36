"""Calibration profiles for the simulated backend (docs/design.md §5).

The model (see `backend.py`): a request's prefill stalls the whole batch for `prefill_s`;
each decode step of `n` running sequences takes `step(n)`, rising from `step(1)` to
`step(C_ref)`; a request needs `ℓ · j` decode steps, with `j ≥ 1` a per-request jitter.

`v100-moe` is the least-squares fit of the model's parameters to every published target at
once (`sim.targets`, `floorguard bench calibration --fit`), with the regimes design §11 names
kept apart rather than averaged: the saturating probe whose batches run in step (μ_sat near
the clean line), sustained desynchronized load (E5's paced cells at ≈ 595 ms), the flood
under the marquee's learner (≈ 460 ms) and light load. Its dispersion is one-sided: a
request's steps are stretched by `1 + min(Exp(jitter_mean), jitter_cap)`, never shortened, so
the batch-1 figure is a floor, and the spread under load comes from the coupling (who joins
the batch, and when). docs/calibration.md has each target's residual; the ones the model
cannot meet (the light-load mean, E4's 4/s cell) are the published figures disagreeing, and
that page says why.

The service ceiling `s_max(ℓ)` scales the full-batch line through the published 660 ms at
ℓ = 16. The lower envelope `L(ℓ)` is the model's exact minimum: batch-1, no jitter, no
other prefills — so the doom gate is sound by construction on this model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from floorguard.core.contract import AffineEnvelope
from floorguard.errors import ConfigError, require

__all__ = [
    "PROFILES",
    "ServiceProfile",
    "get_profile",
    "load_latency_model",
    "load_measured",
    "load_profile",
    "save_profile",
    "tpot_slots",
]


@dataclass(frozen=True, slots=True)
class ServiceProfile:
    name: str
    prefill_s: float
    """Batch stall when a request joins (its prefill)."""
    step_1_s: float
    """One decode step with a single running sequence."""
    step_full_s: float
    """One decode step with `reference_slots` running sequences."""
    ceiling: AffineEnvelope
    """`s_max(ℓ)`: the service ceiling the monitors and the §6 report use."""
    coupling_shape: float = 1.0
    """`r` in `step(n) = step_1 + (step_full − step_1)·(1 − r^(n−1))/(1 − r^(C_ref−1))` for
    `n ≤ C_ref`: 1 is linear in `n`; below 1 most of the slowdown comes with the first extra
    sequences; 0 puts all of it on the second."""
    reference_slots: int = 4
    jitter_mean: float = 0.0
    """Mean of the exponential factor's `e − 1` (`floorguard calibrate`'s one-sided jitter)."""
    jitter_cap: float = 0.0
    """Largest `e − 1`."""
    jitter_sigma: float = 0.0
    """σ of the lognormal factor `g = exp(σ·z)` (median 1): the service dispersion of the
    shipped profiles, fitted to the published spread (docs/design.md §11)."""
    jitter_z: float = 3.0
    """`z` is a standard normal clipped to `[−jitter_z, jitter_z]`, so `g` is bounded and
    `L(ℓ)` stays the model's exact minimum."""
    stall_per_decoding_s: float = 0.0
    """Sustained-load coupling: a joiner's prefill stalls the batch for `prefill_s` plus this
    much per sequence already decoding, counted up to `reference_slots − 1` (docs/design.md §11). A
    batch started together has no running decode to stall, so the clean same-batch line is
    unaffected. Past the reference width no figure is published; the assumption is that a
    joiner's stall grows no further while decode stays memory-bound, so a wider batch
    raises throughput (docs/design.md §11 "Width") instead of lowering it."""
    coupled: bool = True
    """False: deterministic slots, service = `L(ℓ)` exactly, no coupling, no jitter."""
    prefill_per_prompt_token_s: float = 0.0
    """Extra prefill per prompt token. 0 in the shipped profiles: docs/design.md §5 gives no
    prompt-length target to calibrate it against."""
    lower_per_prompt_token_s: float = 0.0
    """What `L(ℓ, p)` may count per prompt token: at most the cheapest prefill seen,
    prefix-cache hits included (`floorguard calibrate`), so a drop stays a proof."""

    def __post_init__(self) -> None:
        for name in (
            "prefill_s",
            "step_1_s",
            "jitter_mean",
            "jitter_cap",
            "jitter_sigma",
            "jitter_z",
            "stall_per_decoding_s",
            "prefill_per_prompt_token_s",
            "lower_per_prompt_token_s",
        ):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, name, value, "must be ≥ 0")
        require(self.step_1_s > 0, "step_1_s", self.step_1_s, "a decode step must take some time")
        require(
            self.step_full_s >= self.step_1_s,
            "step_full_s",
            self.step_full_s,
            "must be ≥ step_1_s (a fuller batch is never faster per step)",
        )
        require(
            0 <= self.coupling_shape <= 1,
            "coupling_shape",
            self.coupling_shape,
            "must be in [0, 1]",
        )
        require(self.reference_slots >= 2, "reference_slots", self.reference_slots, "must be ≥ 2")

    @property
    def fastest_factor(self) -> float:
        """The smallest per-request step multiplier `j = g·e` the model draws."""
        return math.exp(-self.jitter_sigma * self.jitter_z)

    @property
    def lower(self) -> AffineEnvelope:
        """`L(ℓ)`: the model's minimum service (batch of one, the fastest jitter draw, no
        other prefill)."""
        return AffineEnvelope(
            self.prefill_s, self.step_1_s * self.fastest_factor, self.lower_per_prompt_token_s
        )

    def step_s(self, num_running: int) -> float:
        """Decode step of `num_running` sequences. Up to `reference_slots` the fitted curve;
        past it (no published figure there) linear at the average slope of 1..C_ref, so
        every further sequence still slows the step."""
        r, k = self.coupling_shape, self.reference_slots - 1
        rise = self.step_full_s - self.step_1_s
        if num_running > self.reference_slots:
            return self.step_full_s + rise / k * (num_running - self.reference_slots)
        grown = (num_running - 1) / k if r == 1 else (1 - r ** (num_running - 1)) / (1 - r**k)
        return self.step_1_s + rise * grown

    def token_ceiling_s(self, width: int) -> float:
        """The longest one decode step of `width` running sequences takes in the model: its
        step at the largest dispersion draw — the per-token envelope a TPOT is kept by
        (docs/design.md §19). A joiner's prefill stall is not in it."""
        largest = math.exp(self.jitter_sigma * self.jitter_z) * (1 + self.jitter_cap)
        return self.step_s(width) * largest

    def widest_for(self, tpot_s: float, slots: int) -> int:
        """The most sequences (≤ `slots`) a backend may run at once with each decode step
        within `tpot_s` (0: not even one)."""
        return max((n for n in range(1, slots + 1) if self.token_ceiling_s(n) <= tpot_s), default=0)

    def scaled(self, name: str, factor: float) -> ServiceProfile:
        """The same shape on hardware `factor` times as slow (every duration scaled)."""
        return replace(
            self,
            name=name,
            prefill_s=self.prefill_s * factor,
            step_1_s=self.step_1_s * factor,
            step_full_s=self.step_full_s * factor,
            stall_per_decoding_s=self.stall_per_decoding_s * factor,
            prefill_per_prompt_token_s=self.prefill_per_prompt_token_s * factor,
            lower_per_prompt_token_s=self.lower_per_prompt_token_s * factor,
            ceiling=AffineEnvelope(
                self.ceiling.base_s * factor,
                self.ceiling.per_token_s * factor,
                self.ceiling.per_prompt_token_s * factor,
            ),
        )


V100_MOE = ServiceProfile(
    # From `floorguard bench calibration --fit` (`sim.targets.fit_profile`: least squares
    # over every published target at once, the regimes of docs/design.md §11 apart, one-sided
    # dispersion, 8 seeded starts); residuals in docs/calibration.md.
    name="v100-moe",
    prefill_s=0.04624289265512496,
    step_1_s=0.013334543466268247,
    step_full_s=0.014927430131025834,
    coupling_shape=0.00024521243807992116,
    stall_per_decoding_s=0.011588270140173926,
    jitter_mean=0.14918646277844294,
    jitter_cap=0.002011139359059721,
    # the published ceiling: s_max(16) = 660 ms, scaled along the full-batch line 183 + 14.9·ℓ
    ceiling=AffineEnvelope(0.183 * 0.660 / 0.4214, 0.0149 * 0.660 / 0.4214),
)
ADA_SCALE = 0.3817
"""Ada's one figure: a measured service ≈ 214 ms *at its base sweep's load* (the assured stream
alone paced at B = 20 with C = 4, ρ_eff = 20 × 0.214 / 4 = 1.07; docs/design.md §11), fitted
by `fit_scale` (bisection on the fitted v100 shape's mean service at that load). Its light-load
service is then ≈ 99 ms and its break cells B = 22 and 26 sit at ρ_eff 1.18 and 1.39, as
published; docs/calibration.md. (It was once scaled to a 214 ms *light-load* service, 0.8230,
which put its capacity near 9/s and its break at B = 12.)"""
ADA_FP8 = V100_MOE.scaled("ada-fp8", ADA_SCALE)
DETERMINISTIC = replace(
    V100_MOE,
    name="deterministic",
    coupled=False,
    jitter_mean=0.0,
    jitter_cap=0.0,
    stall_per_decoding_s=0.0,
)

PROFILES: dict[str, ServiceProfile] = {p.name: p for p in (V100_MOE, ADA_FP8, DETERMINISTIC)}


def get_profile(name: str) -> ServiceProfile:
    """A shipped profile by name, or a profile file (`floorguard calibrate --out`) by path."""
    profile = PROFILES.get(name)
    if profile is not None:
        return profile
    if name.endswith((".yaml", ".yml")):
        return load_profile(Path(name))
    raise ConfigError("profile", name, f"must be one of {sorted(PROFILES)} or a profile .yaml file")


_FIELDS = (
    "name",
    "prefill_s",
    "step_1_s",
    "step_full_s",
    "coupling_shape",
    "reference_slots",
    "jitter_mean",
    "jitter_cap",
    "prefill_per_prompt_token_s",
)
_OPTIONAL = {
    "lower_per_prompt_token_s": 0.0,
    "jitter_sigma": 0.0,
    "jitter_z": 3.0,
    "stall_per_decoding_s": 0.0,
}
"""Fields added later: an older profile file without them loads with these values."""


def save_profile(
    profile: ServiceProfile,
    path: Path,
    *,
    measured: Mapping[str, Any] | None = None,
    latency_model: Mapping[str, Any] | None = None,
) -> None:
    """Write a profile as YAML; `measured` (probe results, residuals, provenance) is kept
    beside it for the reader and ignored when loading; `latency_model` is the latency
    predictor fitted for it at calibrate time (`load_latency_model`)."""
    data: dict[str, Any] = {name: getattr(profile, name) for name in (*_FIELDS, *_OPTIONAL)}
    data["ceiling"] = {
        "base_s": profile.ceiling.base_s,
        "per_token_s": profile.ceiling.per_token_s,
        "per_prompt_token_s": profile.ceiling.per_prompt_token_s,
    }
    if measured:
        data["measured"] = dict(measured)
    if latency_model:
        data["latency_model"] = dict(latency_model)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def load_latency_model(path: Path) -> dict[str, Any] | None:
    """The `latency_model` section `save_profile` kept with a profile (None when none)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError("profile", str(path), f"cannot be read as YAML ({exc})") from exc
    model = data.get("latency_model") if isinstance(data, dict) else None
    return dict(model) if isinstance(model, dict) else None


def load_measured(path: Path) -> dict[str, Any]:
    """The `measured` section `save_profile` kept beside a profile (empty when none)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError("profile", str(path), f"cannot be read as YAML ({exc})") from exc
    measured = data.get("measured") if isinstance(data, dict) else None
    return dict(measured) if isinstance(measured, dict) else {}


def load_profile(path: Path) -> ServiceProfile:
    """A profile written by `save_profile`; a bad file is a ConfigError naming the key."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError("profile", str(path), f"cannot be read as YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError("profile", str(path), "must be a YAML mapping")
    missing = [name for name in (*_FIELDS, "ceiling") if name not in data]
    if missing:
        raise ConfigError("profile", str(path), f"misses {missing}")
    try:
        bound = data["ceiling"]
        ceiling = AffineEnvelope(
            float(bound["base_s"]),
            float(bound["per_token_s"]),
            float(bound.get("per_prompt_token_s", 0.0)),
        )
        optional = {name: data.get(name, default) for name, default in _OPTIONAL.items()}
        return ServiceProfile(**{name: data[name] for name in _FIELDS}, **optional, ceiling=ceiling)
    except (TypeError, KeyError, ValueError) as exc:
        raise ConfigError("profile", str(path), f"is not a service profile ({exc})") from exc


def tpot_slots(
    profile: ServiceProfile | None, slots: Sequence[int], tpots: Iterable[float | None]
) -> tuple[int, ...]:
    """Each backend's slots, capped so that the tightest TPOT among `tpots` holds at the
    width the guard dispatches onto it (`widest_for`, at least 1: a TPOT even one sequence
    cannot keep is the start-up report's warning, not a backend with no slot); unchanged
    without a TPOT or a profile (docs/design.md §19)."""
    tightest = min((t for t in tpots if t is not None), default=None)
    if tightest is None or profile is None:
        return tuple(slots)
    return tuple(min(c, max(profile.widest_for(tightest, c), 1)) if c else 0 for c in slots)
