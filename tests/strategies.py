"""Hypothesis strategies: guard configurations, adversarial learner answers, and driver
operation sequences (docs/design.md §18.11)."""

from __future__ import annotations

from hypothesis import strategies as st

from floorguard.core.contract import (
    AffineEnvelope,
    CapacityAction,
    Contract,
    ContractClass,
    DispatchOrder,
    ExcessPolicy,
    GuardConfig,
    MeterKind,
    WindowSchedule,
)
from floorguard.core.learner import Proposal

TENANTS = ("a95", "b95", "a10", "mallory")  # two assured, one opportunistic, one unknown


@st.composite
def configs(draw) -> GuardConfig:
    meter = draw(st.sampled_from(MeterKind))
    floor_range = st.integers(1, 4) if meter is MeterKind.COUNT else st.integers(10, 120)
    lower = draw(
        st.one_of(st.none(), st.builds(AffineEnvelope, st.floats(0, 0.2), st.floats(0, 0.01)))
    )
    slots = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    kv = st.one_of(st.none(), st.integers(16, 160))  # requests reserve 16-96 tokens
    kv_tokens = draw(st.one_of(st.just(()), st.tuples(*(kv for _ in slots))))
    dispatch = draw(st.sampled_from(DispatchOrder))
    reserved = (
        draw(st.integers(0, sum(slots) - 1)) if dispatch is DispatchOrder.ASSURED_FIRST else 0
    )
    upper = draw(
        st.one_of(st.none(), st.builds(AffineEnvelope, st.floats(0.01, 0.3), st.floats(0, 0.01)))
    )
    a_deadline = draw(st.floats(0.1, 2.0))
    return GuardConfig(
        contracts=(
            Contract(
                "a95",
                ContractClass.ASSURED,
                a_deadline,
                draw(floor_range),
                draw(st.sampled_from(ExcessPolicy)),
                ttft_budget_s=draw(st.one_of(st.none(), st.floats(0.05, a_deadline))),
            ),
            Contract(  # sometimes in first-token terms only: due at ttft + tpot·ℓ
                "b95",
                ContractClass.ASSURED,
                draw(st.one_of(st.none(), st.floats(0.5, 2.0))),
                draw(floor_range),
                draw(st.sampled_from(ExcessPolicy)),
                ttft_budget_s=draw(st.floats(0.05, 0.5)),
                tpot_budget_s=draw(st.floats(0.001, 0.05)),
            ),
            Contract("a10", ContractClass.OPPORTUNISTIC, draw(st.floats(0.1, 2.0))),
        ),
        schedule=WindowSchedule(
            draw(st.sampled_from([0.25, 0.5, 1.0])), draw(st.floats(-1.0, 1.0))
        ),
        slots=slots,
        kv_tokens=kv_tokens,
        dispatch=dispatch,
        meter=meter,
        lower_envelope=lower,
        upper_envelope=upper,
        reserved_slots=reserved,
        capacity_action=draw(st.sampled_from(CapacityAction)),
    )


class LearnerFaultError(Exception):
    pass


def _int_admit() -> Proposal:
    """A proposal with an int for `admit`: a compiled core's `Proposal` refuses it as it is
    built (TypeError inside the learner, a fault), a pure one is refused by `consult`."""
    return Proposal(admit=1)  # type: ignore[arg-type]


answers = st.one_of(
    st.builds(
        Proposal, st.booleans(), st.sampled_from([None, *ContractClass]), st.floats(-1e6, 1e6)
    ),
    st.builds(Proposal, st.booleans(), st.none(), st.sampled_from([float("nan"), float("inf")])),
    st.sampled_from([None, "admit", 1, _int_admit, LearnerFaultError("boom")]),
)
"""A learner's answers; a callable one is made inside the learner (`_int_admit`)."""

# Gaps are often zero so that bursts queue up behind the C slots and both classes wait.
gaps = st.one_of(st.just(0.0), st.floats(0, 0.3))
arrival = st.tuples(
    st.just("arrive"), gaps, st.sampled_from(TENANTS), st.integers(1, 64), st.integers(0, 16)
)
other = st.tuples(
    st.sampled_from(["complete", "complete", "fail", "abort", "abort_queued"]),
    gaps,
    st.integers(0, 10**6),
)
operations = st.lists(st.one_of(arrival, arrival, other), min_size=20, max_size=150)
expire = st.tuples(st.just("expire"), gaps, st.just(0))
"""The wall-clock driver's doom timer firing (`Guard.expire`)."""
operations_with_expire = st.lists(
    st.one_of(arrival, arrival, other, expire), min_size=20, max_size=150
)
