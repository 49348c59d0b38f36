"""The datacenter simulation (docs/design.md §13): replicas of the shipped Guard sharing one
simulated floor store and the backends, checked by `check_fleet`."""

from __future__ import annotations

import json

import pytest

from floorguard.cli import main
from floorguard.datacenter import Fleet, simulate_fleet
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.store import simulated
from floorguard.store.leases import LeaseCall, SlotLeases
from floorguard.store.simulated import SimulatedRedis

SMALL = {"replicas": 3, "backends": 6, "tenants": 12, "duration_s": 6.0}


@pytest.mark.parametrize("mode", ["leased", "partition"])
def test_a_fleet_keeps_the_floor_and_the_slots(mode):
    """Every floor-entitled request of every tenant is admitted fleet-wide, no backend ever
    holds more than C, and the replicas' logs pass check_fleet (AF, SLOTS per backend,
    ORDER across replicas when leased)."""
    result = simulate_fleet(Fleet(**SMALL, slot_mode=mode), seed=3)
    assert result.verify_ok, result.violations
    assert result.floor_admitted == result.floor_entitled == 12 * 6
    assert result.peak_in_flight == 4  # the flood fills every slot, never more
    assert result.checked_peak == 4  # and the checker counted the same from the logs
    assert result.assured_late == 0
    assert result.opportunistic_completed > 0


def test_partitioned_slots_cost_utilization_under_a_skewed_balancer():
    """The same skewed load balancer: leased slots keep the fleet busy; a partition leaves
    the lightly loaded replicas' backends idle while the heavy ones queue."""
    skewed = {**SMALL, "skew": 1.5}
    leased = simulate_fleet(Fleet(**skewed, slot_mode="leased"), seed=0)
    partition = simulate_fleet(Fleet(**skewed, slot_mode="partition"), seed=0)
    assert leased.verify_ok and partition.verify_ok
    assert leased.utilization > partition.utilization + 0.05
    assert leased.opportunistic_completed > partition.opportunistic_completed


def test_a_store_outage_under_grants_and_is_conditional_not_a_violation():
    """Redis down for 3 s: the replicas fall back to fail-static (⌊B/N⌋ each), so some
    entitled requests are refused; the logs mark the degraded periods and check_fleet
    reports those refusals as conditional on the store, not as AF violations."""
    result = simulate_fleet(
        Fleet(**{**SMALL, "duration_s": 8.0}, floor=3, store_outage=(2.0, 5.0)), seed=0
    )
    assert result.verify_ok, result.violations
    assert result.floor_admitted < result.floor_entitled
    assert result.conditional > 0


def test_the_fleet_check_catches_a_fleet_that_ignores_the_waiting_board(monkeypatch):
    """Attack the lease script: a store whose waiting board never holds an opportunistic
    start back lets replicas start surplus work while another replica's entitled request
    waits for a slot, and check_fleet says so (fleet ORDER). (The pool's hand-over gives
    every freed slot to the entitled waiters first, so only a slot free when it was asked
    for slips past: two backends, where the replicas' views of which is free go stale
    fastest.)"""
    fleet = Fleet(**{**SMALL, "backends": 2}, floor=2, skew=2.0)
    assert simulate_fleet(fleet, seed=0).verify_ok
    monkeypatch.setattr(simulated, "_board_order", lambda board, replica: "")
    result = simulate_fleet(fleet, seed=0)
    assert not result.verify_ok
    assert any(v.startswith("ORDER: fleet") for v in result.violations)


def test_leased_slots_run_the_shipped_lease_policy():
    """Every start takes a lease through SlotLeases over the simulated lease.lua; under a
    flood the fleet is full, so starts are denied (`no_lease`), requeued and their backend
    held off — and still no backend ever holds more than C."""
    result = simulate_fleet(Fleet(**SMALL), seed=1)
    assert result.verify_ok, result.violations
    assert result.no_lease > 0
    assert result.lease_calls > result.num_requests  # a lease per start, releases, renewals
    assert result.peak_in_flight == result.checked_peak == 4


