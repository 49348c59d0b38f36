"""SPEC §5's published targets against the simulated profiles (measured through the full
guard, from the trace). The fitted targets (batch-1 median, full-batch line, light load)
and the predicted ones (flood mean, μ_sat, the ceiling) are all held to ±10 %."""

from __future__ import annotations

import pytest

from floorguard.calibrate import _fit_prompt
from floorguard.profiles import ADA_FP8, DETERMINISTIC, V100_MOE
from floorguard.sim.targets import measure_profile


@pytest.fixture(scope="module")
def v100():
    return measure_profile(V100_MOE)


def within(measured: float, target: float, tolerance: float = 0.10) -> bool:
    return abs(measured - target) <= tolerance * target


def test_v100_batch1_median_at_16_tokens(v100):
    """Batch-1 median service at ℓ = 16 ≈ 236 ms."""
    assert within(v100.batch1_median_ms, 236)


def test_v100_light_load_and_flood_service(v100):
    """Light load ≈ 386 ms; under the opportunistic flood ≈ 460 ms (both ℓ = 16)."""
    assert within(v100.light_mean_ms, 386)
    assert within(v100.flood_mean_ms, 460)
    assert v100.light_mean_ms < v100.flood_mean_ms


def test_v100_sustained_capacity(v100):
    """μ_sat ≈ 9.6–9.7 requests/s at C = 4, ℓ = 16."""
    assert within(v100.mu_sat_per_s, 9.65)


@pytest.mark.parametrize("tokens", [64, 128, 256])
def test_v100_full_batch_line(v100, tokens):
    """At full batch, service ≈ 183 + 14.9·ℓ ms."""
    assert within(v100.full_batch_ms[tokens], 183 + 14.9 * tokens)


def test_v100_ceiling_never_exceeded(v100):
    """Over ~3,000 flood requests the max stays under s_max = 660 ms (published: ≈ 600)."""
    assert v100.flood_num_completed >= 3000
    assert v100.ceiling_ms == pytest.approx(660)
    assert v100.flood_max_ms <= v100.ceiling_ms


def test_ada_light_load():
    """The Ada FP8 profile gives ≈ 214 ms at ℓ = 16, light load."""
    ada = measure_profile(ADA_FP8, num_flood_reps=4)
    assert within(ada.light_mean_ms, 214)
    assert ada.flood_max_ms <= ada.ceiling_ms


def test_deterministic_profile_service_is_its_lower_envelope():
    """Deterministic slots: service is exactly L(ℓ), so the batch-1 median and the light-load
    mean coincide."""
    det = measure_profile(DETERMINISTIC, num_flood_reps=2)
    assert det.batch1_median_ms == pytest.approx(DETERMINISTIC.lower.at(16) * 1e3)
    assert det.light_mean_ms == pytest.approx(det.batch1_median_ms)


def test_the_prompt_slope_keeps_L_below_every_prompt_sample():
    """The model's prefill slope is the least-squares one over the first sends; L's is the
    smallest any send shows — a prefix-cache repeat included — and the intercept gives back
    what the short probe prompt paid, so `L(1, p) ≤ s` for every sample."""
    first = [(64, 0.060), (256, 0.090), (1024, 0.300)]
    repeats = [(64, 0.052), (256, 0.055), (1024, 0.070)]  # served from the prefix cache
    prefill_s, model, lower = _fit_prompt(first, repeats, 0.040, 0.010, base_tokens=4)
    assert lower == pytest.approx(min((s - 0.050) / p for p, s in [*first, *repeats]))
    assert model > lower  # the uncached prefill costs more than a cache hit
    assert all(prefill_s + 0.010 + lower * p <= s + 1e-12 for p, s in [*first, *repeats])
    assert _fit_prompt([], [], 0.04, 0.01, base_tokens=4) == (0.04, 0.0, 0.0)
