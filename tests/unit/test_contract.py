from __future__ import annotations

import pytest

from floorguard.core.contract import (
    AffineEnvelope,
    Contract,
    ContractClass,
    GuardConfig,
    WindowSchedule,
)
from floorguard.errors import ConfigError
from tests.helpers import make_config


def test_window_index_is_floor_of_offset_over_length():
    """k = floor((t − t0)/W), including before the epoch and exactly on an edge."""
    schedule = WindowSchedule(window_s=2.0, origin_at=10.0)
    assert [schedule.index_at(t) for t in (10.0, 11.999, 12.0, 9.999, 0.0)] == [0, 0, 1, -1, -5]
    assert schedule.start_of(3) == 16.0


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: WindowSchedule(window_s=0), "window_s"),
        (lambda: WindowSchedule(origin_at=float("nan")), "origin_at"),
        (lambda: Contract("a", ContractClass.ASSURED, 1.0, floor=0), "floor"),
        (lambda: Contract("a", ContractClass.OPPORTUNISTIC, 1.0, floor=3), "floor"),
        (lambda: Contract("a", ContractClass.ASSURED, -1.0, floor=1), "deadline_budget_s"),
        (lambda: Contract("", ContractClass.ASSURED, 1.0, floor=1), "tenant"),
        (lambda: AffineEnvelope(-0.1, 0.01), "base_s"),
        (lambda: make_config(slots=(4, -1)), "slots[1]"),
        (lambda: make_config(slots=(0, 0)), "slots"),
        (lambda: GuardConfig(contracts=()), "contracts"),
    ],
)
def test_bad_values_name_the_field(build, field):
    """A bad value raises ConfigError whose message starts with the field and value."""
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field} = ")


def test_duplicate_tenants_are_refused():
    """Two contracts for one tenant would make the class binding ambiguous."""
    c = Contract("a", ContractClass.ASSURED, 1.0, floor=1)
    with pytest.raises(ConfigError, match="only one contract"):
        GuardConfig(contracts=(c, c))


def test_totals_sum_over_contracts_and_backends():
    """total_floor sums B over assured contracts; total_slots sums C over backends."""
    config = make_config(floor=5, slots=(4, 2))
    assert (config.total_floor, config.total_slots) == (5, 6)
    assert config.contract_for("a95").floor == 5
    assert config.contract_for("nobody") is None