def test_a_store_outage_with_leased_slots_keeps_every_backend_within_c():
    """Redis down for 3 s under a flood: each replica grants local leases only in the slots
    it held when Redis was lost, restores them when it returns; no backend ever runs more
    than C, and the logs pass check_fleet."""
    result = simulate_fleet(Fleet(**SMALL, store_outage=(2.0, 5.0)), seed=0)
    assert result.verify_ok, result.violations
    assert result.local_grants > 0
    assert result.peak_in_flight == result.checked_peak == 4


def test_a_partition_share_while_the_store_is_down_would_overshoot_c(monkeypatch):
    """The rule the leases replaced, attacked on purpose: falling back to a ⌊C/N⌋ share
    lets a replica that held little take its share while the others still run what they
    held, and a backend is handed more than C."""
    replicas = SMALL["replicas"]
    monkeypatch.setattr(SlotLeases, "_lost", lambda self: [c // replicas for c in self.capacity])
    overshot = 0
    for seed in range(3, 6):  # it overshoots in seed 4 of the first 8 (serve's doom gate on)
        try:
            simulate_fleet(Fleet(**SMALL, store_outage=(2.0, 5.0)), seed=seed)
        except RuntimeError as exc:
            assert "over-dispatched" in str(exc)
            overshot += 1
    assert overshot > 0


def test_a_partition_must_give_each_replica_whole_backends():
    with pytest.raises(ValueError, match="do not divide"):
        Fleet(replicas=4, backends=6, slot_mode="partition")


def test_simulate_fleet_cli(capsys, tmp_path):
    args = ["simulate", "--replicas", "2", "--backends", "2", "--tenants", "2", "--json"]
    assert main(args) == 0
    results = json.loads(capsys.readouterr().out)
    assert len(results) == 1 and results[0]["verify_ok"]
    assert results[0]["fleet"]["slot_mode"] == "leased"
    figure = tmp_path / "fleet.png"
    assert main([*args, "--skew", "0,1", "--figure", str(figure)]) == 0
    sweep = json.loads(capsys.readouterr().out)
    assert [(r["fleet"]["skew"], r["fleet"]["slot_mode"]) for r in sweep] == [
        (0.0, "partition"),
        (0.0, "leased"),
        (1.0, "partition"),
        (1.0, "leased"),
    ]
    assert figure.stat().st_size > 10_000
    assert main([*args[:-1], "--slot-mode", "partition", "--backends", "3"]) == 2
    assert "do not divide" in capsys.readouterr().err


def test_a_slot_handed_on_never_comes_back_to_the_replica_that_passed_it():
    """A replica hands on a slot it cannot use while its own entitled request's lease call
    is out (its count shows 1 waiting): released as a plain release, the slot was handed
    straight back to it, which handed it on again, at one instant, for ever (this fleet,
    W = 2 s and the random learner, never ended). A `pass` hands it to the others only."""
    result = simulate_fleet(Fleet(replicas=3, window_s=2.0, learner="random"), seed=0)
    assert result.verify_ok and result.num_requests > 1000
    for op, to in (("pass", []), ("release", ["A"])):
        sim = SimulatedRedis()
        held = LeaseCall("b", "acquire", 1, 1.0, "A", 0, True, ("A|1",), 10.0, 1)
        assert sim.lease(held).granted
        answer = sim.lease(held._replace(op=op, waiting=1, seq=2))  # A shows 1 waiting
        assert [r for r, _ in answer.handed] == to


def test_each_replica_is_built_from_its_serve_configuration():
    """The replicas are what `serve` builds: `Fleet.config` is a `GuardServerConfig` (the
    one `serve` reads from YAML), and W and the learner reach the guards through it — a
    2 s window counts the floor per 2 s (no W = 1 assumed in the results), and a learner
    that rejects everything leaves the surplus empty while the floor holds."""
    fleet = Fleet(**{**SMALL, "duration_s": 8.0}, window_s=2.0, learner="always-reject")
    config = fleet.config(0)
    assert isinstance(config, GuardServerConfig)
    assert config.window_s == 2.0 and config.learner == "always-reject"
    assert config.store is not None and config.store.slots == "leased"
    result = simulate_fleet(fleet, seed=0)
    assert result.verify_ok, result.violations
    assert result.floor_entitled == result.floor_admitted == 12 * (8 // 2) * fleet.floor
    assert result.opportunistic_completed == 0
    partition = Fleet(**SMALL, slot_mode="partition").config(1)
    assert [b.url for b in partition.backends] == ["http://b2", "http://b3"]
