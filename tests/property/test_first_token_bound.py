"""The first-token bound of docs/design.md §19, attacked: whatever the floor's and the flood's
arrivals, and whatever each service (within its ceiling), a floor-entitled request starts
within `⌈B/r⌉·s_max(ℓ_A)` of its arrival while the floor's backlog stays within `B`, and
`verify` finds no TTFT violation in the log."""

from __future__ import annotations

import heapq
import math

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from floorguard.analysis.checker import check_trace
from floorguard.core.contract import (
    AffineEnvelope,
    Contract,
    ContractClass,
    GuardConfig,
    WindowSchedule,
)
from floorguard.core.guard import Dispatch, Guard
from floorguard.core.monitors import first_token_report
from floorguard.core.request import Request
from floorguard.learners.adversaries import AlwaysAdmit

CEILING = AffineEnvelope(0.05, 0.01)
FLOOR_TOKENS = 16
S_MAX = CEILING.at(FLOOR_TOKENS)

arrivals = st.lists(
    st.tuples(
        st.one_of(st.just(0.0), st.floats(0, 0.4)),  # gap
        st.sampled_from(["chat", "bulk", "bulk", "bulk"]),
        st.integers(1, 300),  # a surplus request's ℓ (the floor's is 16)
        st.floats(0.05, 0.999),  # its service, as a share of its ceiling
    ),
    min_size=10,
    max_size=120,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    slots=st.integers(2, 5),
    reserved_share=st.floats(0, 1),
    floor=st.integers(1, 4),
    ops=arrivals,
)
def test_the_floor_starts_within_its_bound_whatever_the_surplus_runs(
    slots, reserved_share, floor, ops
):
    reserved = 1 + int(reserved_share * (slots - 2))
    bound_s = math.ceil(floor / reserved) * S_MAX
    config = GuardConfig(
        contracts=(
            Contract(
                "chat",
                ContractClass.ASSURED,
                None,
                floor,
                ttft_budget_s=bound_s + CEILING.at(1) + 1e-6,
                tpot_budget_s=0.05,
            ),
            Contract("bulk", ContractClass.OPPORTUNISTIC, 30.0),
        ),
        schedule=WindowSchedule(1.0),
        slots=(slots,),
        upper_envelope=CEILING,
        reserved_slots=reserved,
    )
    region = first_token_report(config, num_output_tokens=FLOOR_TOKENS)
    assert region is not None and region.inside, region
    events: list = []
    guard = Guard(config, learner=AlwaysAdmit(), sink=events.append)
    ends: list[tuple[float, int]] = []
    service_share: dict[int, float] = {}
    arrived: dict[int, float] = {}
    started: dict[int, float] = {}

    def poll(now):
        for d in guard.poll(now):
            if isinstance(d, Dispatch):
                rid = d.request.request_id
                started[rid] = now
                guard.on_first_token(rid, now)
                ceiling = CEILING.at(d.request.num_output_tokens)
                heapq.heappush(ends, (now + service_share[rid] * ceiling, rid))

    def end_until(t):
        while ends and ends[0][0] <= t:
            at, rid = heapq.heappop(ends)
            guard.finish(rid, at, "complete")
            poll(at)

    now = 0.0
    for rid, (gap, tenant, tokens, share) in enumerate(ops):
        now += gap
        end_until(now)
        service_share[rid] = share
        request = Request(rid, tenant, now, FLOOR_TOKENS if tenant == "chat" else tokens, 0)
        if guard.on_arrival(request, now).entitled:
            arrived[rid] = now
        poll(now)
    end_until(math.inf)
    assert guard.num_in_flight == 0 and guard.num_queued == 0

    note(f"r = {reserved} of C = {slots}, B = {floor}: bound {bound_s * 1e3:.0f} ms")
    if guard.backlog.max_backlog <= floor:  # §19's backlog precondition, as in §6
        waits = [started[rid] - at for rid, at in arrived.items()]
        assert max(waits, default=0.0) <= bound_s + 1e-9
    report = check_trace(events)
    assert report.ok(), report.violations[:3]
    assert not [v for v in report.violations if v.prop == "TTFT"]
