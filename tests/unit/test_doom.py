from __future__ import annotations

from floorguard.core.contract import AffineEnvelope
from floorguard.core.doom import DoomGate, DoomVerdict

L = AffineEnvelope(0.05, 0.01)  # L(16) = 0.21 s
U = AffineEnvelope(0.2, 0.03)  # U(16) = 0.68 s


def test_drops_iff_now_plus_lower_bound_exceeds_deadline():
    """DR: t + L(ℓ) > D drops; t + L(ℓ) = D is still feasible and dispatched."""
    gate = DoomGate(L)
    assert gate.check(deadline_at=1.0, num_output_tokens=16, now=0.80) is DoomVerdict.DROP
    assert gate.check(deadline_at=1.0, num_output_tokens=16, now=0.79) is DoomVerdict.DISPATCH
    assert gate.check(deadline_at=1.0, num_output_tokens=0, now=0.95) is DoomVerdict.DISPATCH


def test_three_state_gate_dispatches_uncertain():
    """With U: surely on time, uncertain (dispatched), or doomed (dropped)."""
    gate = DoomGate(L, U)
    assert gate.check(1.0, 16, now=0.30) is DoomVerdict.DISPATCH
    assert gate.check(1.0, 16, now=0.50) is DoomVerdict.UNCERTAIN
    assert gate.check(1.0, 16, now=0.85) is DoomVerdict.DROP


def test_no_lower_envelope_never_drops():
    """Without L there is no evidence of doom, so nothing is dropped."""
    assert DoomGate(None).check(0.0, 16, now=100.0) is DoomVerdict.DISPATCH
