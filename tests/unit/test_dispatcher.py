from __future__ import annotations

import pytest

from floorguard.core.contract import Contract, ContractClass
from floorguard.core.dispatcher import AssuredFirstDispatcher, FifoDispatcher, SlotPool, Ticket
from tests.helpers import make_request

ASSURED = Contract("a95", ContractClass.ASSURED, 1.0, floor=4)
OPP = Contract("a10", ContractClass.OPPORTUNISTIC, 1.0)


def ticket(seq: int, *, entitled: bool, rank: int = 1, hint: float = 0.0) -> Ticket:
    contract = ASSURED if entitled else OPP
    return Ticket(
        make_request(assured=entitled, request_id=seq), contract, 1.0, entitled, 0, seq, rank, hint
    )


def drain(dispatcher) -> list[int]:
    out = []
    while (t := dispatcher.pop()) is not None:
        out.append(t.seq)
    return out


def test_assured_first_serves_every_entitled_before_any_surplus_in_arrival_order():
    """Entitled by arrival; then the surplus by (relabel, hint, arrival)."""
    d = AssuredFirstDispatcher()
    for t in [
        ticket(1, entitled=False, hint=5),
        ticket(2, entitled=True),
        ticket(3, entitled=False, hint=1),
        ticket(4, entitled=True),
        ticket(5, entitled=False, hint=1),
        ticket(6, entitled=False, rank=0, hint=9),
    ]:
        d.push(t)
    assert (d.num_queued, d.num_queued_entitled) == (6, 2)
    assert drain(d) == [2, 4, 6, 3, 5, 1]
    assert (d.num_queued, d.num_queued_entitled) == (0, 0)


def test_hint_never_reorders_entitled_tickets():
    """A hint on an entitled ticket is ignored: arrival order only."""
    d = AssuredFirstDispatcher()
    d.push(ticket(1, entitled=True, hint=9))
    d.push(ticket(2, entitled=True, hint=-9))
    assert drain(d) == [1, 2]


def test_fifo_ignores_class_and_hint():
    """The FIFO variant serves in admission order, whatever the class."""
    d = FifoDispatcher()
    for t in [
        ticket(1, entitled=False, hint=5),
        ticket(2, entitled=True),
        ticket(3, entitled=False),
    ]:
        d.push(t)
    assert drain(d) == [1, 2, 3]


@pytest.mark.parametrize("cls", [AssuredFirstDispatcher, FifoDispatcher])
def test_cancelled_tickets_are_skipped_and_uncounted(cls):
    """A client that left is removed from the counts at once and never popped."""
    d = cls()
    a, b = ticket(1, entitled=True), ticket(2, entitled=True)
    d.push(a)
    d.push(b)
    d.cancel(a)
    assert (d.num_queued, d.num_queued_entitled) == (1, 1)
    assert drain(d) == [2]


def test_slot_pool_spreads_load_and_never_exceeds_capacity():
    """Most-free backend first (lowest index on a tie); at zero free, acquire refuses;
    release past C refuses."""
    pool = SlotPool((2, 1))
    assert [pool.acquire() for _ in range(3)] == [0, 0, 1]
    assert pool.num_free == 0
    with pytest.raises(RuntimeError):
        pool.acquire()
    pool.release(1)
    assert (pool.in_flight(0), pool.in_flight(1)) == (2, 0)
    pool.release(0)
    assert pool.acquire() == 0
    with pytest.raises(RuntimeError):
        pool.release(1)
