from __future__ import annotations

import math

import pytest

from floorguard.core.contract import AffineEnvelope, WindowSchedule
from floorguard.core.monitors import (
    BacklogMonitor,
    CapacityMonitor,
    EnvelopeMonitor,
    assumption_report,
)
from tests.helpers import make_config


def test_envelope_monitor_counts_both_sides():
    """Services above s_max(ℓ) and below L(ℓ) are counted; the max ratio is kept."""
    m = EnvelopeMonitor(AffineEnvelope(0.1, 0.0), AffineEnvelope(0.5, 0.0))
    for s in (0.05, 0.3, 0.6):
        m.observe(16, s)
    assert (m.num_observed, m.num_below_lower, m.num_above_upper) == (3, 1, 1)
    assert m.max_service_s == 0.6 and m.max_upper_ratio == pytest.approx(1.2)


def test_backlog_monitor_tracks_peak_and_overflows_past_B():
    """Q_A rises and falls; rises above B are counted."""
    m = BacklogMonitor(total_floor=2)
    for _ in range(3):
        m.on_enqueue()
    m.on_dequeue()
    assert (m.backlog, m.max_backlog, m.num_over_floor) == (2, 3, 1)


def test_capacity_monitor_estimates_busy_windows_and_alarms_below_floor():
    """Only busy windows feed μ̂; a busy window with μ̂·W < B raises an alarm."""
    m = CapacityMonitor(WindowSchedule(1.0), total_floor=5)
    for t in (0.1, 0.2, 0.3):  # window 0: 3 completions, work queued
        m.on_complete(t, num_queued=1)
    for t in (1.1, 1.2):  # window 1: idle (nothing queued): ignored
        m.on_complete(t, num_queued=0)
    m.on_complete(2.5, num_queued=0)  # closes window 1
    assert m.estimate_per_s == 3.0 and m.num_alarms == 1


def test_assumption_report_follows_spec_section_6():
    """ρ_a = B·s_max/(C·W) and bound = s_max·(1 + ⌈B/C⌉); every failing assumption named."""
    config = make_config(
        floor=6, slots=(4,), deadline_s=1.82, upper=AffineEnvelope(0.0, 0.660 / 16)
    )
    report = assumption_report(config, num_output_tokens=16)
    assert report.rho_a == pytest.approx(6 * 0.66 / 4)
    assert report.bound_s == pytest.approx(0.66 * (1 + math.ceil(6 / 4)))
    assert not report.inside  # the marquee: ρ_a = 0.99 holds, d = 1.82 s < 1.98 s does not
    assert [r.split()[0] for r in report.reasons] == ["deadline:"]
    heavier = assumption_report(
        make_config(floor=8, slots=(4,), deadline_s=5.0, upper=AffineEnvelope(0.66, 0.0)),
        num_output_tokens=16,
    )
    assert [r.split()[0] for r in heavier.reasons] == ["A4"]


def test_assumption_report_inside_region():
    """A light floor with a loose deadline and a clean history is inside the region."""
    config = make_config(floor=2, slots=(4,), deadline_s=2.0, upper=AffineEnvelope(0.5, 0.0))
    report = assumption_report(config, num_output_tokens=16, max_service_s=0.4, max_backlog=2)
    assert report.inside and report.reasons == ()
    outside = assumption_report(config, num_output_tokens=16, num_above_ceiling=2, max_backlog=3)
    assert [r.split()[0] for r in outside.reasons] == ["A3", "backlog:"]


def test_assumption_report_without_ceiling_is_outside():
    """No s_max configured: the bound cannot be evaluated."""
    report = assumption_report(make_config(), num_output_tokens=16)
    assert not report.inside and report.rho_a is None
