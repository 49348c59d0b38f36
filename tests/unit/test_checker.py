from __future__ import annotations

import dataclasses

import pytest

from floorguard.analysis.checker import check_fleet, check_trace, format_prefix
from floorguard.core.contract import DispatchOrder, ExcessPolicy
from floorguard.core.events import EventKind, TraceEvent
from floorguard.core.guard import Guard
from floorguard.learners.adversaries import AlwaysAdmit
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import marquee
from floorguard.store import MemoryCreditStore
from tests.helpers import make_config, make_guard, make_request


@pytest.fixture(scope="module")
def marquee_events():
    # the Poisson variant: its bursts exhaust the floor, so there are rejections to tamper with
    run = simulate_once(marquee(assured_poisson=True), seed=7)
    return run.events


def first(events, kind, **fields):
    for i, e in enumerate(events):
        if e.kind is kind and all(getattr(e, k) == v for k, v in fields.items()):
            return i
    raise AssertionError(f"no {kind} with {fields}")


def props(report):
    return [v.prop for v in report.violations]


def test_a_simulated_marquee_trace_passes(marquee_events):
    """The simulator's own trace satisfies AF, DR, ORDER, SLOTS and TERMINAL."""
    report = check_trace(marquee_events)
    assert report.ok(), report.violations[:3]
    assert report.num_drops > 0 and report.num_entitled > 0
    assert sum(report.counts.values()) == report.num_requests


def test_an_entitled_request_admitted_as_surplus_violates_AF(marquee_events):
    """Flipping one entitled admission to surplus is caught at that very event."""
    events = list(marquee_events)
    i = first(events, EventKind.ADMIT, entitled=True)
    events[i] = events[i]._replace(entitled=False)
    report = check_trace(events)
    assert report.violations[0].prop == "AF" and report.violations[0].index == i


def test_granting_beyond_B_violates_AF(marquee_events):
    """Turning a floor_exhausted rejection into an entitled admission over-grants the floor."""
    events = list(marquee_events)
    i = first(events, EventKind.REJECT, reason="floor_exhausted")
    events[i] = events[i]._replace(kind=EventKind.ADMIT, entitled=True, reason=None)
    report = check_trace(events)
    assert report.violations[0].prop == "AF"
    assert "beyond B" in report.violations[0].message


def test_a_drop_with_slack_violates_DR(marquee_events):
    """A drop made while t + L(ℓ) ≤ D is not doom-sound."""
    events = list(marquee_events)
    i = first(events, EventKind.DROP)
    rid = events[i].request_id
    arrive = events[first(events, EventKind.ARRIVE, request_id=rid)]
    events[i] = events[i]._replace(at=arrive.at)
    report = check_trace(events)
    assert report.violations[0].prop == "DR" and report.violations[0].index == i


def hand_trace(dispatch=DispatchOrder.ASSURED_FIRST):
    """Slots C = 1: an entitled and a surplus request both queued behind a running one."""
    events = []
    guard = make_guard(make_config(floor=5, slots=(1,), dispatch=dispatch), events=events)
    for rid, assured in [(0, True), (1, False), (2, True)]:
        guard.on_arrival(make_request(request_id=rid, assured=assured), 0.0)
        guard.poll(0.0)
    for t in (0.3, 0.6, 0.9):
        guard.finish(next(iter(guard._in_flight)), t, "complete")
        guard.poll(t)
    return events


def test_surplus_started_while_entitled_waits_violates_ORDER():
    """Swapping the dispatch order of a surplus and an entitled request is caught."""
    events = hand_trace()
    assert check_trace(events).ok()
    d2 = first(events, EventKind.DISPATCH, request_id=2)
    d1 = first(events, EventKind.DISPATCH, request_id=1)
    assert d2 < d1  # the guard started the entitled one first
    events[d2], events[d1] = (
        events[d1]._replace(at=events[d2].at),
        events[d2]._replace(at=events[d1].at),
    )
    assert props(check_trace(events))[0] == "ORDER"


def test_fifo_trace_passes_and_out_of_order_fails():
    """In FIFO mode, starts must follow admission order."""
    events = hand_trace(DispatchOrder.FIFO)
    assert check_trace(events).ok()
    d1 = first(events, EventKind.DISPATCH, request_id=1)
    d2 = first(events, EventKind.DISPATCH, request_id=2)
    events[d1], events[d2] = events[d2], events[d1]
    assert "ORDER" in props(check_trace(events))


