"""`floorguard calibrate` against a backend whose service model is known — the emulator,
running v100-moe over real HTTP — recovers that model, writes a profile the simulator and
the guard load, and keeps its lower envelope below every service it saw."""

from __future__ import annotations

import json

import pytest

from floorguard.calibrate import CalibrationError, calibrate
from floorguard.cli import main
from floorguard.learners.latency import LatencyModel
from floorguard.profiles import V100_MOE, get_profile, load_latency_model, load_profile
from floorguard.sim.probe import latency_model_for
from floorguard.sim.targets import saturated_capacity
from tests.integration.live import guard_config


@pytest.fixture(scope="module")
def result(live):
    return calibrate(live.emulator("v100-moe", slots=4), "m", slots=4, reps=2)


def test_calibrating_the_emulator_recovers_its_model(result):
    p = result.profile
    assert p.prefill_s == pytest.approx(V100_MOE.prefill_s, abs=0.015)
    # calibrate's model is one-sided (L is the fastest service seen, jitter only adds), so
    # it recovers the emulator's fastest per-token step: step(1) at the fastest draw
    assert p.step_1_s == pytest.approx(V100_MOE.lower.per_token_s, rel=0.10)
    assert p.step_full_s == pytest.approx(V100_MOE.step_full_s, rel=0.15)
    assert p.coupling_shape <= 0.5  # v100-moe: 0 (all the slowdown on the second sequence)
    mu_sat, _ = saturated_capacity(V100_MOE, 16, 4)
    assert result.mu_sat_per_s == pytest.approx(mu_sat, rel=0.15)
    assert result.residuals["samples_below_L"] == 0  # L(ℓ) is below every service seen
    assert p.ceiling.at(16) >= result.flood_max_s - 1e-9


def test_the_first_token_probe_measures_what_the_emulators_model_does(result):
    """The streamed probe (docs/design.md §19): the time to a first token alone is one
    prefill and grows with the joiners before it; the time per token follows `step(n)` —
    on the emulator, whose model the fitted profile is, within the probe's resolution."""
    rows = result.first_tokens()
    assert sorted(rows) == ["1", "2", "3", "4"]
    for n, row in rows.items():
        assert row["ttft_ms"] == pytest.approx(row["ttft_model_ms"], rel=0.5, abs=15), n
        assert row["tpot_ms"] == pytest.approx(row["tpot_model_ms"], rel=0.25), n
    assert rows["4"]["ttft_ms"] > rows["1"]["ttft_ms"]
    assert result.measured("u", "m")["first_tokens"] == rows


def test_the_profile_file_round_trips_and_everything_loads_it(result, tmp_path, capsys):
    path = tmp_path / "emulated.yaml"
    result.save(path, backend="http://x", model="m", slots=4)
    assert load_profile(path) == result.profile == get_profile(str(path))
    saved = load_latency_model(path)  # the predictor, fitted at calibrate time
    assert saved is not None and saved["slots"] == 4 and saved["r2"] > 0.9
    assert latency_model_for(str(path), 4) == LatencyModel.from_dict(saved)
    assert main(["simulate", "--scenario", "light", "--profile", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["assured"]["completed"] > 0
    config = guard_config("http://127.0.0.1:9", profile=str(path))
    assert config.guard_config().lower_envelope == result.profile.lower


def test_an_unreachable_backend_is_a_clear_error():
    with pytest.raises(CalibrationError, match="cannot be reached"):
        calibrate("http://127.0.0.1:9", "m", slots=2, reps=1, timeout_s=2)
