"""Floors in first-token terms (docs/design.md §19): contracts with a TTFT and a TPOT, the
doom gate on first tokens, the floor's reserved slots, and what `verify` makes of them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from floorguard.analysis.checker import check_trace
from floorguard.core.contract import (
    AffineEnvelope,
    Contract,
    ContractClass,
    DispatchOrder,
    GuardConfig,
    WindowSchedule,
)
from floorguard.core.events import EventKind, config_from_dict, config_to_dict
from floorguard.core.guard import Dispatch, Drop, Guard
from floorguard.core.monitors import first_token_report
from floorguard.core.request import Request
from floorguard.errors import ConfigError
from floorguard.learners.adversaries import AlwaysAdmit
from floorguard.proxy.config.guard import ContractSpec

ASSURED, OPPORTUNISTIC = ContractClass.ASSURED, ContractClass.OPPORTUNISTIC
CEILING = AffineEnvelope(0.05, 0.01)
"""`s_max(ℓ) = 50 ms + 10 ms·ℓ`: 210 ms for the floor's 16 tokens, 2.05 s for a 200-token
surplus decode."""
LOWER = AffineEnvelope(0.02, 0.005)
HEADER = {"mode": "header", "header": "x-tenant", "trusted_upstreams": ["127.0.0.0/8"]}


def _config(*, floor=2, slots=(4,), reserved=2, ttft_s=0.5, lower=None, **more) -> GuardConfig:
    return GuardConfig(
        contracts=(
            Contract("chat", ASSURED, None, floor, ttft_budget_s=ttft_s, tpot_budget_s=0.05),
            Contract("bulk", OPPORTUNISTIC, 60.0),
        ),
        schedule=WindowSchedule(1.0),
        slots=slots,
        upper_envelope=CEILING,
        lower_envelope=lower,
        reserved_slots=reserved,
        **more,
    )


class _Driver:
    """The guard with its own store and an admit-all learner, its log kept."""

    def __init__(self, config: GuardConfig) -> None:
        self.events: list = []
        self.guard = Guard(config, learner=AlwaysAdmit(), sink=self.events.append)
        self.next_id = 0

    def offer(self, tenant: str, at: float, tokens: int = 16, prompt: int = 0):
        request = Request(self.next_id, tenant, at, tokens, prompt)
        self.next_id += 1
        admission = self.guard.on_arrival(request, at)
        return admission, self.guard.poll(at)

    def started(self, decisions) -> list[int]:
        return [d.request.request_id for d in decisions if isinstance(d, Dispatch)]


def test_a_contract_in_first_token_terms_is_due_at_ttft_plus_tpot_per_token():
    chat = Contract("chat", ASSURED, None, 2, ttft_budget_s=0.5, tpot_budget_s=0.05)
    assert chat.deadline_for(16) == pytest.approx(0.5 + 0.8)
    beside = Contract("chat", ASSURED, 3.0, 2, ttft_budget_s=0.5)
    assert beside.deadline_for(16) == 3.0  # an end-to-end deadline given governs the end
    with pytest.raises(ConfigError, match="both a TTFT and a TPOT"):
        Contract("chat", ASSURED, None, 2, ttft_budget_s=0.5)
    with pytest.raises(ConfigError, match="the first token comes before the last"):
        Contract("chat", ASSURED, 0.4, 2, ttft_budget_s=0.5)
    with pytest.raises(ConfigError, match="ttft_budget_s"):
        Contract("chat", ASSURED, 1.0, 2, ttft_budget_s=-1.0)
    assert config_from_dict(config_to_dict(_config())).contracts[0] == _config().contracts[0]


def test_the_config_file_takes_ttft_and_tpot_and_says_what_is_missing():
    spec = ContractSpec.model_validate(
        {"tenant": "chat", "class": "assured", "floor": 2, "ttft_ms": 500, "tpot_ms": 50}
    )
    assert spec.contract().deadline_for(10) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="give deadline_ms, or both ttft_ms and tpot_ms"):
        ContractSpec.model_validate({"tenant": "chat", "class": "assured", "ttft_ms": 500})
    with pytest.raises(ValueError, match=r"ttft_ms 900\.0 > deadline_ms 800\.0"):
        ContractSpec.model_validate(
            {"tenant": "c", "class": "assured", "deadline_ms": 800, "ttft_ms": 900}
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"reserved": -1}, "must be an integer ≥ 0"),
        ({"reserved": 1, "dispatch": DispatchOrder.FIFO}, "needs assured-first dispatch"),
        ({"reserved": 1, "slot_leases": True}, "fleet-wide slot leases"),
    ],
)
def test_reserved_slots_that_cannot_work_are_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        _config(**change)


def test_a_guard_keeps_at_most_all_its_slots_but_one_as_its_shares_shrink():
    """A fleet's shares can fall to `r` or below (more replicas live): the guard then keeps
    all its slots but one, and keeps `r` again when its shares grow back."""
    assert _config(reserved=4).kept_slots == 3 and _config(reserved=2).kept_slots == 2
    driver = _Driver(_config(reserved=2))
    guard = driver.guard
    guard.reconfigure(replace(guard.config, slots=(2,)), 0.0, reason="membership")
    assert guard._reserved == 1
    started = [driver.started(driver.offer("bulk", 0.0, tokens=200)[1]) for _ in range(2)]
    assert sum(map(len, started)) == 1  # one of two slots for the surplus
    guard.reconfigure(replace(guard.config, slots=(4,)), 0.1, reason="membership")
    assert guard._reserved == 2


def test_the_surplus_never_holds_the_floors_reserved_slots_while_the_floor_may_need_them():
    """C = 4, r = 2: a flood of long decodes takes two slots and waits; the floor's request
    starts at once on a reserved one, though the surplus queued first."""
    driver = _Driver(_config())
    started = []
    for i in range(6):
        started += driver.started(driver.offer("bulk", 0.01 * i, tokens=200)[1])
    assert len(started) == 2 and driver.guard.num_queued == 4
    admission, decisions = driver.offer("chat", 0.1)
    assert admission.entitled and driver.started(decisions) == [admission.request_id]
    assert driver.guard.num_surplus_in_flight == 2


def test_a_reserved_slot_is_lent_only_to_work_that_gives_it_back_by_the_windows_end():
    """Once the floor's credits in the window are spent and its requests ended, a reserved
    slot goes to a surplus request whose ceiling ends before the next window (when the
    credits return), never to one that could still hold it then."""
    driver = _Driver(_config(floor=1))
    a, _ = driver.offer("chat", 0.0)
    driver.guard.finish(a.request_id, 0.2, "complete")
    for i in range(2):  # the two unreserved slots, long decodes
        driver.offer("bulk", 0.21 + 0.001 * i, tokens=200)
    _, decisions = driver.offer("bulk", 0.3, tokens=200)  # 2.05 s: past t = 1
    assert driver.started(decisions) == []
    # the long one waits at the head: none overtakes it, even a short one that would fit
    _, decisions = driver.offer("bulk", 0.3, tokens=16)
    assert driver.started(decisions) == [] and driver.guard.num_queued == 2
    # in the next window, nothing is lent while the floor's credit is unspent
    assert driver.started(driver.guard.poll(1.0)) == []
    chat, decisions = driver.offer("chat", 1.05)
    assert driver.started(decisions) == [chat.request_id]
    driver.guard.finish(chat.request_id, 1.2, "complete")
    assert driver.started(driver.guard.poll(1.2)) == []  # 1.2 + 2.05 s > 2.0
    assert driver.started(driver.guard.poll(1.95)) == []


def test_a_short_surplus_request_takes_a_spent_floors_slot_for_the_rest_of_the_window():
    driver = _Driver(_config(floor=1))
    a, _ = driver.offer("chat", 0.0)
    driver.guard.finish(a.request_id, 0.2, "complete")
    for i in range(2):
        driver.offer("bulk", 0.21 + 0.001 * i, tokens=200)
    short, decisions = driver.offer("bulk", 0.3, tokens=16)  # 210 ms: ends by t = 0.51
    assert driver.started(decisions) == [short.request_id]
    _, decisions = driver.offer("bulk", 0.85, tokens=16)  # would end at 1.06: not lent
    assert driver.started(decisions) == []


def test_a_first_token_that_cannot_come_in_time_is_dropped_and_verify_calls_it_sound():
    """`now + L(0, p) > T`: its first token is doomed though its end-to-end deadline is
    not; the timer drops it while it waits. A constant `L` gives no first-token doom."""
    driver = _Driver(_config(reserved=1, ttft_s=0.1, lower=LOWER, slots=(2,)))
    driver.offer("bulk", 0.0, tokens=200)
    driver.offer("chat", 0.0)
    driver.offer("chat", 0.0)  # the first takes the reserved slot, this one waits
    assert driver.guard.num_queued == 1
    assert driver.guard.next_doom_at() == pytest.approx(0.1 - 0.02)
    drops = driver.guard.expire(0.081)
    assert [type(d) for d in drops] == [Drop] and drops[0].reason == "doomed"
    for rid in sorted(driver.guard._in_flight):
        driver.guard.finish(rid, 2.5, "complete")
    report = check_trace(driver.events)
    assert not [v for v in report.violations if v.prop == "DR"], report.violations

    flat = _Driver(_config(reserved=1, ttft_s=0.1, lower=AffineEnvelope(0.2, 0.0), slots=(2,)))
    flat.offer("bulk", 0.0, tokens=200)
    flat.offer("chat", 0.0)
    flat.offer("chat", 0.0)
    assert flat.guard.expire(0.15) == []  # 0.15 + 0.2 < D = 0.9 s; no first-token bound


def test_a_drop_whose_first_token_could_still_come_is_a_dr_violation():
    driver = _Driver(_config(reserved=1, ttft_s=0.3, lower=LOWER, slots=(2,)))
    driver.offer("bulk", 0.0, tokens=200)
    driver.offer("chat", 0.0)
    driver.offer("chat", 0.0)
    drops = driver.guard.expire(0.281)
    assert len(drops) == 1
    events = list(driver.events)
    i = next(i for i, e in enumerate(events) if e.kind is EventKind.DROP)
    events[i] = events[i]._replace(at=0.2)  # 0.2 + 20 ms < T = 0.3: not doomed
    for rid in sorted(driver.guard._in_flight):
        driver.guard.finish(rid, 2.5, "complete")
    events += driver.events[len(events) :]
    report = check_trace(events)
    assert [v.prop for v in report.failed()] == ["DR"]


def test_the_first_token_region_and_its_bound():
    config = _config(floor=4, reserved=2, ttft_s=0.7)
    report = first_token_report(config, num_output_tokens=16)
    assert report is not None and report.inside
    assert report.bound_s == pytest.approx(2 * 0.21 + 0.06)
    assert report.rho_r == pytest.approx(4 * 0.21 / 2)
    tight = first_token_report(replace(config, reserved_slots=1), num_output_tokens=16)
    assert tight is not None and not tight.inside
    assert [r.split(":")[0] for r in tight.reasons] == ["ttft"]  # ⌈4/1⌉·0.21 + 0.06 > 0.7
    crowded = first_token_report(replace(config, contracts=(
        replace(config.contracts[0], floor=6), config.contracts[1]
    ), reserved_slots=1), num_output_tokens=16)  # fmt: skip
    assert crowded is not None and any("ρ_r = ΣB·s_max/(r·W) = 1.260" in r for r in crowded.reasons)
    none = first_token_report(replace(config, reserved_slots=0), num_output_tokens=16)
    assert none is not None and "no reserved slots" in none.reasons[0]
    plain = GuardConfig(contracts=(Contract("a", ASSURED, 1.0, 2),))
    assert first_token_report(plain, num_output_tokens=16) is None


def _three_on_two_slots(ttft_s: float):
    """Three floor requests at t = 0 on two slots (r = 1), each within its 210 ms ceiling:
    the third starts at 0.2 s, when the first two end."""
    driver = _Driver(_config(floor=3, reserved=1, ttft_s=ttft_s, slots=(2,)))
    guard = driver.guard
    for _ in range(3):
        for rid in driver.started(driver.offer("chat", 0.0)[1]):
            guard.on_first_token(rid, 0.01)
    for rid in sorted(guard._in_flight):
        guard.finish(rid, 0.2, "complete")
    (third,) = driver.started(guard.poll(0.2))
    guard.on_first_token(third, 0.21)
    guard.finish(third, 0.4, "complete")
    return driver.events


def test_verify_fails_a_late_start_inside_the_region_and_reports_it_outside():
    """The guard's part: an entitled request must start by T − s_max(1, p). Outside §19's
    region (ttft 250 ms < ⌈3/1⌉·210 + 60 ms) the third's start at 200 ms, after T − s_max(1) =
    190 ms, is reported, conditional; inside it (ttft 700 ms) the guard starts it in time,
    and a log whose start came later than 640 ms fails."""
    outside = check_trace(_three_on_two_slots(0.25))
    assert outside.ok() and outside.num_ttft_late == 1
    assert [v.prop for v in outside.conditional] == ["TTFT"]
    assert "outside the region: ttft" in outside.conditional[0].message

    events = _three_on_two_slots(0.7)
    inside = check_trace(events)
    assert inside.ok() and inside.num_ttft_late == 0 and not inside.conditional
    third = [i for i, e in enumerate(events) if e.kind is EventKind.DISPATCH][2]
    assert events[third].at == pytest.approx(0.2)
    events[third] = events[third]._replace(at=0.65)
    late = check_trace(events)
    assert not late.ok() and [v.prop for v in late.violations] == ["TTFT"]
    assert "inside design §19's region" in late.violations[0].message


def test_a_first_token_late_from_a_start_in_time_is_the_backends_and_conditional():
    driver = _Driver(_config(floor=2, reserved=1, ttft_s=0.5, slots=(2,)))
    a, _ = driver.offer("chat", 0.0)
    driver.guard.on_first_token(a.request_id, 0.6)
    driver.guard.finish(a.request_id, 0.7, "complete")
    report = check_trace(driver.events)
    assert report.ok() and report.num_ttft_late == 1
    assert "the backend's first token took longer" in report.conditional[0].message


def test_an_entitled_first_token_on_time_is_not_reported():
    driver = _Driver(_config(floor=2, reserved=1, ttft_s=0.5, slots=(2,)))
    a, _ = driver.offer("chat", 0.0)
    driver.guard.on_first_token(a.request_id, 0.1)
    driver.guard.finish(a.request_id, 2.0, "complete")  # its end is long after T: fine
    report = check_trace(driver.events)
    assert report.ok() and report.num_ttft_late == 0 and not report.conditional


def test_a_tpot_caps_the_width_the_guard_dispatches_onto_a_backend():
    """The per-token envelope: a decode step of n at the profile's largest dispersion
    draw. The tightest TPOT caps every backend's slots at the widest n within it, in the
    server's config, the simulator's scenario and the fleet's shares alike."""
    from floorguard.profiles import V100_MOE, tpot_slots  # noqa: PLC0415
    from floorguard.proxy.config.guard import GuardServerConfig  # noqa: PLC0415
    from floorguard.sim.scenarios import marquee  # noqa: PLC0415

    ceilings = [V100_MOE.token_ceiling_s(n) for n in range(1, 9)]
    assert ceilings == sorted(ceilings) and ceilings[0] >= V100_MOE.step_1_s
    tpot = (ceilings[1] + ceilings[2]) / 2  # between two and three wide
    assert V100_MOE.widest_for(tpot, 8) == 2 and V100_MOE.widest_for(ceilings[0] / 2, 8) == 0
    assert tpot_slots(V100_MOE, (4, 8, 0), [None, tpot, 1.0]) == (2, 2, 0)
    assert tpot_slots(V100_MOE, (4,), [None]) == (4,) and tpot_slots(None, (4,), [tpot]) == (4,)
    assert tpot_slots(V100_MOE, (4,), [ceilings[0] / 2]) == (1,)  # one at least: warned

    config = GuardServerConfig.model_validate({
        "contracts": [{"tenant": "chat", "class": "assured", "floor": 1, "ttft_ms": 900,
                       "tpot_ms": tpot * 1e3}],
        "backends": [{"url": "http://127.0.0.1:1", "slots": 4}],
        "profile": "v100-moe", "identity": HEADER,
    })  # fmt: skip
    assert config.guard_config().slots == (2,)
    chat = Contract("chat", ASSURED, None, 1, ttft_budget_s=0.9, tpot_budget_s=tpot)
    scenario = replace(marquee(), contracts=(chat, *marquee().contracts[1:]))
    assert scenario.guard_config().slots == (2,)