def test_more_than_C_in_flight_violates_SLOTS():
    """An extra dispatch while the only slot is busy is caught."""
    events = hand_trace()
    extra = events[first(events, EventKind.DISPATCH, request_id=1)]
    events.insert(first(events, EventKind.ENQUEUE, request_id=1) + 1, extra)
    assert props(check_trace(events))[0] == "SLOTS"


def test_missing_and_double_terminal_outcomes_violate_TERMINAL():
    """No outcome, or two outcomes, for one request."""
    events = hand_trace()
    last = first(events, EventKind.COMPLETE, request_id=1)
    missing = events[:last] + events[last + 1 :]
    assert props(check_trace(missing)) == ["TERMINAL"]
    assert check_trace(missing, allow_open=True).ok()
    doubled = [*events, events[last]]
    assert props(check_trace(doubled)) == ["TERMINAL"]


def test_late_entitled_completion_is_SF_and_fails_only_when_strict():
    """SF is conditional: reported always, failing only with strict_sf."""
    events = hand_trace()
    i = first(events, EventKind.COMPLETE, request_id=2)
    events[i] = events[i]._replace(at=5.0)
    report = check_trace(events)
    assert report.num_sf_late == 1 and report.ok() and not report.ok(strict_sf=True)


def test_prefix_printing_names_the_violation_and_ends_at_it(marquee_events):
    """format_prefix shows the property, the index and the events up to it."""
    events = list(marquee_events)
    i = first(events, EventKind.ADMIT, entitled=True)
    events[i] = events[i]._replace(entitled=False)
    violation = check_trace(events).violations[0]
    text = format_prefix(events, violation)
    assert f"AF at event {i}" in text
    assert text.rstrip().splitlines()[-1].lstrip().startswith(str(i))


def test_drop_without_a_lower_envelope_is_never_sound():
    """With no L in the config, any drop is a DR violation."""
    guard_events = []
    make_guard(make_config(lower=None), events=guard_events)
    events = [
        guard_events[0],
        TraceEvent(0.0, EventKind.ARRIVE, 1, "a10", None, deadline_at=1.0, num_output_tokens=16),
        TraceEvent(5.0, EventKind.DROP, 1, "a10", reason="doomed"),
    ]
    assert props(check_trace(events)) == ["DR"]


def _fleet(shared: bool, excess: ExcessPolicy = ExcessPolicy.REJECT):
    """Three replicas taking turns with one tenant's arrivals (B = 2 per window), sharing
    one credit store or (a broken fleet) each keeping its own."""
    config = make_config(floor=2, slots=(4,), excess=excess)
    store = MemoryCreditStore()
    logs = [[] for _ in range(3)]
    guards = [
        Guard(
            config,
            learner=AlwaysAdmit(),
            sink=log.append,
            store=store if shared else MemoryCreditStore(),
        )
        for log in logs
    ]
    for i in range(12):  # 4 windows × 3 arrivals
        now = 0.3 * i
        guard = guards[i % 3]
        guard.on_arrival(make_request(request_id=f"r{i}", at=now, tenant="a95"), now)
        for d in guard.poll(now):
            guard.finish(d.request.request_id, now + 0.01, "complete")
    return logs


@pytest.mark.parametrize("excess", [ExcessPolicy.REJECT, ExcessPolicy.DEMOTE])
def test_replicas_sharing_one_floor_pass_the_fleet_check(excess):
    logs = _fleet(shared=True, excess=excess)
    report = check_fleet(logs)
    assert report.ok(), report.violations[:3]
    assert report.num_entitled == 8  # min(B = 2, 3 offered) in each of 4 windows
    # alone, a replica's log looks wrong: the others spent credits it cannot see
    assert not all(check_trace(log).ok() for log in logs)


def test_replicas_with_private_floors_over_grant_and_the_fleet_check_says_so():
    report = check_fleet(_fleet(shared=False))
    assert "AF" in props(report)
    assert any("> B = 2" in v.message for v in report.violations)


def test_a_refusal_while_the_fleet_had_room_is_an_af_violation():
    logs = _fleet(shared=True)
    victim = first(logs[0], EventKind.ADMIT, entitled=True)
    e = logs[0][victim]
    logs[0][victim] = e._replace(kind=EventKind.REJECT, entitled=None, reason="floor_exhausted")
    report = check_fleet(logs)
    assert any("while the fleet granted" in v.message for v in report.violations)


