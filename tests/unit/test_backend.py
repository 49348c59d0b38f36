from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from floorguard.profiles import ADA_FP8, DETERMINISTIC, V100_MOE
from floorguard.sim.backend import BatchingBackend, FixedServiceBackend
from floorguard.sim.targets import saturated_capacity
from tests.helpers import make_request

QUIET = replace(V100_MOE, jitter_mean=0.0, jitter_cap=0.0, stall_per_decoding_s=0.0)


def run_alone(backend, tokens):
    backend.join(make_request(tokens=tokens, request_id=1), 0.0)
    at = backend.next_completion_at()
    assert backend.complete_due(at) == [1]
    return at


def test_batch_of_one_takes_exactly_the_lower_envelope():
    """Alone and without jitter, service is prefill + ℓ·step(1) = L(ℓ)."""
    for tokens in (1, 16, 256):
        backend = BatchingBackend(QUIET, 4, np.random.default_rng(0))
        assert run_alone(backend, tokens) == pytest.approx(QUIET.lower.at(tokens))


def test_service_couples_to_load():
    """Four sequences started together each take longer than one alone: every prefill
    stalls the batch, and each step of four is slower."""
    backend = BatchingBackend(QUIET, 4, np.random.default_rng(0))
    for i in range(4):
        backend.join(make_request(tokens=16, request_id=i), 0.0)
    at = backend.next_completion_at()
    assert sorted(backend.complete_due(at)) == [0, 1, 2, 3]
    assert at == pytest.approx(4 * QUIET.prefill_s + 16 * QUIET.step_s(4))
    assert at > QUIET.lower.at(16) * 1.4


def test_join_beyond_capacity_is_refused():
    """The backend model enforces C, so an over-dispatching driver fails loudly."""
    backend = BatchingBackend(QUIET, 1, np.random.default_rng(0))
    backend.join(make_request(request_id=1), 0.0)
    with pytest.raises(RuntimeError, match="over-dispatched"):
        backend.join(make_request(request_id=2), 0.0)


def test_a_late_joiner_slows_running_sequences_by_its_prefill():
    """A join mid-flight stalls the batch for one prefill; the earlier request finishes later
    than alone by the prefill plus the slower shared steps."""
    backend = BatchingBackend(QUIET, 4, np.random.default_rng(0))
    backend.join(make_request(tokens=16, request_id=1), 0.0)
    backend.join(make_request(tokens=16, request_id=2), 0.1)
    first = backend.next_completion_at()
    assert backend.complete_due(first) == [1]
    assert first > QUIET.lower.at(16) + QUIET.prefill_s


def test_cost_grows_with_requests_not_tokens():
    """Membership-change stepping: the number of completion events does not depend on ℓ."""

    def events(tokens):
        backend = BatchingBackend(QUIET, 4, np.random.default_rng(0))
        count = 0
        for i in range(4):
            backend.join(make_request(tokens=tokens * (i + 1), request_id=i), 0.0)
        while (at := backend.next_completion_at()) is not None:
            backend.complete_due(at)
            count += 1
        return count

    assert events(4) == events(4000) == 4


def test_lognormal_jitter_is_bounded_both_ways():
    """j = exp(σ·z), z clipped at ±jitter_z (a profile may still have one; the shipped
    ones are one-sided): alone, service stays within [L(ℓ), prefill + ℓ·step(1)·exp(σ·z_max)]."""
    rng = np.random.default_rng(1)
    profile = replace(QUIET, jitter_sigma=0.25, jitter_z=1.0)
    top = profile.prefill_s + 16 * profile.step_1_s / profile.fastest_factor
    for _ in range(200):
        at = run_alone(BatchingBackend(profile, 4, rng), 16)
        assert profile.lower.at(16) - 1e-12 <= at <= top + 1e-12


def test_calibrate_one_sided_jitter_only_lengthens_service():
    """A calibrated profile's exponential jitter: j ∈ [1, 1 + cap]."""
    profile = replace(QUIET, jitter_mean=0.03, jitter_cap=0.25)
    rng = np.random.default_rng(1)
    for _ in range(200):
        at = run_alone(BatchingBackend(profile, 4, rng), 16)
        assert profile.lower.at(16) - 1e-12 <= at
        assert at <= profile.prefill_s + 16 * profile.step_1_s * 1.25 + 1e-12


def test_deterministic_slots_ignore_load():
    """Deterministic mode: service is L(ℓ) whatever else runs."""
    backend = FixedServiceBackend(DETERMINISTIC, 4)
    for i in range(4):
        backend.join(make_request(tokens=16, request_id=i), 0.0)
    assert backend.next_completion_at() == pytest.approx(DETERMINISTIC.lower.at(16))


def test_step_time_never_falls_and_keeps_growing_past_the_reference_width():
    """step(n) is non-decreasing in n and still grows beyond C_ref = 4 (E18 uses 6 and 8)."""
    steps = [V100_MOE.step_s(n) for n in range(1, 17)]
    assert steps == sorted(steps)
    assert V100_MOE.step_s(1) == pytest.approx(V100_MOE.step_1_s)
    assert V100_MOE.step_s(4) == pytest.approx(V100_MOE.step_full_s)
    assert V100_MOE.step_s(8) > V100_MOE.step_s(6) > V100_MOE.step_s(4)
    linear = replace(V100_MOE, coupling_shape=1.0)
    assert linear.step_s(2) - linear.step_s(1) == pytest.approx(linear.step_s(8) - linear.step_s(7))


@pytest.mark.parametrize("profile", [V100_MOE, ADA_FP8], ids=lambda p: p.name)
def test_a_wider_batch_never_lowers_throughput(profile):
    """docs/design.md §11 "Width": decode is memory-bound, so more slots raise the saturated
    completion rate (C = 1 … 12), though each request's service grows."""
    measured = [saturated_capacity(profile, 16, c) for c in (1, 2, 3, 4, 6, 8, 12)]
    rates = [rate for rate, _ in measured]
    services = [service for _, service in measured]
    assert rates == sorted(rates) and rates[-1] > 1.2 * rates[3]
    assert services == sorted(services)


@pytest.mark.parametrize(
    "backend",
    [BatchingBackend(V100_MOE, 4, np.random.default_rng(3)), FixedServiceBackend(DETERMINISTIC, 4)],
    ids=["batching", "fixed"],
)
def test_tokens_out_rises_from_none_at_first_token_to_all_at_completion(backend):
    """What a stream can send: at most 1 when the first token is due, never decreasing,
    never more than ℓ, and all ℓ at completion — also while another request joins."""
    first_at = backend.join(make_request(tokens=32, request_id=1), 0.0)
    assert backend.tokens_out(1, first_at) <= 1
    seen, now = [], first_at
    while True:
        at = backend.next_completion_at()
        if at <= now:
            produced = backend.tokens_out(1, at)
            if backend.complete_due(at) == [1]:
                assert produced == 32
                break
            continue  # request 2 finished
        seen.append(backend.tokens_out(1, now))
        if len(seen) == 5:
            backend.join(make_request(tokens=4, request_id=2), now)
        now += 0.01
    assert seen == sorted(seen) and seen[-1] < 32
    assert len(seen) > 10 and 0 < seen[len(seen) // 2] < 32  # produced along the way