def test_the_start_report_says_what_the_tpot_allows(capsys):
    from floorguard.proxy.config.guard import GuardServerConfig  # noqa: PLC0415
    from floorguard.proxy.process.serve import start_report  # noqa: PLC0415

    def config(tpot_ms: float, reserved: int) -> GuardServerConfig:
        return GuardServerConfig.model_validate({
            "contracts": [{"tenant": "chat", "class": "assured", "floor": 1, "ttft_ms": 1000,
                           "tpot_ms": tpot_ms}],
            "backends": [{"url": "http://127.0.0.1:1", "slots": 4}],
            "profile": "v100-moe", "reserved_slots": reserved, "identity": HEADER,
        })  # fmt: skip

    report = "\n".join(start_report(config(50, 1)))
    assert "tenant chat's 50 ms holds at a width of 4 on v100-moe" in report
    assert "docs/design.md §19 (first tokens) at ℓ = 16: inside (r = 1" in report
    assert "is below even one sequence's decode step" in "\n".join(start_report(config(5, 0)))
    with pytest.raises(ValueError, match="leaves the surplus no slot of the 1 its backends run "
                       "at the width its tightest tpot_ms allows"):  # fmt: skip
        config(5, 1)


def test_a_first_token_drop_counts_from_the_requests_arrival_not_its_arrive_event():
    """The HTTP guard logs `arrive` once the body is read, after the request arrived; its
    TTFT counts from the arrival (as its deadline does), and so does `verify`: a drop at
    the doom instant is sound (CI caught the checker counting from the event)."""
    driver = _Driver(_config(reserved=1, ttft_s=0.1, lower=LOWER, slots=(2,)))
    guard = driver.guard
    for rid, tenant in enumerate(("bulk", "chat", "chat")):
        request = Request(rid, tenant, 0.0, 200 if tenant == "bulk" else 16, 0)
        guard.on_arrival(request, 0.05)  # read 50 ms after it arrived
        guard.poll(0.05)
    doom_at = guard.next_doom_at()
    assert doom_at == pytest.approx(0.1 - 0.02)  # T − L(0) from the arrival, not from 0.05
    assert len(guard.expire(doom_at + 1e-9)) == 1
    for rid in sorted(guard._in_flight):
        guard.finish(rid, 2.5, "complete")
    report = check_trace(driver.events)
    assert not [v for v in report.violations if v.prop == "DR"], report.violations
