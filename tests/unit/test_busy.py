"""The early `busy` refusal (design §17, `QueueLimits.refuse_busy`): a surplus arrival that the
doom gate's envelope proves cannot start before it is doomed is refused at once — and
only then: at the proof's boundary one request more or less flips it, what another tenant
queued does not count under the fair surplus, and on the simulator every request it
refused would have been dropped as doomed had it waited (the rest of the run unchanged)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from floorguard.analysis.records import fold_trace
from floorguard.core.contract import (
    AffineEnvelope,
    Contract,
    ContractClass,
    QueueLimits,
    SurplusOrder,
)
from floorguard.core.guard import RejectReason
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import marquee
from floorguard.sim.workloads import FixedLength, PacedArrivals, SyntheticStream
from tests.helpers import make_config, make_guard, make_request

L = AffineEnvelope(0.2, 0.0)
"""Every request holds its slot at least 0.2 s; with d = 1 s each is doomed 0.8 s after it
arrives. One slot busy from t = 0 can make 1 + ⌊(0.8 − 0.2) / 0.2⌋ = 4 starts by then."""


def _guard(*, surplus: SurplusOrder = SurplusOrder.FAIR, refuse_busy: bool = True):
    config = make_config(floor=50, slots=(1,), deadline_s=1.0, lower=L)
    polite = Contract("p02", ContractClass.OPPORTUNISTIC, 1.0)
    config = replace(
        config,
        contracts=(*config.contracts, polite),
        surplus=surplus,
        queue_limits=QueueLimits(refuse_busy=refuse_busy),
    )
    guard = make_guard(config)
    guard.on_arrival(make_request(), 0.0)  # entitled, and running from t = 0
    assert len(guard.poll(0.0)) == 1
    return guard


@pytest.mark.parametrize(("ahead", "busy"), [(3, False), (4, True)])
def test_busy_exactly_when_the_slots_cannot_start_it_before_it_is_doomed(ahead, busy):
    """Three entitled requests ahead leave the fourth start by t = 0.8 s to a surplus
    arrival; four take all four. The refusal says when a slot can first free."""
    guard = _guard()
    for _ in range(ahead):
        assert guard.on_arrival(make_request(), 0.0).entitled
    admission = guard.on_arrival(make_request(assured=False), 0.0)
    assert admission.admitted is not busy
    if busy:
        assert (admission.reason, admission.retry_at) == (RejectReason.BUSY, 0.2)


def test_off_it_queues_the_same_arrival_to_be_dropped_at_its_doom():
    guard = _guard(refuse_busy=False)
    for _ in range(4):
        guard.on_arrival(make_request(), 0.0)
    assert guard.on_arrival(make_request(assured=False), 0.0).admitted


def test_a_tenants_own_backlog_counts_only_while_it_outlives_the_arrival():
    """Four of its own requests from the same instant are ahead until the same doom
    instant: the fifth is busy. One arriving 10 ms later outlives them all (they are doomed
    before it is, and no longer wait), so nothing is proven: it is queued."""
    guard = _guard()
    for _ in range(4):
        assert guard.on_arrival(make_request(assured=False), 0.0).admitted
    assert guard.on_arrival(make_request(assured=False), 0.0).reason is RejectReason.BUSY
    assert guard.on_arrival(make_request(assured=False, at=0.01), 0.01).admitted


@pytest.mark.parametrize(
    ("surplus", "busy"), [(SurplusOrder.FAIR, False), (SurplusOrder.LEARNER, True)]
)
def test_another_tenants_surplus_is_ahead_only_in_the_learners_single_order(surplus, busy):
    """Under the fair surplus a polite tenant's turn may come before a flooder's queued
    requests, so they prove nothing against it; in the published single order they are
    ahead of it."""
    guard = _guard(surplus=surplus)
    for _ in range(4):
        assert guard.on_arrival(make_request(assured=False, tenant="a10"), 0.0).admitted
    polite = guard.on_arrival(make_request(tenant="p02"), 0.0)
    assert polite.admitted is not busy
    assert (polite.reason is RejectReason.BUSY) is busy


def test_a_request_doomed_on_arrival_is_left_to_the_gate():
    """Too long for its deadline from the start: not `busy` (a retry cannot help); the gate
    drops it at its first poll and says what would have fit."""
    config = replace(
        make_config(floor=50, slots=(1,), deadline_s=1.0, lower=AffineEnvelope(0.0, 0.1)),
        queue_limits=QueueLimits(refuse_busy=True),
    )
    guard = make_guard(config)
    assert guard.on_arrival(make_request(assured=False, tokens=11), 0.0).admitted
    (drop,) = guard.poll(0.0)
    assert drop.reason == "doomed"


def _burst(refuse_busy: bool):
    """The marquee on one backend of C = 2, its opportunistic tenant sending 40 requests at
    one instant every 2 s, with the profile's exact lower envelope (so the proof's premise
    holds on the simulator's backend) and the published single surplus order."""
    scenario = marquee(duration_s=8.0)
    burst = tuple(
        SyntheticStream("a10", PacedArrivals(0.5), FixedLength(16), 8.0, start_s=0.25)
        for _ in range(40)
    )
    return replace(
        scenario,
        streams=(scenario.streams[0], *burst),
        slots=(2,),
        surplus=SurplusOrder.LEARNER,
        queue_limits=QueueLimits(refuse_busy=refuse_busy),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_the_simulator_every_busy_refusal_would_have_been_a_doomed_drop(seed):
    """The same seeded run with and without the refusal: each request refused `busy` is
    one the other run dropped as doomed, and every other request ends the same way at the
    same instant — the refusal only answers earlier what the gate would have decided."""
    runs = {on: simulate_once(_burst(on), seed=seed) for on in (True, False)}
    records = {
        on: {r.request_id: r for r in fold_trace(run.events).records} for on, run in runs.items()
    }
    busy = {rid for rid, r in records[True].items() if r.reason == "busy"}
    assert len(busy) > 50  # the bursts are deeper than the slots could start
    for rid, off in records[False].items():
        on = records[True][rid]
        if rid in busy:
            assert (off.outcome, off.reason) == ("dropped", "doomed")
            assert on.ended_at == on.arrival_at  # refused on arrival
        else:
            assert (on.outcome, on.reason, on.ended_at) == (off.outcome, off.reason, off.ended_at)
