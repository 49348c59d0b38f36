"""The KV budget (docs/design.md §16): a backend takes a request only while the reservations
of what it runs (metered prompt + output cap, in whole blocks) fit its KV cache. The first
waiting request waits for room and nothing smaller overtakes it; a request no cache can
ever hold is refused on arrival (`kv_excess`); `verify` checks the budget (MEMORY) and
finds a seeded violation; and where memory never binds, a run is exactly what it was."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from floorguard.analysis.checker import check_trace
from floorguard.analysis.records import fold_trace
from floorguard.core.events import EventKind, TraceEvent
from floorguard.core.guard import RejectReason
from floorguard.core.request import Request
from floorguard.profiles import get_profile
from floorguard.sim.backend import KvBatchingBackend
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import kv_pressure, marquee
from tests.helpers import make_config, make_guard, make_request


def _guard(events, kv=(64,)):
    slots = (2,) * len(kv)
    config = replace(make_config(floor=10, slots=slots, deadline_s=10.0), kv_tokens=kv)
    return make_guard(config, events=events)


def test_the_first_waiting_request_waits_for_room_and_nothing_smaller_overtakes_it():
    events: list[TraceEvent] = []
    guard = _guard(events)
    first = make_request(tokens=48, request_id=1)  # 48 of the 64 tokens
    guard.on_arrival(first, 0.0)
    assert [d.request.request_id for d in guard.poll(0.0)] == [1]
    guard.on_arrival(make_request(tokens=40, request_id=2), 0.1)  # 48 reserved: no room
    guard.on_arrival(make_request(assured=False, tokens=8, request_id=3), 0.1)  # 16: fits
    assert guard.poll(0.1) == []  # a slot is free, but the entitled one waits first
    assert guard.finish(1, 1.0, "complete")
    assert [d.request.request_id for d in guard.poll(1.0)] == [2, 3]  # 48 + 16 = 64
    report = check_trace(events, allow_open=True)
    assert report.ok(), report.violations[:3]


def test_a_request_no_kv_cache_can_hold_is_refused_on_arrival():
    events: list[TraceEvent] = []
    guard = _guard(events, kv=(64, None))  # the second backend is not budgeted
    assert guard.on_arrival(make_request(tokens=200), 0.0).admitted
    guard = _guard(events := [], kv=(64, 32))
    refused = guard.on_arrival(make_request(tokens=60, prompt=8), 0.0)  # 68 → 80 in blocks
    assert (refused.admitted, refused.reason) == (False, RejectReason.KV_EXCESS)
    assert guard.on_arrival(make_request(tokens=40, prompt=8), 0.0).entitled  # 48: fits
    assert check_trace(events, allow_open=True).ok()  # not owed from the floor


def test_verify_finds_a_seeded_memory_violation():
    """Two 32-token requests in flight together on one backend, and a log whose config says
    that backend holds 48 KV tokens: MEMORY, at the second start."""
    events: list[TraceEvent] = []
    guard = make_guard(make_config(floor=10, slots=(2,), deadline_s=10.0), events=events)
    for rid in (1, 2):
        guard.on_arrival(make_request(tokens=32, request_id=rid), 0.0)
    guard.poll(0.0)
    for rid in (1, 2):
        guard.finish(rid, 0.5, "complete")
    config = events[0]
    assert config.kind is EventKind.CONFIG
    seeded = [config._replace(data={**config.data, "kv_tokens": [48]}), *events[1:]]
    assert check_trace(events).ok()
    report = check_trace(seeded)
    assert [(v.prop, v.request_id) for v in report.violations] == [("MEMORY", 2)]


def test_where_memory_never_binds_the_run_is_unchanged():
    """The marquee with every backend's KV cache far larger than C requests need: the same
    seeded run, request for request, as without a budget."""
    plain = marquee()
    budgeted = replace(plain, kv_tokens=(1_000_000,))
    for seed in (0, 1):
        runs = [fold_trace(simulate_once(s, seed=seed).events).records for s in (plain, budgeted)]
        assert [(r.request_id, r.outcome, r.reason, r.ended_at) for r in runs[0]] == [
            (r.request_id, r.outcome, r.reason, r.ended_at) for r in runs[1]
        ]


def test_a_full_kv_cache_preempts_the_last_admitted_and_it_resumes_with_what_it_streamed():
    """Four 100-token prompts, 64 tokens each, in a 40-block cache: 28 blocks at admission,
    44 by the end, so as they decode the cache runs out and the last one admitted is
    preempted (vLLM's recompute); it runs again once others end, keeping the tokens it had
    streamed, and every one of the four completes with all 64."""
    backend = KvBatchingBackend(get_profile("v100-moe"), 4, np.random.default_rng(0), 40)
    for rid in range(4):
        assert backend.join(Request(rid, "a95", 0.0, 64, 100), 0.0) < math.inf
    seen, done, now = [], [], 0.0
    while (at := backend.next_completion_at()) is not None:
        assert at >= now
        now = at
        seen.append(backend.tokens_out(3, now) if 3 not in done else 64)
        done += backend.complete_due(now)
    assert backend.preemptions == 1 and sorted(done) == [0, 1, 2, 3]
    assert done[-1] == 3  # the victim ends last
    assert seen == sorted(seen) and 0 < seen[0] < 64  # it kept what it had streamed


def test_under_vllm_priority_policy_the_cache_preempts_the_surplus_not_the_last_admitted():
    """The same four, the opportunistic one admitted first and the assured three after it:
    FCFS preempts the last admitted (an assured one); vLLM's priority policy preempts the
    running sequence of the largest (priority, arrival) — the opportunistic one, though it
    came first — and the three assured run through unpreempted."""

    def run(priorities):
        backend = KvBatchingBackend(
            get_profile("v100-moe"), 4, np.random.default_rng(0), 40, priorities=priorities
        )
        for rid, tenant in enumerate(["o", "a", "a", "a"]):
            assert backend.join(Request(rid, tenant, 0.0, 64, 100), rid * 1e-3) < math.inf
        done, now = [], 0.0
        while (at := backend.next_completion_at()) is not None:
            now = at
            done += backend.complete_due(now)
        assert sorted(done) == [0, 1, 2, 3]
        return backend.preempted

    assert run(None) == {"a": 1}
    assert run({"a": 0, "o": 1}) == {"o": 1}
    assert run({}) == {"a": 1}  # every request at vLLM's default 0: the latest arrival


def test_on_the_simulator_the_budget_removes_the_preemptions_slot_only_dispatch_causes():
    """Slot-only dispatch lets vLLM's cache run out (preemptions, each costing its victim a
    second prefill); the guard's budget of the same 512 tokens starts only what fits, and
    nothing is preempted. (Floor lateness is reported, not asserted: with a cache this
    small, two at a time is what fits, and that is outside docs/design.md §6's region for C = 4 —
    docs/http.md, The KV cache.)"""
    for seed in (0, 1):
        slots_only = simulate_once(kv_pressure(), seed=seed)
        budgeted = simulate_once(kv_pressure(budget=True), seed=seed)
        assert slots_only.preemptions > 10 and budgeted.preemptions == 0
        for run in (slots_only, budgeted):
            report = check_trace(run.events)
            assert {v.prop for v in report.violations} <= {"SF"}, report.violations[:3]
            assert report.num_requests == run.num_requests


def test_spec_6_counts_what_the_kv_caches_run_at_once():
    """C = 4 slots, but a 512-token cache holds two requests of 100 + 64 (176 tokens each):
    the §6 bound is made for C = 2, and says why when it is outside."""
    from floorguard.core.monitors import assumption_report  # noqa: PLC0415

    config = kv_pressure(budget=True).guard_config()
    plain = assumption_report(replace(config, kv_tokens=()), num_output_tokens=64)
    report = assumption_report(config, num_output_tokens=64, num_prompt_tokens=100)
    assert report.rho_a == 2 * plain.rho_a
    assert not report.inside and report.reasons[-1] == (
        "memory: the KV caches run 2 of C = 4 at once at p + ℓ = 100 + 64"
    )
    tiny = replace(config, kv_tokens=(160,))
    assert assumption_report(tiny, num_output_tokens=64, num_prompt_tokens=100).reasons == (
        "memory: the KV caches run 0 of C = 4 at once at p + ℓ = 100 + 64",
    )


def test_spec_6_bound_is_made_for_the_prompt_too():
    """Where the ceiling charges for prompts (a CPU build's calibration), s_max and the bound
    are the request's own: s_max(ℓ, p), not s_max(ℓ)."""
    from floorguard.core.monitors import assumption_report  # noqa: PLC0415

    config = kv_pressure(budget=True).guard_config()
    assert config.upper_envelope is not None
    charging = replace(
        config, upper_envelope=replace(config.upper_envelope, per_prompt_token_s=0.01)
    )
    free = assumption_report(config, num_output_tokens=64, num_prompt_tokens=100)
    paid = assumption_report(charging, num_output_tokens=64, num_prompt_tokens=100)
    assert paid.s_max_s == pytest.approx(free.s_max_s + 1.0)
    assert paid.bound_s == pytest.approx(3 * paid.s_max_s)  # 1 + ⌈B/C⌉: B = 3 on the 2 it runs
