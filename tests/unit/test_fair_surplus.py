"""The fair surplus (docs/design.md §15): below the floor, dispatch is fair across the
tenants competing for the surplus — a virtual-time fair queue charging the slot time each
request holds — within a tenant in the learner's order, and the floor's
assured-first order untouched."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from floorguard.core.contract import (
    AffineEnvelope,
    Contract,
    ContractClass,
    DispatchOrder,
    SurplusOrder,
)
from floorguard.core.dispatcher import (
    TOKEN_CHARGE,
    AssuredFirstDispatcher,
    FairSurplusDispatcher,
    Ticket,
    create_dispatcher,
    slot_charge,
)
from tests.helpers import make_request

ASSURED = Contract("a95", ContractClass.ASSURED, 1.0, floor=4)


def ticket(seq, tenant, *, entitled=False, tokens=16, rank=1, hint=0.0, prompt=0):
    contract = ASSURED if entitled else Contract(tenant, ContractClass.OPPORTUNISTIC, 1.0)
    request = make_request(tenant=tenant, tokens=tokens, request_id=seq, prompt=prompt)
    return Ticket(request, contract, 1.0, entitled, 0, seq, rank, hint)


def drain(dispatcher, n=None):
    out = []
    while (n is None or len(out) < n) and (t := dispatcher.pop()) is not None:
        out.append(t)
    return out


def test_a_polite_tenant_beside_a_flooder_gets_every_other_start():
    fair = FairSurplusDispatcher()
    for seq in range(100):
        fair.push(ticket(seq, "flood"))
    for seq in range(100, 105):
        fair.push(ticket(seq, "polite"))
    first = [t.request.tenant for t in drain(fair, 10)]
    assert first.count("polite") == 5  # half the surplus while it waits, not after 100
    learner = AssuredFirstDispatcher()
    for seq in range(100):
        learner.push(ticket(seq, "flood"))
    for seq in range(100, 105):
        learner.push(ticket(seq, "polite"))
    assert [t.request.tenant for t in drain(learner, 10)].count("polite") == 0


def test_shares_follow_metered_tokens_and_idleness_banks_nothing():
    fair = FairSurplusDispatcher()
    for seq in range(40):
        fair.push(ticket(seq, "big", tokens=64))
        fair.push(ticket(1000 + seq, "small", tokens=16))
    starts = Counter(t.request.tenant for t in drain(fair, 25))
    assert starts["small"] == 4 * starts["big"]  # equal tokens, not equal requests
    alone = FairSurplusDispatcher()
    for seq in range(60):
        alone.push(ticket(seq, "early"))
    drain(alone, 50)  # "early" ran alone for a while
    for seq in range(100, 110):
        alone.push(ticket(seq, "late"))
    nxt = [t.request.tenant for t in drain(alone, 10)]
    assert nxt.count("late") == 5  # alternating from now on, no debt for "early"


def test_the_floor_goes_first_and_a_failed_start_gets_its_turn_back():
    fair = FairSurplusDispatcher()
    fair.push(ticket(0, "o1"))
    fair.push(ticket(1, "a95", entitled=True))
    fair.push(ticket(2, "o2"))
    assert [t.seq for t in drain(fair)] == [1, 0, 2]
    fair.push(ticket(10, "o1"))
    fair.push(ticket(11, "o2"))
    started = fair.pop()
    fair.push_front(started)  # its backend was unreachable: it goes again, charged once
    assert [t.seq for t in drain(fair)] == [started.seq, 11 if started.seq == 10 else 10]
    assert fair.num_queued == 0


_tickets = st.lists(
    st.tuples(
        st.sampled_from(["a95", "o1", "o2", "o3"]),
        st.integers(0, 1),
        st.floats(-2, 2, allow_nan=False),
        st.integers(1, 64),
        st.booleans(),
    ),
    max_size=60,
)


@given(entries=_tickets)
def test_one_tenant_runs_as_before_and_every_ticket_starts_once_floor_first(entries):
    fair, learner = FairSurplusDispatcher(), AssuredFirstDispatcher()
    only_one = FairSurplusDispatcher()
    for seq, (tenant, rank, hint, tokens, cancel) in enumerate(entries):
        entitled = tenant == "a95"
        made = [ticket(seq, tenant, entitled=entitled, tokens=tokens, rank=rank, hint=hint)
                for _ in range(3)]  # fmt: skip
        fair.push(made[0])
        learner.push(made[1])
        if not entitled:
            only_one.push(ticket(seq, "o1", tokens=tokens, rank=rank, hint=hint))
        if cancel:
            fair.cancel(made[0])
            learner.cancel(made[1])
    out = drain(fair)
    assert sorted(t.seq for t in out) == sorted(t.seq for t in drain(learner))
    assert len({t.seq for t in out}) == len(out) and fair.num_queued == 0
    flags = [t.entitled for t in out]
    assert flags == sorted(flags, reverse=True)  # every entitled ticket before the surplus
    lone = AssuredFirstDispatcher()
    for seq, (tenant, rank, hint, tokens, _) in enumerate(entries):
        if tenant != "a95":
            lone.push(ticket(seq, "o1", tokens=tokens, rank=rank, hint=hint))
    assert [t.seq for t in drain(only_one)] == [t.seq for t in drain(lone)]


V100_CEILING = AffineEnvelope(0.287, 0.0233, 0.0001)
"""A service ceiling's shape: 287 ms base, 23 ms an output token, 0.1 ms a prompt token."""


def _slot_shares(dispatcher, starts=200):
    """Each tenant's share of the slot time (by `V100_CEILING`) of the first `starts`."""
    held = Counter()
    for t in drain(dispatcher, starts):
        held[t.request.tenant] += V100_CEILING.at(t.request.num_output_tokens,
                                                  t.request.num_prompt_tokens)  # fmt: skip
    total = sum(held.values())
    return {tenant: s / total for tenant, s in held.items()}


def test_a_long_prompt_short_output_tenant_gets_half_the_slot_time():
    """A polite tenant of 1,000-token prompts and 16-token outputs beside a
    160-token flooder got 6.4 % of the slot time when a prompt token was charged like an
    output token. Charged the slot time it holds, it gets half; the token charge is kept
    (`fair-tokens`) and still shows the skew."""
    shares = {}
    for order in (SurplusOrder.FAIR, SurplusOrder.FAIR_TOKENS):
        fair = create_dispatcher(DispatchOrder.ASSURED_FIRST, order, V100_CEILING)
        for seq in range(400):
            fair.push(ticket(seq, "flood", tokens=160, prompt=8))
            fair.push(ticket(1000 + seq, "polite", tokens=16, prompt=1000))
        shares[order] = _slot_shares(fair)["polite"]
    assert 0.45 <= shares[SurplusOrder.FAIR] <= 0.55
    assert shares[SurplusOrder.FAIR_TOKENS] < 0.15


def test_without_a_per_token_cost_the_charge_is_the_output_cap():
    """A flat envelope (no service model) charges what holds a slot: the output cap."""
    flat = slot_charge(AffineEnvelope(60.0, 0.0))
    assert flat.at(16, 1000) == 16 and slot_charge(None).at(160, 8) == 160
    assert slot_charge(V100_CEILING) is V100_CEILING
    assert TOKEN_CHARGE.at(16, 1000) == 1016