def _refuse(log, index):
    """Turn the entitled admission at `index` into a floor refusal (its later events go)."""
    e = log[index]
    log[index] = e._replace(kind=EventKind.REJECT, entitled=None, reason="floor_exhausted")
    log[index + 1 :] = [x for x in log[index + 1 :] if x.request_id != e.request_id]
    return e


def test_a_refusal_while_the_store_was_degraded_is_conditional_not_a_violation():
    """The log marks a degraded period with `store` events: AF findings there are
    conditional on the store (the documented fail-static under-granting), not failures;
    the degraded seconds are reported per log."""
    logs = _fleet(shared=True)
    victim = first(logs[0], EventKind.ADMIT, entitled=True)
    e = _refuse(logs[0], victim)
    logs[0].insert(victim, TraceEvent(e.at, EventKind.STORE, reason="fail-static"))
    logs[0].insert(victim + 2, TraceEvent(e.at + 0.5, EventKind.STORE, reason="shared"))
    report = check_fleet(logs)
    assert report.ok(), report.violations[:3]
    assert report.conditional and all(f"window {e.window}" in v.message for v in report.conditional)
    assert any("store fail-static" in v.message for v in report.conditional)
    assert report.degraded_s == pytest.approx([0.5, 0.0, 0.0])
    # without the markers the same log fails
    unmarked = [[x for x in log if x.kind is not EventKind.STORE] for log in logs]
    assert not check_fleet(unmarked).ok()


def test_a_lost_state_makes_its_window_conditional():
    """Redis lost a tenant's count in a window (a `store` event with reason lost-state):
    that window's refusals are conditional; other windows are still judged strictly."""
    logs = _fleet(shared=True)
    admits = [i for i, e in enumerate(logs[1]) if e.kind is EventKind.ADMIT and e.entitled]
    later = logs[1][admits[-1]]
    _refuse(logs[1], admits[-1])
    lost = _refuse(logs[1], admits[0])
    assert lost.window != later.window
    logs[1].insert(
        admits[0],
        TraceEvent(lost.at, EventKind.STORE, tenant="a95", window=lost.window, reason="lost-state"),
    )
    report = check_fleet(logs)
    assert report.conditional
    assert all(f"window {lost.window}" in v.message for v in report.conditional)
    assert report.failed() and all(f"window {later.window}" in v.message for v in report.failed())


def _two_replicas_on_one_backend(slots: int, capacity: int = 4):
    """Two replicas in front of one backend of `capacity` slots, each keeping `slots`, each
    given 4 requests at once that complete together a second later."""
    config = dataclasses.replace(
        make_config(floor=8, slots=(slots,)),
        backend_ids=("http://vllm:8000",),
        backend_capacity=(capacity,),
    )
    store = MemoryCreditStore()
    logs = [[], []]
    for n, log in enumerate(logs):
        guard = Guard(config, learner=AlwaysAdmit(), sink=log.append, store=store)
        started = []
        for i in range(4):
            guard.on_arrival(make_request(request_id=f"r{n}-{i}", at=0.0, tenant="a95"), 0.0)
            started += [d.request.request_id for d in guard.poll(0.0)]
        now = 1.0
        while guard.num_in_flight:
            for rid in list(started):
                if rid in guard._in_flight:
                    guard.finish(rid, now, "complete")
                    started += [d.request.request_id for d in guard.poll(now)]
            now += 1.0
    return logs


def test_the_fleet_check_counts_slots_per_backend_across_replicas():
    """Each replica keeps its own C, but 2 × 3 > the backend's 4: fleet SLOTS says so; a
    partition of 2 + 2 fits, and the fleet's peak in flight is reported."""
    over = check_fleet(_two_replicas_on_one_backend(slots=3))
    assert all(check_trace(log).ok() for log in _two_replicas_on_one_backend(slots=3))
    assert "SLOTS" in props(over)
    assert any("> its capacity 4" in v.message for v in over.violations)
    fits = check_fleet(_two_replicas_on_one_backend(slots=2))
    assert fits.ok(), fits.violations[:3]
    assert fits.fleet_peak_in_flight == {"http://vllm:8000": 4}


def _two_pools(events):
    """The same run logged by two pools' guards into one file, interleaved by time."""
    a = [e._replace(pool="a") for e in events]
    b = [
        e._replace(pool="b", request_id=f"b-{e.request_id}" if e.request_id is not None else None)
        for e in events
    ]
    return sorted(a + b, key=lambda e: (e.at, e.pool))


