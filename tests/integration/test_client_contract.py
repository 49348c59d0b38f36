"""The client's contract (docs/design.md §17) on a real `floorguard serve`, read with the
official `openai` SDK's raw responses: every answer of a pool carries the rate-limit headers
OpenAI's clients read, from the tenant's floor and window — the limit is the floor, the
remaining counts down with each take, the reset is the window's end — refusals and
opportunistic answers included, and no header is sent empty."""

from __future__ import annotations

import re

import openai
import pytest

from tests.integration.live import token
from tests.integration.test_attacks import guard_process

pytest_plugins = ["tests.integration.test_attacks"]  # its `emulator` backend fixture

_RESET = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:([\d.]+)s)?$|^(\d+)ms$")


def _seconds(reset: str) -> float:
    """An OpenAI reset header (`250ms`, `1s`, `59m59.5s`, `1h0m0s`) in seconds."""
    match = _RESET.match(reset)
    assert match and reset, f"not a reset duration: {reset!r}"
    hours, minutes, secs, ms = match.groups()
    if ms is not None:
        return int(ms) / 1000
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(secs or 0)


def _client(guard, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=guard.url + "/v1", api_key=token(tenant), max_retries=0)


def _call(client: openai.OpenAI):
    """One completion; its raw headers (a refusal's from the SDK's error)."""
    try:
        raw = client.completions.with_raw_response.create(model="m", prompt="hi", max_tokens=4)
        return 200, raw.headers
    except openai.APIStatusError as refused:
        return refused.status_code, refused.response.headers


def _no_empty_header(headers) -> None:
    assert all(value.strip() for value in headers.values()), dict(headers)


@pytest.mark.parametrize("meter", ["count", "token"])
def test_every_answer_carries_the_floors_rate_limit_headers(tmp_path, emulator, meter):
    floor = 3 if meter == "count" else 60  # tokens: a request weighs its metered prompt + 4
    unit = "requests" if meter == "count" else "tokens"
    contracts = [
        {"tenant": "acme", "class": "assured", "floor": floor, "deadline_ms": 1820,
         "excess_policy": "reject"},  # the floor's end is a 429 (the default serves it idle)
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
    ]  # fmt: skip
    with guard_process(
        tmp_path, [emulator], contracts=contracts, window_s=3600.0, meter=meter
    ) as guard:
        with _client(guard, "acme") as acme:
            seen = [_call(acme)]
            while seen[-1][0] == 200 and len(seen) < 30:
                seen.append(_call(acme))
        weight = floor - int(seen[0][1][f"x-ratelimit-remaining-{unit}"])
        assert weight == 1 if meter == "count" else weight >= 5
        admitted = floor // weight
        assert [status for status, _ in seen] == [200] * admitted + [429]
        for _, headers in seen:
            _no_empty_header(headers)
            assert headers[f"x-ratelimit-limit-{unit}"] == str(floor)
            assert headers["x-floorguard-class"] == "assured"
            assert headers["x-floorguard-window"].isdigit()
            assert 0 < _seconds(headers[f"x-ratelimit-reset-{unit}"]) <= 3600
        remaining = [int(h[f"x-ratelimit-remaining-{unit}"]) for _, h in seen]
        left = floor - admitted * weight  # what the refused one found, too little
        assert remaining == [floor - k * weight for k in range(1, admitted + 1)] + [left]
        resets = [_seconds(h[f"x-ratelimit-reset-{unit}"]) for _, h in seen]
        assert resets == sorted(resets, reverse=True)  # the same window's end, nearer
        assert len({h["x-floorguard-window"] for _, h in seen}) == 1
        with _client(guard, "free") as free:
            status, headers = _call(free)
        assert status == 200 and headers["x-floorguard-decision"] == "surplus"
        _no_empty_header(headers)
        # nothing is reserved for it: no rate-limit headers a client would back off on
        assert not any(name.startswith("x-ratelimit-") for name in headers)
        assert headers["x-floorguard-window"].isdigit()
