from __future__ import annotations

import pytest

from floorguard.analysis.metrics import entitled_ids, max_assured_backlog, measure
from floorguard.analysis.records import fold_trace
from floorguard.core.contract import AffineEnvelope
from tests.helpers import make_config, make_guard, make_request


def scripted_trace():
    """B = 2, C = 1, d = 1 s. Window 0: three assured (the third rejected) and one
    opportunistic; each served in 0.3 s, in order."""
    events = []
    guard = make_guard(
        make_config(floor=2, slots=(1,), deadline_s=1.0, lower=AffineEnvelope(0.0, 0.0)),
        events=events,
    )
    arrivals = [(0, True, 0.0), (1, True, 0.1), (2, True, 0.2), (3, False, 0.3)]
    for rid, assured, at in arrivals:
        guard.on_arrival(make_request(request_id=rid, assured=assured, at=at), at)
        guard.poll(at)
    # 0 runs 0.0–0.3, 1 runs 0.3–0.6, 3 runs 0.6–1.5 (late: due 1.3)
    for rid, at in [(0, 0.3), (1, 0.6), (3, 1.5)]:
        guard.finish(rid, at, "complete")
        guard.poll(at)
    return fold_trace(events)


def test_counts_miss_and_unmet_per_class():
    """miss = late/admitted; unmet = (rejected + dropped + late)/offered."""
    m = measure(scripted_trace())
    a, o = m.assured, m.opportunistic
    assert (a.offered, a.admitted, a.rejected, a.late, a.miss, a.unmet) == (
        3,
        2,
        1,
        0,
        0.0,
        pytest.approx(1 / 3),
    )
    assert (o.offered, o.admitted, o.late, o.miss, o.unmet) == (1, 1, 1, 1.0, 1.0)


def test_attainment_and_backlog():
    """Both entitled requests were admitted and on time; Q_A never exceeded 1 (request 1
    waited alone while request 0 ran)."""
    trace = scripted_trace()
    m = measure(trace)
    assert (m.attainment, m.num_entitled) == (1.0, 2)
    assert max_assured_backlog(trace.records) == 1
    assert m.max_assured_backlog == 1


def test_phase_sweep_reveals_window_origin_sensitivity():
    """Shifting the contract windows by φ = 0.15 s makes request 2 entitled in a window of its
    own, which the guard (windows at φ = 0) never gave it: attainment there is 2/3."""
    trace = scripted_trace()
    assert entitled_ids(trace, 0.15) == {0, 1, 2}  # windows [-0.85, 0.15) and [0.15, 1.15)
    assert entitled_ids(trace, 0.5) == {0, 1}
    m = measure(trace, num_phases=20)
    assert m.attainment_worst_phase == pytest.approx(2 / 3)
    assert m.worst_phase_s == pytest.approx(0.05)
    assert m.attainment_worst_phase <= m.attainment


def test_rho_eff_goodput_and_fire_statistics():
    """ρ_eff = admitted/span × mean service / C; goodput = on-time completions / span."""
    m = measure(scripted_trace())
    mean_service = (0.3 + 0.3 + 0.9) / 3
    assert m.span_s == pytest.approx(0.3)
    assert m.rho_eff == pytest.approx(3 / 0.3 * mean_service / 1)
    assert m.goodput_per_s == pytest.approx(2 / 0.3)
    assert m.fire_cv == pytest.approx(0.0, abs=1e-9)
    assert m.max_fire_lag_s == 0.0


def test_zero_denominators_are_none():
    """A class with nothing offered has miss and unmet None, not a division error."""
    events = []
    make_guard(events=events)
    m = measure(fold_trace(events))
    assert m.assured.miss is None and m.assured.unmet is None and m.attainment is None