def test_a_log_of_two_pools_is_checked_pool_by_pool(marquee_events):
    """Each pool against its own config: the two pools' slots and queues never mix (merged
    as one pool the same lines break SLOTS and ORDER); a violation in one pool is found at
    its place in the whole file."""
    merged = _two_pools(marquee_events)
    report = check_trace(merged)
    assert report.ok(), report.violations[:3]
    assert report.num_requests == 2 * check_trace(marquee_events).num_requests
    untagged = [
        e._replace(pool=None) for e in merged if not (e.kind is EventKind.CONFIG and e.pool == "b")
    ]
    assert {"SLOTS", "ORDER"} & set(props(check_trace(untagged)))
    i = first(merged, EventKind.ADMIT, entitled=True, pool="b")
    merged[i] = merged[i]._replace(entitled=False)
    report = check_trace(merged)
    assert (report.violations[0].prop, report.violations[0].index) == ("AF", i)
    fleet = check_fleet([_two_pools(marquee_events), _two_pools(marquee_events)])
    assert fleet.num_requests == 4 * check_trace(marquee_events).num_requests


def _died_and_restarted(log):
    """`log` cut after its first two dispatches (the replica died with them in flight)
    and followed by a new life: its config again, and one request served to the end."""
    dispatches = [i for i, e in enumerate(log) if e.kind is EventKind.DISPATCH]
    config = log[0]
    died_at = log[dispatches[1]].at
    life = [
        config._replace(at=died_at + 0.5),
        TraceEvent(died_at + 0.6, EventKind.ARRIVE, "new-1", "a95", None),
    ]
    return log[: dispatches[1] + 1] + life


def test_a_replica_that_died_with_requests_in_flight_verifies_beside_the_others():
    """A killed replica's log beside the survivors' never verified. Its requests
    still open when its log starts a new life are counted (`num_died_open`), not TERMINAL
    violations, and fleet SLOTS releases them where the new life starts."""
    logs = _two_replicas_on_one_backend(slots=2)
    logs[1] = _died_and_restarted(logs[1])
    report = check_fleet(logs, allow_open=True)
    assert report.ok(), report.violations[:3]
    assert report.num_died_open == 2
    assert report.fleet_peak_in_flight == {"http://vllm:8000": 4}


def test_a_log_that_ends_with_requests_open_still_fails_without_allow_open():
    """A life that ends open at the end of the file (no restart): TERMINAL, as before."""
    log = _two_replicas_on_one_backend(slots=2)[0]
    cut = [i for i, e in enumerate(log) if e.kind is EventKind.DISPATCH][1]
    assert "TERMINAL" in props(check_trace(log[: cut + 1]))


def test_a_half_written_line_a_dying_writer_left_is_skipped(tmp_path):
    """A SIGKILL mid-write leaves half a line: the file's last, or (once a new writer ended
    it) the line before the new life's config. Each is skipped and counted; half a line
    anywhere else is still an error naming its line."""
    from floorguard.core.events import TraceError, read_jsonl, to_json  # noqa: PLC0415
    from floorguard.proxy.observe.decision_log import LineLog  # noqa: PLC0415

    log = _two_replicas_on_one_backend(slots=2)[0]
    lines = [to_json(e) for e in log]
    path = tmp_path / "decisions.jsonl"
    path.write_text("\n".join(lines[:5]) + "\n" + lines[5][:17])  # killed mid-line
    torn: list[int] = []
    assert len(list(read_jsonl(path, torn))) == 5 and torn == [6]
    writer = LineLog(path)  # the restarted replica appends its own life
    writer.append_line(lines[0])
    writer.close()
    torn.clear()
    events = list(read_jsonl(path, torn))
    assert len(events) == 6 and torn == [6] and events[-1].kind is EventKind.CONFIG
    path.write_text("\n".join([*lines[:3], lines[3][:17], *lines[4:]]) + "\n")
    with pytest.raises(TraceError, match="trace line 4"):
        list(read_jsonl(path))


def test_a_refusal_in_a_window_a_replica_died_in_is_conditional():
    """A replica that died took credits whose grants never reached its log (written in
    batches): in the windows between its last line and its new life's config, a survivor's
    refusal that the logged grants leave room for is conditional, not an AF violation."""
    logs = _fleet(shared=True)
    lost = first(logs[1], EventKind.ADMIT, entitled=True)  # never written: the replica died
    window, rid = logs[1][lost].window, logs[1][lost].request_id
    dead = [x for x in logs[1][:lost] if x.request_id != rid]
    after = [x for x in logs[1][lost:] if x.request_id != rid]
    logs[1] = [*dead, logs[1][0]._replace(at=logs[1][lost].at + 0.01), *after]
    assert not check_fleet([logs[0], logs[1][: len(dead)] + after, logs[2]]).ok()
    report = check_fleet(logs, allow_open=True)
    assert report.ok(), report.violations[:3]
    assert any(
        f"window {window}" in v.message and "a replica died" in v.message
        for v in report.conditional
    )


