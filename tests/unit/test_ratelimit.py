"""The rate-limit headers' values (docs/design.md §17): the reset in OpenAI's duration form, and the
limit and remaining from the decided arrival's floor and store answer."""

from __future__ import annotations

import dataclasses

import pytest

from floorguard.core.contract import MeterKind
from floorguard.proxy.edge.ratelimit import duration, rate_limit_headers
from tests.helpers import make_config, make_guard, make_request


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (-0.2, "0ms"),
        (0.25, "250ms"),
        (0.9996, "1s"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (59.9, "59.9s"),
        (90.0, "1m30s"),
        (3599.5, "59m59.5s"),
        (3600.0, "1h0m0s"),
        (5400.25, "1h30m0.25s"),
    ],
)
def test_a_reset_reads_as_openai_writes_it(seconds, text):
    assert duration(seconds) == text


def _decided(guard, request, now):
    pending = guard.begin_arrival(request, now)
    while pending.need is not None:
        pending = guard.continue_arrival(pending, now, guard.answer(pending.need, now))
    return pending


def test_the_limit_is_the_floor_and_the_remaining_counts_down_to_the_refusal():
    guard = make_guard(make_config(floor=2))  # window 1 s from 0
    schedule = guard.config.schedule
    seen = [
        rate_limit_headers(_decided(guard, make_request(at=0.25), 0.25), MeterKind.COUNT,
                           schedule, 0.25)
        for _ in range(3)
    ]  # fmt: skip
    assert [h["x-ratelimit-limit-requests"] for h in seen] == ["2", "2", "2"]
    assert [h["x-ratelimit-remaining-requests"] for h in seen] == ["1", "0", "0"]
    assert {h["x-ratelimit-reset-requests"] for h in seen} == {"750ms"}


def test_an_opportunistic_tenant_gets_no_rate_limit_headers():
    """Nothing is reserved for it: a `limit: 0, remaining: 0` told a client that backs off
    on `remaining` to stop while the surplus had room (an operator's first hour)."""
    guard = make_guard(make_config())
    pending = _decided(guard, make_request(assured=False, at=0.5), 0.5)
    headers = rate_limit_headers(pending, MeterKind.TOKEN, guard.config.schedule, 0.5)
    assert headers == {"x-floorguard-window": "0"}  # the window it arrived in


def test_a_cost_excess_refusal_names_the_floor_but_no_remaining_it_never_asked_for():
    config = dataclasses.replace(make_config(floor=3), meter=MeterKind.TOKEN)
    guard = make_guard(config)
    pending = _decided(guard, make_request(at=0.0), 0.0)  # 16 output tokens > B = 3
    assert not pending.admission.admitted
    headers = rate_limit_headers(pending, MeterKind.TOKEN, config.schedule, 0.0)
    assert headers == {
        "x-floorguard-window": "0",
        "x-ratelimit-limit-tokens": "3",
        "x-ratelimit-reset-tokens": "1s",
    }
