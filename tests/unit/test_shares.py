"""A replica's slot shares (docs/design.md §14): a partition follows the live fleet, never past a
backend's capacity; a fleet larger than the slots keeps one slot, on the largest backend."""

from __future__ import annotations

import logging

from floorguard.proxy.config.guard import BackendSpec
from floorguard.proxy.pool.shares import capacities, merge_backends, slot_shares

A = BackendSpec(url="http://a:8000", slots=4, capacity=8)
B = BackendSpec(url="http://b:8000", slots=4)
C = BackendSpec(url="http://c:8000", slots=2, capacity=3)


def _capacity(reported):
    return lambda b: b.capacity or reported.get(b.url)


def test_a_partition_gives_each_replica_its_share_of_the_known_capacity():
    shares = slot_shares(
        [A, B, C], frozenset(), 3, partitioned=True, capacity_of=_capacity({"http://b:8000": 6})
    )
    assert shares == (2, 2, 1)  # ⌊8/3⌋, ⌊6/3⌋ (reported), ⌊3/3⌋


def test_unknown_capacity_or_leased_slots_keep_the_configured_slots_and_removed_get_none():
    unknown = slot_shares([A, B], frozenset({0}), 4, partitioned=True, capacity_of=_capacity({}))
    assert unknown == (0, 4)  # A removed; B's capacity unknown: its `slots`
    leased = slot_shares([A, C], frozenset(), 4, partitioned=False, capacity_of=_capacity({}))
    assert leased == (4, 2)


def test_more_replicas_than_slots_keeps_one_slot_on_the_largest_backend(caplog):
    with caplog.at_level(logging.WARNING, logger="floorguard.proxy"):
        shares = slot_shares([C, A], frozenset(), 9, partitioned=True, capacity_of=_capacity({}))
    assert shares == (0, 1)  # ⌊3/9⌋ = ⌊8/9⌋ = 0: one slot on A (capacity 8 > 3)
    assert "keeps one slot on http://a:8000" in caplog.text


def test_capacities_and_a_reload_keep_backends_in_place():
    assert capacities([A, B], _capacity({})) == (8, None)
    assert capacities([B], _capacity({})) == ()
    merged, removed = merge_backends([A, B], [BackendSpec(url="http://b:8000/", slots=2), C])
    assert [b.url for b in merged] == ["http://a:8000", "http://b:8000/", "http://c:8000"]
    assert removed == frozenset({0}) and merged[1].slots == 2