def _leased_order_breach(start_at: float = 0.5):
    """Two leasing replicas in front of one backend: replica 0's entitled request waits
    for a lease from t = 0 to t = 0.9 (denied, then granted); replica 1 starts an
    opportunistic request at `start_at`. Fleet ORDER, unless the logs show replica 0
    could not be on the pool's waiting board then."""
    config = dataclasses.replace(
        make_config(floor=8, slots=(2,)),
        backend_ids=("http://vllm:8000",),
        backend_capacity=(2,),
        slot_leases=True,
    )
    store = MemoryCreditStore()
    logs = [[], []]
    waiting, surplus = (
        Guard(config, learner=AlwaysAdmit(), sink=log.append, store=store) for log in logs
    )
    waiting.on_arrival(make_request(request_id="e", at=0.0, tenant="a95"), 0.0)
    (entitled,) = waiting.poll(0.0)
    assert entitled.entitled
    waiting.lease_denied("e", 0.0)
    surplus.on_arrival(make_request(request_id="o", at=start_at, tenant="a10"), start_at)
    (start,) = surplus.poll(start_at)
    assert not start.entitled
    surplus.lease_granted("o", start_at)
    surplus.finish("o", 1.5, "complete")
    waiting.poll(0.9)
    waiting.lease_granted("e", 0.9)
    waiting.finish("e", 0.95, "complete")
    return logs


def _slots_event(at: float, state: str) -> TraceEvent:
    return TraceEvent(at, EventKind.STORE, reason=f"slots-{state}")


def _with(log, *events):
    return sorted([*log, *events], key=lambda e: e.at)


def test_fleet_order_against_a_replica_that_could_not_be_on_the_board_is_conditional():
    """Leased slots: an opportunistic start while another replica's entitled request waits
    is a fleet ORDER violation, unless that replica's log shows it could not be on the
    waiting board: its store unreachable (`slots-unreachable` until its next `slots-*`
    event), or the store's state lost and that replica not yet called since (from the
    first `slots-lost-state` any replica logged to its own). A start before anyone could
    know of a loss is still a violation."""
    plain = check_fleet(_leased_order_breach())
    assert [v.prop for v in plain.violations] == ["ORDER"], plain.violations
    waiting, surplus = _leased_order_breach()
    away = [_with(waiting, _slots_event(0.2, "unreachable"), _slots_event(0.8, "recovering")),
            surplus]  # fmt: skip
    report = check_fleet(away)
    assert report.ok() and [v.prop for v in report.conditional] == ["ORDER"]
    assert "could not be on the waiting board" in report.conditional[0].message
    back = [_with(waiting, _slots_event(0.2, "unreachable"), _slots_event(0.4, "recovering")),
            surplus]  # fmt: skip
    assert not check_fleet(back).ok()  # it announced itself again before the start
    lost = [_with(waiting, _slots_event(0.7, "lost-state")),
            _with(surplus, _slots_event(0.3, "lost-state"))]  # fmt: skip
    assert check_fleet(lost).ok()
    waiting, surplus = _leased_order_breach(start_at=0.25)
    early = [_with(waiting, _slots_event(0.7, "lost-state")),
             _with(surplus, _slots_event(0.3, "lost-state"))]  # fmt: skip
    assert not check_fleet(early).ok()  # before anyone had found the loss


def test_a_wait_cut_by_its_replicas_death_ends_with_its_log():
    """The waiting replica is killed at t = 0.2, its entitled request open in its log: the
    request died with it, and the other replica's start at 0.5 does not go ahead of it
    (a killed worker's log verifies beside the survivors', `--allow-open`). Had it lived
    to its last line at 0.8, the same start breaks fleet ORDER."""
    waiting, surplus = _leased_order_breach()
    killed = [e for e in waiting if e.at <= 0.0] + [_slots_event(0.2, "shared")]
    report = check_fleet([killed, surplus], allow_open=True)
    assert report.ok(), report.violations
    lived = [e for e in waiting if e.at <= 0.0] + [_slots_event(0.8, "shared")]
    assert "ORDER" in props(check_fleet([lived, surplus], allow_open=True))
